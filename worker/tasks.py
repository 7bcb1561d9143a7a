"""The delivery tasks: thin Celery bodies over ``worker.processing`` and ``worker.sweeper``.

Each takes keys, never payloads, and runs one service call inside one session
scope. Both are safe to run twice at the same time (see ``worker.processing``).
The operator's release task lives apart, in ``worker.operator``: nothing here
may reach it.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from models.db import session_scope
from models.messages import PROCESS_DELIVERY, SWEEP
from worker import processing, runtime, sweeper
from worker.failpoints import BEFORE_ACK, failpoint

#: A soft time limit usually means a stuck query: retried like a database error.
_TRANSIENT = (*processing.TRANSIENT_ERRORS, SoftTimeLimitExceeded)


@shared_task(name=PROCESS_DELIVERY, bind=True, max_retries=None)
def process_delivery(self, delivery_pk: int) -> dict[str, Any]:
    """PROCESS_DELIVERY(delivery_pk): turn the stored delivery into its task, once."""
    with session_scope(runtime.sessions()) as session:
        processed = processing.process_delivery(
            session=session,
            delivery_pk=int(delivery_pk),
            settings=runtime.settings(),
            retries=self.request.retries or 0,
            transient=_TRANSIENT,
        )
    failpoint(BEFORE_ACK, delivery=int(delivery_pk))
    if processed.retry_in is not None:
        # Sent after the deferral committed; the lease holds until it is due.
        raise self.retry(countdown=processed.retry_in)
    return processed.as_dict()


@shared_task(name=SWEEP, bind=True)
def sweep(self) -> dict[str, Any]:
    """SWEEP(): send PROCESS_DELIVERY again for rows the broker lost or whose worker died."""

    def send(pk: int) -> None:
        self.app.send_task(PROCESS_DELIVERY, args=[pk])

    with session_scope(runtime.sessions()) as session:
        sent = sweeper.sweep(
            session=session,
            queued_grace_seconds=runtime.settings().queued_grace_seconds,
            send=send,
        )
    return {"sent": len(sent)}
