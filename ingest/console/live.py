"""``GET /console/deliveries/live``: what changed in the inbox, as Server-Sent Events.

The deliveries page opens it with EventSource (the session cookie goes
along) and, on each ``delivery`` event, fetches its table again, so the
page shows new deliveries and deliveries changing state without a reload.
An event says only which delivery and its status now; the page renders
nothing from it, so nothing the stream carries is ever written into HTML.

The stream looks, once a second, for deliveries after the newest one the
page showed (by key: the primary key's index) and at the statuses of the
deliveries still in work that it was told to watch or has seen arrive (at
most ``MAX_WATCHED``, by key). It is the task event stream's loop
(``ingest.events.sse_stream``) over a source that polls, counts against the
same caps (``ingest.limits.StreamSlots``), and closes after a while;
EventSource then reconnects by itself.
"""

from __future__ import annotations

import asyncio
import json
import time
from functools import partial
from typing import Annotated

from fastapi import Query, Request
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ingest.console.auth import Refused, User
from ingest.console.pages import read, router, scope_of
from ingest.events import sse_response, sse_stream
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
    changes = _DeliveryChanges(request, workspace_ids, after, watched)
    return sse_response(sse_stream(changes, timeout=timeout), give_back=give_back)


class _DeliveryChanges:
    """The deliveries a page shows, looked at every ``POLL_SECONDS``: new
    ones after ``cursor`` and the watched ones whose status changed. Nothing
    notifies a delivery's change, so this polls; the loop around it -- one
    write per look, keep-alive, close, disconnect -- is the task stream's
    (``ingest.events.sse_stream``)."""

    def __init__(
        self, request: Request, workspace_ids: frozenset[int], cursor: int, watched: set[int]
    ) -> None:
        self._request, self._workspace_ids, self._cursor = request, workspace_ids, cursor
        self._statuses: dict[int, str | None] = dict.fromkeys(watched)

    def __enter__(self) -> _DeliveryChanges:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    async def look(self) -> bytes:
        statuses = self._statuses
        new, now = await run_in_threadpool(
            read,
            self._request,
            partial(
                _look,
                workspace_ids=self._workspace_ids,
                cursor=self._cursor,
                watched=list(statuses),
            ),
        )
        changed = [(key, status) for key, status in now.items() if statuses.get(key) != status]
        for key, status in new:
            self._cursor = max(self._cursor, key)
            changed.append((key, status))
        frames = []
        for key, status in changed:
            if status in FINISHED:
                statuses.pop(key, None)
            elif key in statuses or len(statuses) < MAX_WATCHED:
                statuses[key] = status
            frames.append(f"event: delivery\ndata: {json.dumps({'id': key, 'status': status})}\n\n")
        return "".join(frames).encode()

    async def wait(self, due: float) -> None:
        await asyncio.sleep(min(POLL_SECONDS, due - time.monotonic()))


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
