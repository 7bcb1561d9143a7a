"""``GET /console/deliveries/live``: what changed in the inbox, as Server-Sent Events.

The deliveries page opens it with EventSource (the session cookie goes
along) and, on each ``delivery`` event, fetches its table again, so the
page shows new deliveries and deliveries changing state without a reload.
An event says only which delivery and its status now; the page renders
nothing from it, so nothing the stream carries is ever written into HTML.

The stream looks, once a second, for deliveries after the newest one the
page showed (by key: the primary key's index) and at the statuses of the
deliveries still in work that it was told to watch or has seen arrive (at
most ``MAX_WATCHED``, by key). It counts against the same caps as the
task event stream (``ingest.limits.StreamSlots``) and closes after a while;
EventSource then reconnects by itself.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated

from fastapi import Query, Request
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ingest.console.auth import Refused, User
from ingest.console.pages import read, router, scope_of
from ingest.events import SlotHoldingStream
from ingest.limits import StreamsFull
from ingest.rest import MAX_ID
from models.inbox import FINISHED
from models.tables import Delivery, WebhookSource

POLL_SECONDS = 1.0
#: When a stream closes by default (``?timeout=`` says otherwise); EventSource reconnects.
STREAM_SECONDS = 120.0
MAX_WATCHED = 200
#: New deliveries one look reports; more wait for the next look.
MAX_NEW = 200


@router.get("/deliveries/live")
async def deliveries_live(
    request: Request,
    user: User,
    after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
    watch: Annotated[str, Query(max_length=MAX_WATCHED * 11)] = "",
    timeout: Annotated[float, Query(gt=0, le=300)] = STREAM_SECONDS,
) -> Response:
    try:
        watched = {int(part) for part in watch.split(",") if part}
    except ValueError:
        raise Refused(400, "watch: a comma-separated list of delivery ids") from None
    if len(watched) > MAX_WATCHED or any(not 1 <= key <= MAX_ID for key in watched):
        raise Refused(400, f"watch: at most {MAX_WATCHED} delivery ids")
    workspace_ids = await run_in_threadpool(read, request, lambda s: scope_of(s, user).ids)
    runtime = request.app.state.runtime
    try:
        give_back = runtime.streams.take(user.principal.token_id)
    except StreamsFull as full:
        raise Refused(429, str(full)) from None
    return SlotHoldingStream(
        _changes(request, workspace_ids, after, watched, timeout),
        give_back=give_back,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _changes(
    request: Request, workspace_ids: frozenset[int], cursor: int, watched: set[int], timeout: float
) -> AsyncIterator[str]:
    statuses: dict[int, str | None] = dict.fromkeys(watched)
    closes_at = time.monotonic() + timeout
    yield "retry: 1000\n\n"
    while not await request.is_disconnected() and time.monotonic() < closes_at:
        new, now = await run_in_threadpool(
            read,
            request,
            partial(_look, workspace_ids=workspace_ids, cursor=cursor, watched=list(statuses)),
        )
        changed = [(key, status) for key, status in now.items() if statuses.get(key) != status]
        for key, status in new:
            cursor = max(cursor, key)
            changed.append((key, status))
        for key, status in changed:
            if status in FINISHED:
                statuses.pop(key, None)
            elif key in statuses or len(statuses) < MAX_WATCHED:
                statuses[key] = status
            yield f"event: delivery\ndata: {json.dumps({'id': key, 'status': status})}\n\n"
        if not changed:
            yield ": still here\n\n"
        await asyncio.sleep(POLL_SECONDS)


def _look(
    session: Session, *, workspace_ids: frozenset[int], cursor: int, watched: list[int]
) -> tuple[list[tuple[int, str]], dict[int, str]]:
    """Deliveries after ``cursor`` in the workspaces, and the watched ones' statuses."""
    visible = (
        select(Delivery.id, Delivery.status)
        .join(WebhookSource, WebhookSource.id == Delivery.source_id)
        .where(WebhookSource.workspace_id.in_(workspace_ids))
    )
    new = session.execute(
        visible.where(Delivery.id > cursor).order_by(Delivery.id).limit(MAX_NEW)
    ).all()
    now = {}
    if watched:
        # Only the workspaces' own: an id of another's is never answered.
        now = dict(session.execute(visible.where(Delivery.id.in_(watched))).all())
    return [(key, status) for key, status in new], now
