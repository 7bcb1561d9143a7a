"""The sweeper: hand the broker every inbox row it lost or whose worker died.

Beat sends SWEEP every ``sweep_interval_seconds``. Redis here keeps nothing on
disk and the embedded filesystem broker never redelivers an unacknowledged
message, so the inbox table -- not the broker -- is the record of what is
left to do. A row sent twice is harmless: its second run finds it claimed or
finished (see ``worker.processing``). A message sent here starts its retry
count at 0, but the delivery's budget is on its row (``deliveries.retries``),
so a worker's death does not refill it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session

from models.db import transaction
from models.inbox import sweepable

Send = Callable[[int], None]

#: Rows one sweep sends at most. Paged, so that after a lost broker the whole
#: backlog goes out in one sweep: one page per sweep would cap the drain at
#: ``limit`` rows per sweep interval (500 per 30 s) however many workers wait,
#: because the next SWEEP queues behind the rows it sent and expires there.
MAX_ROWS_PER_SWEEP = 20_000


def sweep(
    *,
    session: Session,
    queued_grace_seconds: float,
    send: Send,
    limit: int = 500,
    max_rows: int = MAX_ROWS_PER_SWEEP,
    source_id: int | None = None,
) -> Sequence[int]:
    """Send PROCESS_DELIVERY (through ``send``) for ``queued`` rows older than the
    grace period and ``processing`` rows whose lease expired, ``limit`` at a
    time, up to ``max_rows``; returns their keys.

    Each page is stamped and committed before anything of it is sent (store,
    commit, then enqueue): a message never races the transaction that chose it.
    With ``source_id``, that source's rows only (a resumed source's backlog,
    with no grace).
    """
    sent: list[int] = []
    after = 0
    while len(sent) < max_rows:
        with transaction(session, "a sweep's page"):
            page = sweepable(
                session=session,
                queued_grace_seconds=queued_grace_seconds,
                limit=min(limit, max_rows - len(sent)),
                after=after,
                source_id=source_id,
            )
        for pk in page:
            send(pk)
        sent.extend(page)
        if len(page) < limit:
            break
        after = page[-1]
    return sent


def send_backlog(*, session: Session, source_id: int, send: Send) -> Sequence[int]:
    """Send every delivery of source ``source_id`` still to be done, at once
    (no grace: a resumed source's backlog); the sweeper's pages, for one
    source. Returns their keys."""
    return sweep(
        session=session,
        queued_grace_seconds=0,
        send=send,
        max_rows=sys.maxsize,
        source_id=source_id,
    )
