"""The fast paths' side of a delivery's run: how a run starts, and the
plain case's settlement.

A run starts from a committed claim (:class:`Start`). On the fast path
(``models.fastpath``) the claim also inserts the plain case's task; then the
seams after the insert run, and the run settles it here. The fast path
can start every key of one worker message together
(:func:`started_together`): their claims and inserts in one transaction,
each plain key's seams, then their settlements in a second, two commits for
the message rather than two per key. Each key then goes on alone from its
:class:`Start`, so a key's decisions and error handling are written once
(docs/architecture.md, "The fast path").
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from sqlalchemy.orm import Session

from models.db import transaction
from models.fastpath import (
    Claimed,
    FastPath,
    Inserted,
    LostTheRace,
    Settlement,
    SQLiteFastPath,
    fast_path,
)
from models.inbox import DeliveryStatus, claim
from models.settings import Settings
from worker.processing.attempt import Attempt, Processed, Run, describe
from worker.processing.general import LookupMisses, finish_own_create
from worker.processing.seams import Seams

log = logging.getLogger("worker.processing")


@dataclass(frozen=True)
class Start:
    """How far a key's run got before its attempt goes on: the committed
    claim and, on the fast path's plain case, its inserted task."""

    #: None: the delivery is finished, held by another worker, or its
    #: attempts were lost.
    claimed: Claimed | None
    #: The fast path that inserted the task (None: no task was inserted).
    fast: FastPath | SQLiteFastPath | None = None
    #: "fast", or "batch" for a key started with its message's other keys.
    path: str = "fast"
    #: The message's settlement of the key; None: it settles alone.
    settlement: Settlement | None = None
    #: What the seams after the insert raised, raised again in the key's run
    #: (inside its error handling) rather than where they ran.
    seams_failed: Exception | None = None

    @property
    def inserted(self) -> Inserted | None:
        return None if self.claimed is None or self.fast is None else self.claimed.inserted


def takes_fast_path(settings: Settings, seams: Seams) -> bool:
    """The fast path looks up and inserts in one step, so a create with
    something to run between the two -- a test's seam, the ``after_lookup``
    fail point -- takes the general path, which has the seam."""
    return settings.worker_fast_path and seams.between_lookup_and_insert() is None


def start_alone(run: Run, resources: ExitStack, misses: LookupMisses) -> Start:
    """One key's claim: on the fast path (its connection held in
    ``resources`` for the run), with the plain case's insert and the seams
    after it; else the general path's lease alone."""
    fast = None
    if takes_fast_path(run.settings, run.seams):
        fast = resources.enter_context(fast_path(run.session.get_bind()))
    return claim_alone(run, fast, misses)


def claim_alone(run: Run, fast: FastPath | SQLiteFastPath | None, misses: LookupMisses) -> Start:
    settings = run.settings
    if fast is not None:
        try:
            claimed = fast.claim_and_insert(
                run.delivery_pk,
                lease_seconds=settings.lease_seconds,
                max_lost=settings.max_lost_attempts,
            )
        except LostTheRace:
            # Nothing was written. The fast lookup missed and the unique index
            # caught the rival: the general path's lookup finds it, and the
            # outcome is reported as the backstop's.
            misses.missed()
        else:
            if claimed is None or claimed.inserted is None:
                return Start(claimed)
            return Start(claimed, fast, seams_failed=_after_insert(run.seams, claimed))
    # The lease is durable before the create begins: the create's own
    # transactions commit or roll back on their own.
    with transaction(run.session, "the lease"):
        lease = claim(
            session=run.session,
            delivery_pk=run.delivery_pk,
            lease_seconds=settings.lease_seconds,
            max_lost=settings.max_lost_attempts,
        )
    return Start(None if lease is None else Claimed(lease))


def _after_insert(seams: Seams, claimed: Claimed) -> Exception | None:
    """The seams between a plain case's insert and its settlement: the
    create's insert commits before its settlement (docs/contract.md, "The
    create sequence"), and a crash may come between them."""
    task = claimed.inserted.task
    try:
        seams.after_insert(task)
        seams.before_settle(task.created_by_delivery)
    except Exception as error:  # answered in the key's own run
        return error
    return None


@contextmanager
def started_together(
    session: Session, delivery_pks: Sequence[int], settings: Settings, seams: Seams
) -> Iterator[list[Start] | None]:
    """The keys of one message started together on the fast path: the claims
    and inserts in one transaction, each plain key's seams in key order,
    then the plain keys' settlements in a second transaction. None (each key
    starts alone) for a single key, without the fast path, behind PgBouncer
    (a group prepares its statements: ``models.fastpath.FastPath``), or when
    the first transaction failed (it rolled back whole). The fast path's
    connection stays open until the keys' runs are over."""
    if len(delivery_pks) < 2 or not _together(session, settings, seams):
        yield None
        return
    with fast_path(session.get_bind()) as fast:
        yield None if fast is None else _start_together(fast, delivery_pks, settings, seams)


def _together(session: Session, settings: Settings, seams: Seams) -> bool:
    """Whether a message's keys may start together here; asked before a
    connection is taken, so that a message that may not checks none out."""
    dialect = session.get_bind().dialect.name
    pooled = dialect == "postgresql" and settings.database_pooler != "none"
    return dialect in ("sqlite", "postgresql") and not pooled and takes_fast_path(settings, seams)


def _start_together(
    fast: FastPath | SQLiteFastPath,
    delivery_pks: Sequence[int],
    settings: Settings,
    seams: Seams,
) -> list[Start] | None:
    try:
        claims = fast.claim_and_insert_many(
            delivery_pks, lease_seconds=settings.lease_seconds, max_lost=settings.max_lost_attempts
        )
    except Exception as error:  # a lost race, a database error: each key claims alone
        log.info("deliveries %s: claimed one at a time: %s", list(delivery_pks), describe(error))
        return None
    failed = [
        None if claimed is None or claimed.inserted is None else _after_insert(seams, claimed)
        for claimed in claims
    ]
    plain = [
        index
        for index, claimed in enumerate(claims)
        if claimed is not None and claimed.inserted is not None and failed[index] is None
    ]
    settlements: list[Settlement | None] = [None] * len(claims)
    if plain:
        try:
            settled = fast.settle_and_finish_many([claims[index] for index in plain])
        except Exception as error:  # each key settles alone, and answers its own error
            log.info(
                "deliveries %s: settled one at a time: %s", list(delivery_pks), describe(error)
            )
            settled = None
        if settled is not None:
            for index, settlement in zip(plain, settled, strict=True):
                settlements[index] = settlement
    return [
        Start(
            claimed,
            None if claimed is None or claimed.inserted is None else fast,
            path="batch",
            settlement=settlement,
            seams_failed=seams_failed,
        )
        for claimed, settlement, seams_failed in zip(claims, settlements, failed, strict=True)
    ]


def settle_fast(attempt: Attempt, start: Start) -> Processed:
    """The plain create's second step, after the fast path inserted the task:
    settle it and record the delivery done (steps 6 and 7), unless its
    message settled it already."""
    task, source = start.inserted.task, start.inserted.source
    if start.seams_failed is not None:
        raise start.seams_failed
    settlement = start.settlement
    if settlement is None:
        settlement = start.fast.settle_and_finish(task=task, source=source, lease=attempt.lease)
    if settlement is Settlement.TAKEN_OVER:
        return attempt.taken_over()
    if settlement is Settlement.FINISHED:
        attempt.seams.after_settle(attempt.delivery_pk)
        return Processed(
            attempt.delivery_pk, DeliveryStatus.DONE, outcome="created", task_id=task.id
        )
    # Deleted or released before it settled: the general completion re-reads
    # and tells which, as it does for a crashed attempt's own task.
    return finish_own_create(attempt, task, source, reason=None)
