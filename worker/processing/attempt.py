"""A delivery's attempt and how it ends: the endings table, retries, errors.

A run that holds the delivery's lease is an :class:`Attempt`; every way it
ends is recorded fenced by the lease's attempt, so a run that was taken over
records nothing. How each refusal of the task store ends a delivery is a
table in code (:data:`CREATE_REFUSALS`); why, in docs/architecture.md, "A
delivery's run".
"""

from __future__ import annotations

import enum
import logging
import random
from dataclasses import dataclass
from datetime import timedelta

import psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session

from models.db import transaction
from models.errors import (
    IdentityRetired,
    InvalidExternalId,
    TaskNotFound,
    WipLimitReached,
    WorkspaceMisconfigured,
    WorkspaceNotAccessible,
)
from models.inbox import DeliveryStatus, Lease, claim, defer, finish
from models.settings import Settings
from models.tables import utcnow
from worker.processing.seams import Seams

log = logging.getLogger("worker.processing")

#: Errors of the database itself (connection lost, deadlock, pool exhausted),
#: through SQLAlchemy or on the fast path's own psycopg connection: worth
#: retrying. The task store's own errors are decided case by case below.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (DBAPIError, PoolTimeoutError, psycopg.Error)

#: A retry's message is due this long after its deferred lease ends, so its
#: claim finds the lease over rather than still held (clocks of two hosts may
#: differ by a little; a claim that comes too early would drop the message and
#: leave the delivery to the sweeper).
RETRY_ETA_MARGIN_SECONDS = 0.5

#: How much of an error's text is kept on the row.
_MAX_ERROR_CHARS = 500

default_rng = random.Random()


@dataclass(frozen=True)
class Processed:
    """What one run did to one delivery."""

    delivery_pk: int
    #: The state this run recorded; None when it recorded nothing (the
    #: delivery was finished, held by another worker, or taken over).
    status: DeliveryStatus | None
    outcome: str | None = None
    task_id: int | None = None
    reason: str | None = None
    #: Send the delivery again after this many seconds (a retry); None: do not.
    retry_in: float | None = None
    #: Which executor ran the create: "fast" (models.fastpath), "batch"
    #: (models.fastpath, its claim in a transaction shared with the other keys
    #: of its message) or "general"; None when this run claimed nothing.
    path: str | None = None

    def span_attributes(self) -> dict[str, str | int]:
        """What the run recorded, as its span's attributes (``models.tracing``)."""
        found = {
            "taskhook.status": None if self.status is None else self.status.value,
            "taskhook.outcome": self.outcome,
            "taskhook.task_id": self.task_id,
            "taskhook.path": self.path,
        }
        return {key: value for key, value in found.items() if value is not None}

    def as_dict(self) -> dict[str, object]:
        return {
            "delivery": self.delivery_pk,
            "status": None if self.status is None else self.status.value,
            "outcome": self.outcome,
            "task_id": self.task_id,
            "reason": self.reason,
            "retry_in": self.retry_in,
        }


class Ending(enum.Enum):
    """How a refusal of the create ends the delivery (the table below)."""

    #: The same body fails the same way every time.
    DEAD = "dead"
    #: Only a person can clear it (fix the workflow), then replay.
    NEEDS_OPERATOR = "needs_operator"
    #: It may clear by itself: retry with backoff, then ``needs_operator``.
    RETRY_THEN_PARK = "retry_then_park"
    #: The task this delivery was creating was deleted: recreating it is a
    #: person's call (``needs_operator``).
    DELETED = "deleted"
    #: The identity ledger says the delivery may not create: nothing to do.
    IGNORED = "ignored"


#: The task store's refusals of a create, and how each ends.
#: ``{error}`` is the refusal's own message.
CREATE_REFUSALS: dict[type[Exception], tuple[Ending, str]] = {
    InvalidExternalId: (Ending.DEAD, "cannot become a task: {error}"),
    WorkspaceNotAccessible: (Ending.DEAD, "cannot become a task: {error}"),
    WorkspaceMisconfigured: (Ending.NEEDS_OPERATOR, "{error}"),
    WipLimitReached: (Ending.RETRY_THEN_PARK, "workspace {workspace_id}: {error}"),
    TaskNotFound: (Ending.DELETED, ""),
    IdentityRetired: (Ending.IGNORED, "creates nothing: {error}"),
}


@dataclass(frozen=True)
class Run:
    """What one run of one delivery works with, before its claim and after."""

    session: Session
    delivery_pk: int
    settings: Settings
    seams: Seams
    rng: random.Random
    #: The errors worth retrying (:data:`TRANSIENT_ERRORS`).
    transient: tuple[type[BaseException], ...]


@dataclass(frozen=True)
class Attempt:
    """A run holding the delivery's lease, and the ways it can end, each
    recorded fenced by the lease."""

    run: Run
    lease: Lease

    @property
    def session(self) -> Session:
        return self.run.session

    @property
    def settings(self) -> Settings:
        return self.run.settings

    @property
    def seams(self) -> Seams:
        return self.run.seams

    @property
    def delivery_pk(self) -> int:
        return self.lease.delivery_pk

    def finish(
        self,
        status: DeliveryStatus,
        *,
        outcome: str | None = None,
        task_id: int | None = None,
        reason: str | None = None,
        error: str | None = None,
    ) -> Processed:
        """Record the delivery's end; nothing when a newer attempt took it over."""
        with transaction(self.session, "the delivery's record"):
            recorded = finish(
                session=self.session,
                lease=self.lease,
                status=status,
                outcome=outcome,
                task_id=task_id,
                reason=reason,
                error=error,
            )
        if not recorded:
            return self.taken_over()
        return Processed(self.delivery_pk, status, outcome=outcome, task_id=task_id, reason=reason)

    def taken_over(self) -> Processed:
        log.info("delivery %s: attempt %s was taken over", self.delivery_pk, self.lease.attempt)
        return Processed(
            self.delivery_pk,
            None,
            reason=(
                f"attempt {self.lease.attempt} was taken over by a newer one, whose record stands"
            ),
        )

    def wait_or_park(
        self, why: str, *, outcome: str | None = None, task_id: int | None = None
    ) -> Processed:
        """Retry later while the obstacle may clear; past the limit, park for a person."""
        retries, limit = self.lease.retries, self.settings.unsettled_max_retries
        delay = next_retry(retries, limit=limit, settings=self.settings, rng=self.run.rng)
        if delay is None:
            log.warning("delivery %s needs an operator: %s", self.delivery_pk, why)
            return self.finish(
                DeliveryStatus.NEEDS_OPERATOR,
                outcome=outcome,
                task_id=task_id,
                reason=f"{why}; still so after {retries} retries",
            )
        reason = f"waiting: {why}; retry {retries + 1} of {limit} in {delay:.1f} s"
        # Hold the lease until the retry is due, so the sweeper does not send the
        # delivery early and no other claim takes it meanwhile.
        until = utcnow() + timedelta(seconds=delay)
        with transaction(self.session, "the delivery's wait for a retry"):
            deferred = defer(session=self.session, lease=self.lease, until=until, reason=reason)
        if not deferred:
            return self.taken_over()
        return Processed(
            self.delivery_pk,
            DeliveryStatus.PROCESSING,
            outcome=outcome,
            task_id=task_id,
            reason=reason,
            retry_in=delay + RETRY_ETA_MARGIN_SECONDS,
        )

    def deleted_while_creating(self, external_id: object) -> Processed:
        # Creating it again would undo someone's delete; a person decides (replay).
        reason = (
            f"the task for {external_id!r} was deleted before its creation settled; "
            "replay the delivery to create it again"
        )
        return self.finish(DeliveryStatus.NEEDS_OPERATOR, reason=reason)

    def refused(self, error: Exception, *, workspace_id: int, external_id: object) -> Processed:
        """End the delivery as :data:`CREATE_REFUSALS` says for ``error``."""
        # By the nearest class the table names: InvalidExternalId has a
        # subclass per rule an external id breaks.
        refusal = next(kind for kind in type(error).__mro__ if kind in CREATE_REFUSALS)
        ending, reason = CREATE_REFUSALS[refusal]
        reason = reason.format(error=error, workspace_id=workspace_id)
        if ending is Ending.DEAD:
            return self.finish(DeliveryStatus.DEAD, reason=reason)
        if ending is Ending.NEEDS_OPERATOR:
            return self.finish(DeliveryStatus.NEEDS_OPERATOR, reason=reason)
        if ending is Ending.RETRY_THEN_PARK:
            return self.wait_or_park(reason)
        if ending is Ending.IGNORED:
            return self.finish(DeliveryStatus.IGNORED, reason=reason)
        return self.deleted_while_creating(external_id)

    def failed_unexpectedly(self, error: Exception) -> Processed:
        """Not a database hiccup: a bug or a body nobody foresaw. Retrying would
        fail the same way, and the sweeper would send it back every lease
        period, so it is parked dead with the error for a person to read."""
        log.exception("delivery %s failed unexpectedly; marking it dead", self.delivery_pk)
        return self.finish(
            DeliveryStatus.DEAD,
            reason="unexpected error while processing; see last_error",
            error=describe(error),
        )


# --- retries -------------------------------------------------------------------------


def backoff_seconds(retries: int, *, settings: Settings, rng: random.Random = default_rng) -> float:
    """The wait before retry number ``retries + 1``: exponential, with jitter.

    The ceiling doubles from ``retry_base_seconds`` with each retry, up to
    ``retry_max_seconds``; the wait is drawn uniformly between half the
    ceiling and the ceiling ("equal jitter"), so deliveries that collided
    once spread out, and none retries sooner than half the ceiling.
    """
    ceiling = min(settings.retry_max_seconds, settings.retry_base_seconds * 2 ** min(retries, 64))
    return rng.uniform(ceiling / 2, ceiling)


def next_retry(
    retries: int, *, limit: int, settings: Settings, rng: random.Random = default_rng
) -> float | None:
    """The wait before the next retry, or None when ``limit`` retries were spent."""
    if retries >= limit:
        return None
    return backoff_seconds(retries, settings=settings, rng=rng)


def after_transient_error(
    run: Run, lease: Lease | None, error: BaseException, retries: int
) -> Processed:
    """Retry after a database error, with backoff; past the limit, dead.
    ``retries`` is the message's count: without a lease the row was not read
    (the claim itself failed), and the message's count is all there is."""
    session, settings, delivery_pk = run.session, run.settings, run.delivery_pk
    summary = describe(error)
    retries = retries if lease is None else lease.retries
    limit = settings.database_max_retries
    delay = next_retry(retries, limit=limit, settings=settings, rng=run.rng)
    if delay is None:
        # Given up: dead, with the error kept. Should the database still be
        # down, this raises, and the row waits for the sweeper instead.
        log.error("delivery %s: database error after %s retries: %s", delivery_pk, retries, summary)
        lease = lease or claim(
            session=session, delivery_pk=delivery_pk, lease_seconds=settings.lease_seconds
        )
        if lease is None:
            return Processed(delivery_pk, None, reason="finished, or held by another worker")
        return Attempt(run, lease).finish(
            DeliveryStatus.DEAD, reason=f"database errors, {retries} retries spent", error=summary
        )

    log.warning("delivery %s: database error, retry in %.1f s: %s", delivery_pk, delay, summary)
    reason = f"database error; retry {retries + 1} of {limit} in {delay:.1f} s"
    if lease is not None:
        until = utcnow() + timedelta(seconds=delay)
        try:  # best effort: the database may well still be down
            with transaction(session, "the delivery's wait after a database error"):
                defer(session=session, lease=lease, until=until, error=summary, reason=reason)
        except run.transient:
            pass
    return Processed(
        delivery_pk,
        DeliveryStatus.PROCESSING,
        reason=f"{reason}: {summary}",
        retry_in=delay + RETRY_ETA_MARGIN_SECONDS,
    )


def describe(error: BaseException) -> str:
    """An error as the row keeps it: its class and the first line of its text
    (SQLAlchemy appends the statement and its parameters)."""
    detail = str(getattr(error, "orig", None) or error).strip().splitlines()
    text = f"{type(error).__name__}: {detail[0] if detail else ''}".strip()
    return text[:_MAX_ERROR_CHARS]
