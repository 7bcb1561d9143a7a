"""The sweeper: hand the broker every inbox row it lost or whose worker died.

Beat sends SWEEP every ``sweep_interval_seconds``. Redis here keeps nothing on
disk and the embedded filesystem broker never redelivers an unacknowledged
message, so the inbox table -- not the broker -- is the record of what is
left to do. A row sent twice is harmless: its second run finds it claimed or
finished (see ``worker.processing``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session

from models.inbox import sweepable

Send = Callable[[int], None]


def sweep(
    *, session: Session, queued_grace_seconds: float, send: Send, limit: int = 500
) -> Sequence[int]:
    """Send PROCESS_DELIVERY (through ``send``) for ``queued`` rows older than the
    grace period and ``processing`` rows whose lease expired; returns their keys.

    The rows are stamped and committed before anything is sent (store, commit,
    then enqueue): a message never races the transaction that chose it.
    """
    pks = sweepable(session=session, queued_grace_seconds=queued_grace_seconds, limit=limit)
    session.commit()
    for pk in pks:
        send(pk)
    return pks
