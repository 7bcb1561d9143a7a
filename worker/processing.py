"""What the worker does with one stored delivery: the service behind PROCESS_DELIVERY.

Celery-free, so the integration tests drive it directly on SQLite and
PostgreSQL. The task body in ``worker.tasks`` opens one session scope, calls
:func:`process_delivery` (for a message of several keys,
:func:`process_deliveries`) and, when the answer asks for it, sends the
delivery again after ``retry_in`` seconds.

A run claims the row with a lease, parses the body with the source's
provider, creates the task (in the plain case through ``models.fastpath``,
on PostgreSQL and SQLite alike; else through ``models.tasks.create_task``, its
insert fenced by the lease), and records the outcome fenced by the lease's attempt.
How each answer of the task store ends is a table in code
(:data:`CREATE_REFUSALS` and :class:`Attempt`'s endings); the steps, the
table and why a run is safe twice at once are in docs/architecture.md, "A
delivery's run". The worker never releases an identity: release is an
operator's decision.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import timedelta

import psycopg
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session

from models.access import Caller
from models.db import transaction
from models.errors import (
    InvalidExternalId,
    InvalidTask,
    LeaseTakenOver,
    TaskNotFound,
    WipLimitReached,
    WorkspaceMisconfigured,
    WorkspaceNotAccessible,
)
from models.external_id import normalize_external_id
from models.fastpath import (
    Claimed,
    FastPath,
    Inserted,
    LostTheRace,
    Settlement,
    SQLiteFastPath,
    fast_path,
)
from models.inbox import (
    DeliveryStatus,
    Lease,
    body_dropped_note,
    claim,
    defer,
    fence_create,
    finish,
    park_lost,
)
from models.providers import PROVIDERS
from models.providers.drafts import TaskDraft, UnsupportedContentType, UnsupportedPayload
from models.settings import Settings
from models.tables import Delivery, Task, WebhookSource, utcnow
from models.tasks import (
    NO_HOOKS,
    CreateHooks,
    CreateOutcome,
    NewTask,
    SourceLink,
    complete_creation,
    create_task,
    validated_new_task,
)
from worker.failpoints import (
    AFTER_INSERT,
    AFTER_LOOKUP,
    AFTER_SETTLE,
    BEFORE_SETTLE,
    armed,
    failpoint,
)

log = logging.getLogger(__name__)

#: Errors of the database itself (connection lost, deadlock, pool exhausted),
#: through SQLAlchemy or on the fast path's own psycopg connection: worth
#: retrying. The task store's own errors are decided case by case above.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (DBAPIError, PoolTimeoutError, psycopg.Error)

#: A retry's message is due this long after its deferred lease ends, so its
#: claim finds the lease over rather than still held (clocks of two hosts may
#: differ by a little; a claim that comes too early would drop the message and
#: leave the delivery to the sweeper).
RETRY_ETA_MARGIN_SECONDS = 0.5

#: How much of an error's text is kept on the row.
_MAX_ERROR_CHARS = 500

_random = random.Random()


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
    #: of its message: :func:`process_deliveries`) or "general"; None when
    #: this run claimed nothing.
    path: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "delivery": self.delivery_pk,
            "status": None if self.status is None else self.status.value,
            "outcome": self.outcome,
            "task_id": self.task_id,
            "reason": self.reason,
            "retry_in": self.retry_in,
        }


@dataclass(frozen=True)
class ClaimedDelivery:
    """A claimed delivery and its source, as plain values: the task store rolls
    its session back on some paths, which would expire ORM instances."""

    delivery_pk: int
    event: str
    body: bytes
    content_type: str | None
    source_slug: str
    provider: str
    workspace_id: int
    create_events: frozenset[str]
    site_url: str | None
    #: The task an earlier attempt of this delivery inserted, if one did.
    created_task_id: int | None
    #: What stands in for a body the retention policy dropped (only a done or
    #: ignored row loses it, and nothing claims those: a row put back in the
    #: queue by hand); None while the body is kept.
    body_dropped: str | None = None


class Ending(enum.Enum):
    """How a refusal of the create ends the delivery (the table above)."""

    #: The same body fails the same way every time.
    DEAD = "dead"
    #: Only a person can clear it (fix the workflow), then replay.
    NEEDS_OPERATOR = "needs_operator"
    #: It may clear by itself: retry with backoff, then ``needs_operator``.
    RETRY_THEN_PARK = "retry_then_park"
    #: The task this delivery was creating was deleted: recreating it is a
    #: person's call (``needs_operator``).
    DELETED = "deleted"


#: The task store's refusals of a create, and how each ends: the module
#: docstring's table, in code. ``{error}`` is the refusal's own message.
CREATE_REFUSALS: dict[type[Exception], tuple[Ending, str]] = {
    InvalidExternalId: (Ending.DEAD, "cannot become a task: {error}"),
    WorkspaceNotAccessible: (Ending.DEAD, "cannot become a task: {error}"),
    WorkspaceMisconfigured: (Ending.NEEDS_OPERATOR, "{error}"),
    WipLimitReached: (Ending.RETRY_THEN_PARK, "workspace {workspace_id}: {error}"),
    TaskNotFound: (Ending.DELETED, ""),
}


@dataclass(frozen=True)
class Run:
    """What one run of one delivery works with, before its claim and after."""

    session: Session
    delivery_pk: int
    settings: Settings
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
    def rng(self) -> random.Random:
        return self.run.rng

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
        delay = next_retry(retries, limit=limit, settings=self.settings, rng=self.rng)
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
        return self.deleted_while_creating(external_id)


# --- retries -------------------------------------------------------------------------


def backoff_seconds(retries: int, *, settings: Settings, rng: random.Random = _random) -> float:
    """The wait before retry number ``retries + 1``: exponential, with jitter.

    The ceiling doubles from ``retry_base_seconds`` with each retry, up to
    ``retry_max_seconds``; the wait is drawn uniformly between half the
    ceiling and the ceiling ("equal jitter"), so deliveries that collided
    once spread out, and none retries sooner than half the ceiling.
    """
    ceiling = min(settings.retry_max_seconds, settings.retry_base_seconds * 2 ** min(retries, 64))
    return rng.uniform(ceiling / 2, ceiling)


def next_retry(
    retries: int, *, limit: int, settings: Settings, rng: random.Random = _random
) -> float | None:
    """The wait before the next retry, or None when ``limit`` retries were spent."""
    if retries >= limit:
        return None
    return backoff_seconds(retries, settings=settings, rng=rng)


# --- parsing -------------------------------------------------------------------------


def draft_of(
    *, provider: str, event: str, content_type: str | None, body: bytes, site_url: str | None
) -> TaskDraft:
    """The TaskDraft a stored delivery describes, parsed by its provider's adapter.

    Raises :class:`UnsupportedPayload` or :class:`UnsupportedContentType`.
    """
    known = PROVIDERS.get(provider)
    if known is None:
        raise UnsupportedPayload(f"no provider {provider!r}")
    return known.to_draft(event, known.decode_body(content_type, body), site=site_url)


# --- the run ---------------------------------------------------------------------------


def _failpoint_hooks() -> CreateHooks:
    def after_insert(task: Task) -> None:
        failpoint(AFTER_INSERT, delivery=task.created_by_delivery)
        failpoint(BEFORE_SETTLE, delivery=task.created_by_delivery)

    return CreateHooks(after_lookup=lambda: failpoint(AFTER_LOOKUP), after_insert=after_insert)


FAILPOINT_HOOKS = _failpoint_hooks()


@dataclass
class _LookupMisses:
    """Counts the create's lookup misses, around the caller's hooks.

    A Found outcome after a miss means the lookup did not see the holder and
    the insert's unique index (or the re-read after a pre-insert failure) did:
    the TOCTOU backstop (docs/contract.md, "The create sequence", step 5). The
    reliability suite counts how often real concurrency takes it.
    """

    hooks: CreateHooks
    count: int = 0

    def around(self) -> CreateHooks:
        def after_lookup() -> None:
            self.count += 1
            self.hooks.after_lookup()

        return replace(self.hooks, after_lookup=after_lookup)


@dataclass(frozen=True)
class Begun:
    """How far :func:`process_deliveries` took one key of its message on
    SQLite's fast path before :func:`process_delivery` goes on with it: the
    claim committed in the message's first transaction, and in the plain case
    the key's ``after_insert`` hooks ran and perhaps the group settled it."""

    fast: SQLiteFastPath
    #: The committed claim; None: the delivery is finished or held by another.
    claimed: Claimed | None
    #: The group's settlement of the plain case; None: the key settles alone.
    settlement: Settlement | None = None
    #: What the key's ``after_insert`` hooks raised, raised again where a
    #: key's run calls them, so that one function answers it.
    hooks_failed: Exception | None = None


def process_delivery(
    *,
    session: Session,
    delivery_pk: int,
    settings: Settings,
    retries: int = 0,
    hooks: CreateHooks = FAILPOINT_HOOKS,
    transient: tuple[type[BaseException], ...] = TRANSIENT_ERRORS,
    rng: random.Random = _random,
    begun: Begun | None = None,
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
    ``begun``: the run goes on from a claim :func:`process_deliveries`
    committed for several keys at once, instead of claiming.
    """
    run = Run(session, delivery_pk, settings, rng, transient)
    lease: Lease | None = None  # set once the claim has committed
    resources = ExitStack()  # the fast path's connection, back to the pool at the end
    try:
        misses = _LookupMisses(hooks)
        fast: FastPath | SQLiteFastPath | None = None
        if begun is not None:
            fast, claimed = begun.fast, begun.claimed
        else:
            if settings.worker_fast_path and _nothing_runs_between_lookup_and_insert(hooks):
                fast = resources.enter_context(fast_path(session.get_bind()))
            claimed = _claim(session, fast, delivery_pk, settings, misses)
        if claimed is None:
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
        # The row's budget, which a crash does not refill (see above).
        lease = replace(claimed.lease, retries=max(claimed.lease.retries, retries))
        attempt = Attempt(run, lease)
        if fast is not None and claimed.inserted is not None:
            settled = _settle_fast(attempt, fast, claimed.inserted, hooks, begun)
            return replace(settled, path="fast" if begun is None else "batch")
        return replace(
            _create_on_the_general_path(attempt, _read_claimed(session, lease), misses),
            path="general",
        )
    except transient as error:
        session.rollback()  # whatever the failed statement left open
        return _after_transient_error(run, lease, error, retries)
    except Exception as error:
        session.rollback()  # whatever the failed statement left open
        if lease is None:
            raise
        # Not a database hiccup: a bug or a body nobody foresaw. Retrying would
        # fail the same way, and the sweeper would send it back every lease
        # period, so it is parked dead with the error for a person to read.
        log.exception("delivery %s failed unexpectedly; marking it dead", delivery_pk)
        return Attempt(run, lease).finish(
            DeliveryStatus.DEAD,
            reason="unexpected error while processing; see last_error",
            error=_describe(error),
        )
    finally:
        resources.close()


def process_deliveries(
    *,
    session: Session,
    delivery_pks: Sequence[int],
    settings: Settings,
    hooks: CreateHooks = FAILPOINT_HOOKS,
    transient: tuple[type[BaseException], ...] = TRANSIENT_ERRORS,
    rng: random.Random = _random,
) -> list[Processed | Exception]:
    """:func:`process_delivery` for each key of one worker message, in order,
    each in its place in the answer; a key whose run raised (only before its
    claim committed) has the exception there, and holds up no other key.

    On SQLite's fast path the message's keys share its two transactions
    (``SQLiteFastPath.claim_and_insert_many``, then
    ``settle_and_finish_many``), two commits for the message rather than two
    per key; between them each plain key's ``after_insert`` hooks run, in key
    order, as they run after a key's own insert. Then each key goes on alone
    from where the group left it (:class:`Begun`): a key the group settled
    is done, one the group could not settle settles alone, one that is not
    the plain case takes the general path. When the first transaction fails,
    nothing of it committed, and each key runs alone from its claim.
    PostgreSQL runs one key at a time (``models.fastpath.FastPath`` says why).
    """

    def each(pk: int, begun: Begun | None = None) -> Processed | Exception:
        # Nothing a key's run loaded is carried into the next one's, as if
        # each had a session of its own.
        session.expunge_all()
        try:
            return process_delivery(
                session=session,
                delivery_pk=pk,
                settings=settings,
                hooks=hooks,
                transient=transient,
                rng=rng,
                begun=begun,
            )
        except Exception as error:
            return error

    # Only SQLite's fast path batches: ask the dialect before taking a
    # connection, so that a PostgreSQL message checks none out for nothing.
    if (
        len(delivery_pks) > 1
        and settings.worker_fast_path
        and session.get_bind().dialect.name == "sqlite"
        and _nothing_runs_between_lookup_and_insert(hooks)
    ):
        with fast_path(session.get_bind()) as fast:
            if isinstance(fast, SQLiteFastPath):
                together = _begin_together(fast, delivery_pks, settings, hooks)
                if together is not None:
                    return [
                        each(pk, begun) for pk, begun in zip(delivery_pks, together, strict=True)
                    ]
    return [each(pk) for pk in delivery_pks]


def _begin_together(
    fast: SQLiteFastPath, delivery_pks: Sequence[int], settings: Settings, hooks: CreateHooks
) -> list[Begun] | None:
    """The keys' claims and inserts in one transaction, each plain key's
    ``after_insert`` hooks, then the plain keys' settlements in another;
    None when the first transaction failed (it rolled back whole)."""
    try:
        claims = fast.claim_and_insert_many(
            delivery_pks, lease_seconds=settings.lease_seconds, max_lost=settings.max_lost_attempts
        )
    except Exception as error:  # a lost race, a database error: each key claims alone
        log.info("deliveries %s: claimed one at a time: %s", list(delivery_pks), _describe(error))
        return None
    # The fail points and hooks each key runs after its insert committed and
    # before it settles (the create's insert commits before its settlement:
    # docs/contract.md, "The create sequence").
    hooks_failed: list[Exception | None] = []
    for claimed in claims:
        failed = None
        if claimed is not None and claimed.inserted is not None:
            try:
                hooks.after_insert(claimed.inserted.task)
            except Exception as error:  # answered in the key's own run
                failed = error
        hooks_failed.append(failed)
    plain = [
        index
        for index, claimed in enumerate(claims)
        if claimed is not None and claimed.inserted is not None and hooks_failed[index] is None
    ]
    settlements: list[Settlement | None] = [None] * len(claims)
    if plain:
        try:
            settled = fast.settle_and_finish_many([claims[index] for index in plain])
        except Exception as error:  # each key settles alone, and answers its own error
            log.info(
                "deliveries %s: settled one at a time: %s", list(delivery_pks), _describe(error)
            )
            settled = None
        if settled is not None:
            for index, settlement in zip(plain, settled, strict=True):
                settlements[index] = settlement
    return [
        Begun(fast, claimed, settlement=settlement, hooks_failed=failed)
        for claimed, settlement, failed in zip(claims, settlements, hooks_failed, strict=True)
    ]


def _nothing_runs_between_lookup_and_insert(hooks: CreateHooks) -> bool:
    """The fast path looks up and inserts in one statement, so a create with
    something to run between the two -- a test's hook, the ``after_lookup``
    fail point -- takes the general path, which has the seam."""
    if hooks is FAILPOINT_HOOKS:
        return not armed(AFTER_LOOKUP)
    return hooks.after_lookup is NO_HOOKS.after_lookup


def _claim(
    session: Session,
    fast: FastPath | SQLiteFastPath | None,
    delivery_pk: int,
    settings: Settings,
    misses: _LookupMisses,
) -> Claimed | None:
    """A committed lease, with the plain case's task when the fast path
    inserted it; None when the delivery is finished or held by another."""
    if fast is not None:
        try:
            return fast.claim_and_insert(
                delivery_pk,
                lease_seconds=settings.lease_seconds,
                max_lost=settings.max_lost_attempts,
            )
        except LostTheRace:
            # Nothing was written. The fast lookup missed and the unique index
            # caught the rival: the general path's lookup finds it, and the
            # outcome is reported as the backstop's.
            misses.count += 1
    # The lease is durable before the create begins: the create's own
    # transactions commit or roll back on their own.
    with transaction(session, "the lease"):
        lease = claim(
            session=session,
            delivery_pk=delivery_pk,
            lease_seconds=settings.lease_seconds,
            max_lost=settings.max_lost_attempts,
        )
    return None if lease is None else Claimed(lease)


def _read_claimed(session: Session, lease: Lease) -> ClaimedDelivery:
    delivery, source = session.execute(
        select(Delivery, WebhookSource)
        .join(WebhookSource, WebhookSource.id == Delivery.source_id)
        .where(Delivery.id == lease.delivery_pk)
    ).one()
    return ClaimedDelivery(
        delivery_pk=delivery.id,
        event=delivery.event,
        body=delivery.body,
        content_type=delivery.content_type,
        source_slug=source.slug,
        provider=source.provider,
        workspace_id=source.workspace_id,
        create_events=frozenset(source.create_events),
        site_url=source.site_url,
        created_task_id=delivery.created_task_id,
        body_dropped=None
        if delivery.body_dropped_at is None
        else body_dropped_note(
            received_at=delivery.received_at, dropped_at=delivery.body_dropped_at
        ),
    )


def _create_on_the_general_path(
    attempt: Attempt, work: ClaimedDelivery, misses: _LookupMisses
) -> Processed:
    """The general path, from a committed lease: read the body, create, record."""
    session, lease = attempt.session, attempt.lease
    # Checked here as well as at the ingress: the source's events may have
    # changed since the delivery was stored.
    if work.event not in work.create_events:
        reason = f"{work.event} does not create tasks for source {work.source_slug}"
        return attempt.finish(DeliveryStatus.IGNORED, reason=reason)
    if work.body_dropped is not None:
        # Nothing to read a task from: a person's call (docs/runbook.md, "Retention").
        return attempt.finish(
            DeliveryStatus.DEAD, reason=f"nothing to process: {work.body_dropped}"
        )

    try:
        draft = draft_of(
            provider=work.provider,
            event=work.event,
            content_type=work.content_type,
            body=work.body,
            site_url=work.site_url,
        )
    except (UnsupportedPayload, UnsupportedContentType) as error:
        return attempt.finish(DeliveryStatus.DEAD, reason=f"unsupported payload: {error}")
    if _names_no_identity(draft):
        # The task store treats a blank external id as none at all
        # (docs/contract.md, "Validation and normalization"), and a task
        # without one would be made again by every redelivery.
        reason = f"cannot become a task: the payload names no external id ({draft.external_id!r})"
        return attempt.finish(DeliveryStatus.DEAD, reason=reason)
    try:
        # Everything the create will write, checked before its insert by the
        # task store's own rules (docs/contract.md, "Validation and
        # normalization"): a value no database stores must end the delivery
        # here, not fail the source link's write after the task committed.
        new = validated_new_task(replace(draft.new_task(), created_by_delivery=work.delivery_pk))
    except InvalidTask as error:
        return attempt.finish(DeliveryStatus.DEAD, reason=f"unsupported payload: {error}")

    if work.created_task_id is not None:
        return _finish_earlier_attempts_create(attempt, work.created_task_id, new)
    try:
        result = create_task(
            session=session,
            caller=Caller.trusted(f"delivery {work.delivery_pk}"),
            workspace_id=work.workspace_id,
            new=new,
            hooks=misses.around(),
            fence=fence_create(lease),
        )
    except LeaseTakenOver:
        return attempt.taken_over()  # nothing was inserted: the insert rolled back
    except tuple(CREATE_REFUSALS) as error:
        return attempt.refused(error, workspace_id=work.workspace_id, external_id=draft.external_id)

    holder = result.task
    backstop = result.outcome.deduplicated and misses.count > 0
    if backstop:
        log.info(
            "delivery %s: the lookup missed %r, the insert backstop found task %s (%s)",
            work.delivery_pk,
            draft.external_id,
            holder.id,
            result.outcome.value,
        )
    if result.outcome is CreateOutcome.FOUND_UNSETTLED:
        if holder.created_by_delivery == work.delivery_pk:
            failpoint(BEFORE_SETTLE, delivery=lease.delivery_pk)
            reason = "finished the create an earlier attempt of this delivery left unsettled"
            return _finish_own_create(attempt, holder, new.source, reason=reason)
        return attempt.wait_or_park(
            _held_by(holder), outcome=result.outcome.value, task_id=holder.id
        )

    outcome = result.outcome
    reason = None
    if outcome is CreateOutcome.FOUND_SETTLED and holder.created_by_delivery == work.delivery_pk:
        # An earlier attempt of this very delivery created and settled the task,
        # then died before recording it: the outcome is that attempt's.
        outcome = CreateOutcome.CREATED
        reason = "an earlier attempt of this delivery created the task"
    elif outcome is CreateOutcome.CREATED_IDENTITY_LOST:
        reason = f"created {holder.identifier}, but {draft.external_id!r} was released meanwhile"
    elif backstop:
        reason = "the lookup missed; the insert's unique index found the task (the backstop)"
    if not outcome.deduplicated:
        failpoint(AFTER_SETTLE, delivery=lease.delivery_pk)
    return attempt.finish(
        DeliveryStatus.DONE, outcome=outcome.value, task_id=holder.id, reason=reason
    )


def _settle_fast(
    attempt: Attempt,
    fast: FastPath | SQLiteFastPath,
    inserted: Inserted,
    hooks: CreateHooks,
    begun: Begun | None,
) -> Processed:
    """The plain create's second statement, after the fast path inserted the
    task: settle it and record the delivery done (steps 6 and 7). A key of a
    batch (``begun``) ran its hooks between the batch's two transactions, and
    settles here only when the group did not."""
    task, source = inserted.task, inserted.source
    settlement = None
    if begun is None:
        hooks.after_insert(task)
    elif begun.hooks_failed is not None:
        raise begun.hooks_failed
    else:
        settlement = begun.settlement  # None: the group did not settle it
    if settlement is None:
        settlement = fast.settle_and_finish(task=task, source=source, lease=attempt.lease)
    if settlement is Settlement.TAKEN_OVER:
        return attempt.taken_over()
    if settlement is Settlement.FINISHED:
        failpoint(AFTER_SETTLE, delivery=attempt.delivery_pk)
        return Processed(
            attempt.delivery_pk, DeliveryStatus.DONE, outcome="created", task_id=task.id
        )
    # Deleted or released before it settled: the general completion re-reads
    # and tells which, as it does for a crashed attempt's own task.
    return _finish_own_create(attempt, task, source, reason=None)


def _finish_earlier_attempts_create(attempt: Attempt, task_id: int, new: NewTask) -> Processed:
    """An earlier attempt of this delivery inserted ``task_id``: finish that
    create rather than make another, or park the delivery when the task is
    gone -- deleted before its creation settled, and recreating it would undo
    someone's delete (docs/contract.md, "Fencing the create")."""
    external_id = normalize_external_id(new.external_id)
    stored = attempt.session.get(Task, task_id, populate_existing=True)
    if stored is None:
        return attempt.deleted_while_creating(external_id)
    reason = "finished the create an earlier attempt of this delivery began"
    if stored.external_id_settled_at is not None:
        reason = "an earlier attempt of this delivery created the task"
    # The task as it was inserted, with the identity it was created with: if
    # an operator released it since, the settlement must see that and report
    # the identity lost.
    inserted = Task(
        id=stored.id,
        workspace_id=stored.workspace_id,
        identifier=stored.identifier,
        external_id=external_id,
        created_by_delivery=attempt.delivery_pk,
    )
    failpoint(BEFORE_SETTLE, delivery=attempt.delivery_pk)
    return _finish_own_create(attempt, inserted, new.source, reason=reason)


def _names_no_identity(draft: TaskDraft) -> bool:
    try:
        return normalize_external_id(draft.external_id) is None
    except InvalidExternalId:
        return False  # invalid, not absent: create_task says why


def _finish_own_create(
    attempt: Attempt, task: Task, source: SourceLink | None, *, reason: str | None
) -> Processed:
    """Steps 6-8 for a task this delivery inserted: an earlier attempt's, or
    this attempt's when the fast path's settlement matched no row (the task
    deleted, its identity released, or the settlement done by a concurrent
    completion of the same create); the re-read tells which. ``task``
    carries the identity it was inserted with."""
    task_id, identifier, external_id = task.id, task.identifier, task.external_id
    try:
        completed = complete_creation(session=attempt.session, task=task, source=source)
    except TaskNotFound:
        return attempt.deleted_while_creating(external_id)
    failpoint(AFTER_SETTLE, delivery=attempt.delivery_pk)
    if completed.outcome is CreateOutcome.CREATED_IDENTITY_LOST:
        reason = f"created {identifier}, but {external_id!r} was released meanwhile"
    return attempt.finish(
        DeliveryStatus.DONE, outcome=completed.outcome.value, task_id=task_id, reason=reason
    )


def _held_by(holder: Task) -> str:
    creator = (
        f"delivery {holder.created_by_delivery}"
        if holder.created_by_delivery is not None
        else "a caller outside the webhook inbox"
    )
    return (
        f"{holder.external_id!r} is held by unsettled task {holder.identifier} "
        f"(id {holder.id}), whose create by {creator} has not finished"
    )


def _after_transient_error(
    run: Run, lease: Lease | None, error: BaseException, retries: int
) -> Processed:
    """Retry after a database error, with backoff; past the limit, dead.
    ``retries`` is the message's count: without a lease the row was not read
    (the claim itself failed), and the message's count is all there is."""
    session, settings, delivery_pk = run.session, run.settings, run.delivery_pk
    summary = _describe(error)
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


def _describe(error: BaseException) -> str:
    # The first line only: SQLAlchemy appends the statement and its parameters.
    detail = str(getattr(error, "orig", None) or error).strip().splitlines()
    text = f"{type(error).__name__}: {detail[0] if detail else ''}".strip()
    return text[:_MAX_ERROR_CHARS]
