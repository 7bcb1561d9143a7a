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
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Protocol

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
from ingest.runtime import IngressRuntime, libpq_conninfo, postgres_conninfo
from models.db import session_scope
from models.events import events_after, stream_position
from models.tables import TaskEvent

log = logging.getLogger(__name__)

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
    return sse_response(
        _stream(
            read,
            following,
            after,
            timeout=timeout,
            limit=limit,
            poll_seconds=runtime.settings.stream_poll_seconds,
        ),
        give_back=give_back,
    )


def framed(bodies: list[dict]) -> list[dict]:
    """Events as a stream sends them: each one's position and its SSE frame,
    encoded. Made once per event read, so a feed's thousand streams share
    each frame's bytes."""
    return [
        {
            "id": body["id"],
            "frame": (
                f"id: {body['id']}\nevent: {body['type']}\ndata: {json.dumps(body)}\n\n"
            ).encode(),
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


def sse_response(body: AsyncIterator[bytes], *, give_back: Callable[[], None]) -> StreamingResponse:
    """An SSE body as the answer, holding its stream slot until it ends."""
    return SlotHoldingStream(
        body,
        give_back=give_back,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


class StreamSource(Protocol):
    """What one kind of SSE stream says, for :func:`sse_stream` to send.

    Entered when the stream starts and left however it ends."""

    def __enter__(self) -> object: ...

    def __exit__(self, *exc_info: object) -> None: ...

    async def look(self) -> bytes:
        """Frames of whatever is new since the last look; b"" when nothing is."""
        ...

    async def wait(self, due: float) -> None:
        """Until something may be new, or ``due`` (time.monotonic) at the latest."""
        ...


async def sse_stream(source: StreamSource, *, timeout: float) -> AsyncIterator[bytes]:
    """The loop of every SSE stream here (task events, the console's deliveries).

    It never asks whether the client is still there: StreamingResponse
    listens for the disconnect and cancels this. Whatever a look finds goes
    out as one write, however many events it holds; a quiet stream says it is
    alive every ``KEEPALIVE_SECONDS`` and closes after ``timeout``."""
    closes_at = time.monotonic() + timeout
    said_at = time.monotonic()
    with source:
        # Said once the source is entered (follows its feed): nothing is missed from here.
        yield b"retry: 1000\n\n"  # reconnect after a second when the stream closes
        while True:
            written = await source.look()
            if written:
                yield written
                said_at = time.monotonic()
                continue  # there may be more right away
            now = time.monotonic()
            if now >= closes_at:
                return
            if now - said_at >= KEEPALIVE_SECONDS:
                yield b": still here\n\n"
                said_at = now
            await source.wait(min(closes_at, said_at + KEEPALIVE_SECONDS))


def _stream(
    read: Callable[[int], Awaitable[list[dict]]],
    following: contextlib.AbstractContextManager[WorkspaceFeed | None],
    cursor: int,
    *,
    timeout: float,
    limit: int,
    poll_seconds: float,
) -> AsyncIterator[bytes]:
    """The task event stream's body, resuming after ``cursor``."""
    return sse_stream(
        _TaskEvents(read, following, cursor, limit=limit, poll_seconds=poll_seconds),
        timeout=timeout,
    )


class _TaskEvents:
    """A workspace's task events for one stream: from its feed when the feed
    can vouch for the cursor, else read from the database.

    A stream woken late in a feed's fan-out finds the events of several
    notifications and sends them together; order and resume go by
    ``cursor`` alone, so batching never skips or repeats an event."""

    def __init__(
        self,
        read: Callable[[int], Awaitable[list[dict]]],
        following: contextlib.AbstractContextManager[WorkspaceFeed | None],
        cursor: int,
        *,
        limit: int,
        poll_seconds: float,
    ) -> None:
        self._read, self._following = read, following
        self.cursor, self._limit, self._poll_seconds = cursor, limit, poll_seconds
        self._feed: WorkspaceFeed | None = None
        self._seen = 0  # the feed's version when this stream last looked
        self._alarm = _Alarm()

    def __enter__(self) -> _TaskEvents:
        self._feed = self._following.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._alarm.cancel()
        self._following.__exit__(*exc_info)

    async def look(self) -> bytes:
        feed, events = self._feed, None
        if feed is not None:
            self._seen = feed.version  # before looking, so a change meanwhile is not missed
            if feed.learning:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LEARNING_SECONDS):
                        await feed.changed.wait()
                self._seen = feed.version
            events = feed.after(self.cursor, self._limit)
        if events is None:
            events = await self._read(self.cursor)
        if not events:
            return b""
        self.cursor = events[-1]["id"]
        return b"".join(event["frame"] for event in events)  # one write for them all

    async def wait(self, due: float) -> None:
        feed = self._feed
        if feed is None or not feed.live:
            await asyncio.sleep(min(self._poll_seconds, due - time.monotonic()))
        elif feed.version == self._seen:  # else it changed while this stream read
            await self._alarm.until(feed.waiter(), due)


class _Alarm:
    """A stream's one timer for its keep-alive and its end, kept across waits.

    A timer per wait (``asyncio.timeout``) costs a heap push and a cancel per
    event per stream. This one is armed again only when the stream must wake
    earlier than it is set for; when it rings early (the stream wrote since),
    the stream just looks, finds nothing due, and sets it again."""

    def __init__(self) -> None:
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._waiting: asyncio.Future | None = None

    async def until(self, waiter: asyncio.Future, due: float) -> None:
        """Wait for ``waiter``, or until ``due`` (time.monotonic), whichever first."""
        if self._timer is None or due < self._due:
            self.cancel()
            delay = due - time.monotonic()
            self._timer = asyncio.get_running_loop().call_later(delay, self._ring)
            self._due = due
        self._waiting = waiter
        try:
            await waiter
        finally:
            self._waiting = None

    def _ring(self) -> None:
        self._timer = None
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(None)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


@contextlib.asynccontextmanager
async def listening(runtime: IngressRuntime) -> AsyncIterator[None]:
    """On PostgreSQL (unless ``stream_listener`` is off), the process's event
    listener for the app's lifespan; elsewhere, nothing: streams poll.

    The listener connects to PostgreSQL itself (``Settings.listener_url``):
    a LISTEN belongs to a server session, which a pooler in transaction mode
    hands to other clients between transactions; behind one with no direct
    URL there is no listener, and streams poll."""
    if postgres_conninfo(runtime) is None or not runtime.settings.stream_listener:
        yield
        return
    url = runtime.settings.listener_url()
    if url is None:
        log.warning(
            "TASKHOOK_DATABASE_POOLER=%s and no TASKHOOK_DATABASE_DIRECT_URL: no "
            "LISTEN/NOTIFY listener; event streams poll every %s s",
            runtime.settings.database_pooler,
            runtime.settings.stream_poll_seconds,
        )
        yield
        return
    listener = EventListener(
        libpq_conninfo(url),
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
