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
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from ingest.limits import StreamsFull
from ingest.rest import (
    MAX_ID,
    ApiError,
    BrowserAuthenticated,
    Id,
    error_responses,
    in_session,
    require_access,
)
from models.events import events_after
from models.tables import TaskEvent

router = APIRouter(
    prefix="/api/v1", tags=["events"], responses=error_responses(400, 401, 404, 429, 503)
)

#: How often an open stream looks for new events, and says it is alive.
POLL_SECONDS = 0.5
KEEPALIVE_SECONDS = 15.0


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
    runtime = request.app.state.runtime
    try:
        give_back = runtime.streams.take(principal.token_id)
    except StreamsFull as full:
        retry_after = str(runtime.settings.retry_after_seconds)
        raise ApiError(429, str(full), headers={"Retry-After": retry_after}) from None
    return SlotHoldingStream(
        _stream(request, page, after, timeout),
        give_back=give_back,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


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


async def _stream(request: Request, page, cursor: int, timeout: float) -> AsyncIterator[str]:
    closes_at = time.monotonic() + timeout
    said_at = time.monotonic()
    yield "retry: 1000\n\n"  # reconnect after a second when the stream closes
    while not await request.is_disconnected():
        events = await run_in_threadpool(page, cursor)
        for event in events:
            cursor = event["id"]
            yield f"id: {cursor}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n"
            said_at = time.monotonic()
        if events:
            continue  # there may be more right away
        if time.monotonic() >= closes_at:
            return
        if time.monotonic() - said_at >= KEEPALIVE_SECONDS:
            yield ": still here\n\n"
            said_at = time.monotonic()
        await asyncio.sleep(POLL_SECONDS)
