"""What the worker does with one stored delivery: the service behind PROCESS_DELIVERY.

Celery-free, so the integration tests drive it directly on SQLite and
PostgreSQL. The task body in ``worker.tasks`` opens one session scope, calls
:func:`process_delivery` (for a message of several keys,
:func:`process_deliveries`) and, when the answer asks for it, sends the
delivery again after ``retry_in`` seconds.

A run claims the row with a lease, creates the task, and records the
outcome fenced by the lease's attempt. Its rooms:

- ``attempt``: a run holding the lease, and every way it ends (the endings
  table :data:`CREATE_REFUSALS`, retries, database errors);
- ``general``: the general path, which reads the body with the source's
  provider and creates through ``models.tasks.create_task``;
- ``fast``: how a run starts (alone, or with its message's other keys on
  SQLite), and the plain case's settlement on ``models.fastpath``;
- ``seams``: where a test or a fail point steps in.

The steps and why a run is safe twice at once: docs/architecture.md, "A
delivery's run". The worker never releases an identity: release is an
operator's decision.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from models import logs, tracing
from models.db import transaction
from models.inbox import DeliveryStatus, park_lost
from models.settings import Settings
from models.tables import Delivery
from worker.processing.attempt import (
    CREATE_REFUSALS,
    TRANSIENT_ERRORS,
    Attempt,
    Ending,
    Processed,
    Run,
    after_transient_error,
    backoff_seconds,
    default_rng,
    next_retry,
)
from worker.processing.fast import Start, settle_fast, start_alone, started_together
from worker.processing.general import LookupMisses, create_on_the_general_path, draft_of
from worker.processing.seams import FAILPOINTS, Seams

__all__ = [
    "CREATE_REFUSALS",
    "FAILPOINTS",
    "TRANSIENT_ERRORS",
    "Ending",
    "Processed",
    "Seams",
    "backoff_seconds",
    "draft_of",
    "next_retry",
    "process_deliveries",
    "process_delivery",
]

log = logging.getLogger(__name__)


def process_delivery(
    *,
    session: Session,
    delivery_pk: int,
    settings: Settings,
    retries: int = 0,
    seams: Seams = FAILPOINTS,
    transient: tuple[type[BaseException], ...] = TRANSIENT_ERRORS,
    rng: random.Random = default_rng,
) -> Processed:
    """Turn the stored delivery into its task, once; see the module docstring.

    ``session`` is the caller's unit of work. The run commits in named
    transactions (``models.db.transaction``), because each must be durable
    before the next step: the lease, the create's insert and settlement
    (``models.tasks``), and the delivery's record; the fast path has two, the
    lease with the insert, and the settlement with the record. ``retries`` is the
    message's own retry count: the row's count (``deliveries.retries``) is
    the budget, and the message's counts only when larger -- the retries of
    a message whose claim never reached the database (it was down) were
    counted nowhere else. ``transient`` are the errors worth retrying.
    """
    run = Run(session, delivery_pk, settings, seams, rng, transient)
    with ExitStack() as resources:  # the fast path's connection, back to the pool at the end
        return _run(run, retries, lambda misses: start_alone(run, resources, misses))


def process_deliveries(
    *,
    session: Session,
    delivery_pks: Sequence[int],
    settings: Settings,
    seams: Seams = FAILPOINTS,
    transient: tuple[type[BaseException], ...] = TRANSIENT_ERRORS,
    rng: random.Random = default_rng,
) -> list[Processed | Exception]:
    """:func:`process_delivery` for each key of one worker message, in order,
    each in its place in the answer; a key whose run raised (only before its
    claim committed) has the exception there, and holds up no other key.

    On the fast path the keys start together
    (``worker.processing.fast.started_together``), then each goes on alone
    from where the message left it."""

    def each(pk: int, start: Start | None) -> Processed | Exception:
        # Nothing a key's run loaded is carried into the next one's, as if
        # each had a session of its own.
        session.expunge_all()
        try:
            if start is None:
                return process_delivery(
                    session=session,
                    delivery_pk=pk,
                    settings=settings,
                    seams=seams,
                    transient=transient,
                    rng=rng,
                )
            run = Run(session, pk, settings, seams, rng, transient)
            return _run(run, 0, lambda _misses: start)
        except Exception as error:
            return error

    with started_together(session, delivery_pks, settings, seams) as starts:
        if starts is None:
            return [each(pk, None) for pk in delivery_pks]
        return [each(pk, start) for pk, start in zip(delivery_pks, starts, strict=True)]


def _run(run: Run, retries: int, start: Callable[[LookupMisses], Start]) -> Processed:
    """A key's run, every line it logs carrying the delivery's ids
    (``models.logs``), and with ``log_each_delivery`` one line for what it
    recorded."""
    with (
        logs.delivery_context(inbox_id=run.delivery_pk),
        tracing.delivery_run(run.delivery_pk, lambda: stored_trace_context(run)) as span,
    ):
        processed = _run_from_start(run, retries, start)
        logs.bind(task=processed.task_id)
        if span is not None:
            span.set_attributes(processed.span_attributes())
        if run.settings.log_each_delivery:
            logs.DELIVERIES.info(
                "delivery %s recorded %s",
                run.delivery_pk,
                processed.outcome or (processed.status and processed.status.value) or "nothing",
                extra={
                    "status": processed.status and processed.status.value,
                    "outcome": processed.outcome,
                    "path": processed.path,
                },
            )
        return processed


def stored_trace_context(run: Run) -> str | None:
    """The traceparent the delivery was stored under: what a run its message
    did not start in the first trace links to (``models.tracing``)."""
    return run.session.scalar(select(Delivery.trace_context).where(Delivery.id == run.delivery_pk))


def _run_from_start(run: Run, retries: int, start: Callable[[LookupMisses], Start]) -> Processed:
    """A key's run from its start: the fast path's settlement of a plain
    case, or the general path; every error answered here, once."""
    session = run.session
    lease = None  # set once the claim has committed
    try:
        misses = LookupMisses()
        # Steps as events of the run's span, not spans of their own: a span
        # costs the worker far more (docs/performance.md, "Tracing").
        tracing.event("claim")
        started = start(misses)
        tracing.event("claimed" if started.claimed is not None else "not claimed")
        if started.claimed is None:
            return _not_claimed(run)
        # The row's budget, which a crash does not refill (process_delivery).
        lease = replace(started.claimed.lease, retries=max(started.claimed.lease.retries, retries))
        attempt = Attempt(run, lease)
        if started.inserted is not None:
            task = started.inserted.task
            logs.bind(workspace=task.workspace_id, external_id=task.external_id, task=task.id)
            settled = settle_fast(attempt, started)
            tracing.event("settled")
            return replace(settled, path=started.path)
        created = create_on_the_general_path(attempt, misses)
        tracing.event("created or ended")
        return replace(created, path="general")
    except run.transient as error:
        session.rollback()  # whatever the failed statement left open
        return after_transient_error(run, lease, error, retries)
    except Exception as error:
        session.rollback()  # whatever the failed statement left open
        if lease is None:
            raise
        return Attempt(run, lease).failed_unexpectedly(error)


def _not_claimed(run: Run) -> Processed:
    """Finished, held by another worker, or lost once too often: then parked."""
    session, delivery_pk, settings = run.session, run.delivery_pk, run.settings
    with transaction(session, "parking a delivery whose attempts were lost"):
        parked = park_lost(
            session=session, delivery_pk=delivery_pk, max_lost=settings.max_lost_attempts
        )
    if parked:
        log.error(
            "delivery %s parked: %d attempts ended without an answer",
            delivery_pk,
            settings.max_lost_attempts,
        )
        return Processed(delivery_pk, DeliveryStatus.NEEDS_OPERATOR, reason="lost attempts")
    return Processed(delivery_pk, None, reason="finished, or held by another worker")
