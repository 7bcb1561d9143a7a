"""``GET /api/v1/workspaces/{id}/events``: the workspace's task events.

Two forms of one stream. With ``Accept: text/event-stream`` it is Server-Sent
Events: each event carries its position as the SSE ``id``, so a client that
reconnects with ``Last-Event-ID`` (as EventSource does by itself) resumes
right after what it saw -- nothing missed, nothing twice. The stream closes
after ``timeout`` seconds and the client reconnects; that keeps a proxy or a
dead peer from holding a connection forever. A token may hold only so many
streams open, and the ingress only so many in all (``ingest.limits``): past
either cap a stream is answered 429. Otherwise it is a JSON page:
``?after=N`` returns events after position N.

On PostgreSQL an open stream does not poll: it waits on its workspace's feed,
which the process's one listener (``ingest.notifications``) refreshes when a
committed append notifies, and takes its events from there. It reads the
database itself only to catch up, and every ``stream_poll_seconds`` while
the listener is down. On SQLite, which has no notifications, it polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from ingest.limits import StreamsFull
from ingest.notifications import EventListener, WorkspaceFeed
from ingest.rest import (
    MAX_ID,
    ApiError,
    BrowserAuthenticated,
    Id,
    error_responses,
    in_session,
    require_access,
)
from ingest.runtime import IngressRuntime, postgres_conninfo
from models.db import session_scope
from models.events import events_after, stream_position
from models.tables import TaskEvent

router = APIRouter(
    prefix="/api/v1", tags=["events"], responses=error_responses(400, 401, 404, 429, 503)
)

#: How often an open stream says it is alive when it has nothing to say.
KEEPALIVE_SECONDS = 15.0
#: The longest a new stream waits for its feed's first read before reading
#: for itself.
LEARNING_SECONDS = 1.0


class EventRead(BaseModel):
    id: int = Field(description="The event's position in its workspace's stream: 1, 2, 3, ...")
    type: str = Field(
        description="task.created, task.archived, task.deleted or task.identity_released"
    )
    task_id: int
    workspace_id: int
    external_id: str | None = Field(
        default=None, description="The identity the event concerns; omitted when none."
    )
    occurred_at: str


class EventPage(BaseModel):
    events: list[EventRead]
    next_after: int = Field(description="Pass as ?after= (or Last-Event-ID) to continue.")


def event_body(event: TaskEvent) -> dict:
    body = {
        "id": event.position,
        "type": event.type,
        "task_id": event.task_id,
        "workspace_id": event.workspace_id,
        "occurred_at": event.occurred_at.isoformat(),
    }
    if event.external_id is not None:
        body["external_id"] = event.external_id
    return body


@router.get(
    "/workspaces/{workspace_id}/events",
    response_model=EventPage,
    responses={200: {"content": {"text/event-stream": {}}}},
    summary="Task events of a workspace, as a JSON page or a resumable SSE stream",
)
async def workspace_events(
    request: Request,
    principal: BrowserAuthenticated,
    workspace_id: Id,
    after: Annotated[int, Query(ge=0, le=MAX_ID, description="Events after this id.")] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    timeout: Annotated[
        float, Query(gt=0, le=300, description="SSE only: seconds before the stream closes.")
    ] = 60.0,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> JSONResponse | StreamingResponse:
    require_access(principal, workspace_id)
    if last_event_id is not None:
        value = last_event_id.strip()
        # Bounded like ?after=: an id the stream could hold, never a huge number.
        if not (value.isascii() and value.isdigit() and len(value) <= 10) or int(value) > MAX_ID:
            raise ApiError(400, "Last-Event-ID must be an event id")
        after = int(value)

    def page(cursor: int) -> list[dict]:
        def work(session: Session) -> list[dict]:
            events = events_after(
                session=session, workspace_id=workspace_id, after=cursor, limit=limit
            )
            return [event_body(event) for event in events]

        return in_session(request, work)

    if "text/event-stream" not in request.headers.get("accept", ""):
        events = await run_in_threadpool(page, after)
        return JSONResponse({"events": events, "next_after": events[-1]["id"] if events else after})
    runtime: IngressRuntime = request.app.state.runtime
    try:
        give_back = runtime.streams.take(principal.token_id)
    except StreamsFull as full:
        retry_after = str(runtime.settings.retry_after_seconds)
        raise ApiError(429, str(full), headers={"Retry-After": retry_after}) from None

    async def read(cursor: int) -> list[dict]:
        return framed(await run_in_threadpool(page, cursor))

    following = (
        runtime.listener.follow(workspace_id)
        if runtime.listener is not None
        else contextlib.nullcontext(None)
    )
    return SlotHoldingStream(
        _stream(
            read,
            following,
            after,
            timeout=timeout,
            limit=limit,
            poll_seconds=runtime.settings.stream_poll_seconds,
        ),
        give_back=give_back,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def framed(bodies: list[dict]) -> list[dict]:
    """Events as a stream sends them: each one's position and its SSE frame.
    Made once per event read, so a feed's thousand streams share each frame."""
    return [
        {
            "id": body["id"],
            "frame": f"id: {body['id']}\nevent: {body['type']}\ndata: {json.dumps(body)}\n\n",
        }
        for body in bodies
    ]


class SlotHoldingStream(StreamingResponse):
    """A stream that gives its slot back however it ends -- closed, cut off,
    or never started because the client left first."""

    def __init__(self, *args, give_back, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._give_back = give_back

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._give_back()


async def _stream(
    read: Callable[[int], Awaitable[list[dict]]],
    following: contextlib.AbstractContextManager[WorkspaceFeed | None],
    cursor: int,
    *,
    timeout: float,
    limit: int,
    poll_seconds: float,
) -> AsyncIterator[str]:
    """The SSE body. It never asks whether the client is still there:
    StreamingResponse listens for the disconnect and cancels this."""
    closes_at = time.monotonic() + timeout
    said_at = time.monotonic()
    with following as feed:
        # Said once the stream follows its feed: from here on nothing is missed.
        yield "retry: 1000\n\n"  # reconnect after a second when the stream closes
        while True:
            changed = feed.changed if feed is not None else None  # before looking
            if feed is not None and feed.learning:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LEARNING_SECONDS):
                        await changed.wait()
                changed = feed.changed
            events = feed.after(cursor, limit) if feed is not None else None
            if events is None:
                events = await read(cursor)
            if events:
                cursor = events[-1]["id"]
                yield "".join(event["frame"] for event in events)  # one write for them all
                said_at = time.monotonic()
                continue  # there may be more right away
            now = time.monotonic()
            if now >= closes_at:
                return
            if now - said_at >= KEEPALIVE_SECONDS:
                yield ": still here\n\n"
                said_at = now
            quiet = min(closes_at, said_at + KEEPALIVE_SECONDS) - now
            if feed is None or not feed.live:
                await asyncio.sleep(min(poll_seconds, quiet))
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(quiet):
                    await changed.wait()


@contextlib.asynccontextmanager
async def listening(runtime: IngressRuntime) -> AsyncIterator[None]:
    """On PostgreSQL (unless ``stream_listener`` is off), the process's event
    listener for the app's lifespan; elsewhere, nothing: streams poll."""
    conninfo = postgres_conninfo(runtime)
    if conninfo is None or not runtime.settings.stream_listener:
        yield
        return
    listener = EventListener(
        conninfo,
        read=lambda *args: runtime.in_store_thread(_read_events, runtime, *args),
        last_position=lambda workspace_id: runtime.in_store_thread(
            _last_position, runtime, workspace_id
        ),
    )
    listener.start()
    runtime.listener = listener
    try:
        yield
    finally:
        runtime.listener = None
        await listener.stop()


def _read_events(runtime: IngressRuntime, workspace_id: int, after: int, limit: int) -> list[dict]:
    with runtime.store_errors(), session_scope(runtime.sessions) as session:
        events = events_after(session=session, workspace_id=workspace_id, after=after, limit=limit)
        return framed([event_body(event) for event in events])


def _last_position(runtime: IngressRuntime, workspace_id: int) -> int:
    with runtime.store_errors(), session_scope(runtime.sessions) as session:
        return stream_position(session=session, workspace_id=workspace_id)
