"""The delivery tasks: thin Celery bodies over ``worker.processing`` and ``worker.sweeper``.

Each takes keys, never payloads, and runs one service call per key inside
one session scope. All are safe to run twice at the same time (see
``worker.processing``). The operator's release task lives apart, in
``worker.operator``: nothing here may reach it.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from models import tracing
from models.broker.connection import broker_countdown
from models.broker.lanes import Sender, lane_of, lane_of_queue
from models.broker.messages import PROCESS_DELIVERIES, PROCESS_DELIVERY, SWEEP
from models.broker.versions import notice_unknown
from models.db import session_scope
from worker import processing, runtime, sweeper

log = logging.getLogger(__name__)

#: A soft time limit usually means a stuck query: retried like a database error.
_TRANSIENT = (*processing.TRANSIENT_ERRORS, SoftTimeLimitExceeded)


def _process(delivery_pk: int, *, retries: int) -> processing.Processed:
    with session_scope(runtime.sessions()) as session:
        return processing.process_delivery(
            session=session,
            delivery_pk=delivery_pk,
            settings=runtime.settings(),
            retries=retries,
            transient=_TRANSIENT,
        )


@shared_task(name=PROCESS_DELIVERY, bind=True, max_retries=None)
def process_delivery(self, delivery_pk: int, **unknown: Any) -> dict[str, Any]:
    """PROCESS_DELIVERY(delivery_pk): turn the stored delivery into its task, once.

    Every task here takes ``**unknown``: what a newer release may add is
    optional, and noticed, never a failure (models.broker.versions)."""
    notice_unknown(PROCESS_DELIVERY, unknown, self.request.headers)
    # The message's own count; the budget is the row's (deliveries.retries),
    # which the sweeper's message for a dead worker's delivery does not reset.
    with tracing.message(self.request):
        processed = _process(int(delivery_pk), retries=self.request.retries or 0)
    processing.FAILPOINTS.before_ack(int(delivery_pk))
    if processed.retry_in is not None:
        # Sent after the deferral committed; the lease holds until it is due.
        raise self.retry(countdown=broker_countdown(runtime.settings(), processed.retry_in))
    return processed.as_dict()


@shared_task(name=PROCESS_DELIVERIES, bind=True)
def process_deliveries(self, delivery_pks: list[int], **unknown: Any) -> dict[str, int]:
    """PROCESS_DELIVERIES(delivery_pks): PROCESS_DELIVERY for each key, in order.

    The relay's batches: the message is acknowledged once every key was
    processed. On SQLite the keys share the fast path's two commits
    (``worker.processing.process_deliveries``); each key's steps and fences
    are its own run's. A delivery that must wait is sent again on its own,
    as PROCESS_DELIVERY's first retry. An unexpected error on one key does
    not hold up the others; the first is raised once all were tried (its row
    was not claimed, so the sweeper sends it again). Should the worker die
    mid-batch, the message comes back whole: the keys already finished cost
    a claim that finds them done, and a key inserted but not settled is
    finished by its next attempt.
    """
    notice_unknown(PROCESS_DELIVERIES, unknown, self.request.headers)
    pks = [int(key) for key in delivery_pks]
    with tracing.message(self.request), session_scope(runtime.sessions()) as session:
        answers = processing.process_deliveries(
            session=session, delivery_pks=pks, settings=runtime.settings(), transient=_TRANSIENT
        )
    recorded: Counter[str] = Counter()  # what the log line shows: the rows say the rest
    # A retry waits in the lane its message came in on, as PROCESS_DELIVERY's own retry does.
    lane = lane_of_queue((self.request.delivery_info or {}).get("routing_key"))
    failure: Exception | None = None
    for pk, processed in zip(pks, answers, strict=True):
        if isinstance(processed, Exception):
            log.error("delivery %s failed before its claim", pk, exc_info=processed)
            failure = failure or processed
            continue
        if processed.retry_in is not None:
            countdown = broker_countdown(runtime.settings(), processed.retry_in)
            self.app.send_task(
                PROCESS_DELIVERY, args=[pk], countdown=countdown, retries=1, queue=lane
            )
        recorded[processed.status.value if processed.status else "not_recorded"] += 1
        # This row's state has committed and the message is not acknowledged
        # yet, whatever follows: the same crash point as PROCESS_DELIVERY's.
        processing.FAILPOINTS.before_ack(pk)
    if failure is not None:
        raise failure
    return dict(recorded)


@shared_task(name=SWEEP, bind=True)
def sweep(self, **unknown: Any) -> dict[str, Any]:
    """SWEEP(): send PROCESS_DELIVERY again for rows the broker lost or whose
    worker died, on the background lane: after a lost broker they are the
    whole backlog, and must not stand in front of live deliveries."""
    notice_unknown(SWEEP, unknown, self.request.headers)
    lane = lane_of(Sender.SWEEPER)

    def send(pk: int) -> None:
        self.app.send_task(PROCESS_DELIVERY, args=[pk], queue=lane)

    with session_scope(runtime.sessions()) as session:
        sent = sweeper.sweep(
            session=session,
            queued_grace_seconds=runtime.settings().queued_grace_seconds,
            send=send,
        )
    return {"sent": len(sent)}
