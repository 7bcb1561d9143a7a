"""The inbox's retention policy: what it drops and deletes, in small batches.

Two rules, each off at 0 days (``models.settings``; docs/runbook.md,
"Retention"):

- the body of a ``done`` or ``ignored`` delivery last changed more than
  ``TASKHOOK_BODY_RETENTION_DAYS`` ago is **dropped**: ``body`` becomes
  empty, ``body_dropped_at`` says when, and the draft the ingress read from
  it goes too. The row stays, with its ``body_sha256`` and status, so a late
  redelivery is still answered as a duplicate (``models.inbox.record_delivery``
  decides on the id and the hash, never on the body) and a resent body is
  still a replay;
- a finished row (``done``, ``ignored``, ``replay``, ``mismatch``) last
  changed more than ``TASKHOOK_INBOX_RETENTION_DAYS`` ago is **deleted**.

Never touched: ``queued`` and ``processing`` rows (work not done yet),
``needs_operator`` and ``dead`` ones (they wait for a person, who may replay
them: the body is what a replay runs on). Nothing else is: task events,
tasks and identity releases stay. No foreign key points at ``deliveries``
(``tasks.created_by_delivery``, ``deliveries.task_id`` are plain integers,
so a task outlives the delivery that made it), so a delete cascades nowhere.

The age is ``updated_at``: when the row last changed, which for a finished
row is when it finished. Every batch is one transaction of at most
``batch`` rows, chosen through an index (``ix_deliveries_status_updated_at``,
one status at a time, oldest first) and changed by primary key with its
conditions checked again, so a row that changed since it was chosen is left
alone; a pause between batches leaves the database to the ingress and the
workers. Bodies are dropped oldest first, so among a status's rows in time
order the dropped ones come first: a bisection of that order (a few dozen
probes of the same index) finds where they end, and no batch reads past
bodies already dropped. No index names ``body_dropped_at``, so a drop
changes no indexed column: PostgreSQL updates the row in its page (HOT)
where the page has room, writing no index entry.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, delete, func, select, update
from sqlalchemy.orm import Session

from models.db import transaction
from models.identities import keep_creators
from models.inbox import DRAFT_COLUMNS, DeliveryStatus
from models.settings import Settings
from models.tables import Delivery, utcnow

#: Whose body is dropped: finished, and nobody will run them again.
BODIES_DROPPED = (DeliveryStatus.DONE, DeliveryStatus.IGNORED)
#: Whose row is deleted: every finished state no person is asked to act on.
ROWS_DELETED = (
    DeliveryStatus.DONE,
    DeliveryStatus.IGNORED,
    DeliveryStatus.REPLAY,
    DeliveryStatus.MISMATCH,
)
#: Never touched, whatever their age.
NEVER_TOUCHED = frozenset(DeliveryStatus) - frozenset(ROWS_DELETED)

#: See Policy.pace: a prune works at most a twentieth of the time, so the
#: ingress and the workers keep the database (docs/performance.md, "8. Retention").
PACE = 19.0

DROP_BODY = "drop body"
DELETE_ROW = "delete row"


@dataclass(frozen=True)
class Policy:
    """The retention settings, as one value (0 days: that rule is off)."""

    body_days: int
    row_days: int
    batch: int = 1000
    pause_seconds: float = 0.05
    #: Each pause lasts at least this many times the batch before it: the
    #: prune works at most 1 / (1 + pace) of the time, whatever the load.
    pace: float = PACE

    @classmethod
    def of(cls, settings: Settings) -> Policy:
        return cls(
            body_days=settings.body_retention_days,
            row_days=settings.inbox_retention_days,
            batch=settings.retention_batch,
            pause_seconds=settings.retention_pause_seconds,
        )

    def body_cutoff(self, now: datetime) -> datetime | None:
        """Bodies of rows last changed before this are dropped; None: never."""
        return now - timedelta(days=self.body_days) if self.body_days else None

    def row_cutoff(self, now: datetime) -> datetime | None:
        """Rows last changed before this are deleted; None: never."""
        return now - timedelta(days=self.row_days) if self.row_days else None

    def describe(self) -> str:
        bodies = (
            f"bodies of done and ignored deliveries are dropped after {self.body_days} days"
            if self.body_days
            else "bodies are kept"
        )
        rows = (
            f"finished rows are deleted after {self.row_days} days"
            if self.row_days
            else "rows are never deleted"
        )
        return f"{bodies}; {rows}"


@dataclass(frozen=True)
class PlanLine:
    """What a prune would do to the rows of one status and event."""

    action: str
    status: str
    event: str
    rows: int
    body_bytes: int


@dataclass
class Pruned:
    """What a prune did."""

    #: Rows deleted and bodies dropped, by status.
    deleted: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    #: The body bytes they held (uncompressed).
    body_bytes: int = 0
    #: Write transactions, each of at most the policy's batch of rows.
    batches: int = 0
    #: False when it stopped at its time budget with rows left to do.
    finished: bool = True
    seconds: float = 0.0
    #: Of those, the time spent in its transactions (the rest is pauses).
    busy_seconds: float = 0.0


def _rows_to_delete(status: str, cutoff: datetime) -> ColumnElement[bool]:
    return (Delivery.status == status) & (Delivery.updated_at < cutoff)


def _bodies_to_drop(status: str, cutoff: datetime, after: datetime | None) -> ColumnElement[bool]:
    where = (
        (Delivery.status == status)
        & Delivery.body_dropped_at.is_(None)
        & (Delivery.updated_at < cutoff)
    )
    return where if after is None else where & (Delivery.updated_at >= after)


#: The bisection stops when the dropped bodies' end is known this closely;
#: the first batch then reads past at most this much time of dropped ones.
_BISECTED_TO = timedelta(seconds=1)


def _drop_from(
    session: Session, status: str, row_cutoff: datetime | None, body_cutoff: datetime
) -> datetime:
    """Where a status's bodies still to drop begin: after the rows deleted
    before them (``row_cutoff``) and after the bodies already dropped, which
    come first in time order (they are dropped oldest first). Bisects the
    time up to ``body_cutoff``, one probe of ``ix_deliveries_status_updated_at``
    a step."""

    def first_from(moment: datetime | None) -> tuple[datetime, bool] | None:
        """The first row at or after ``moment``: when it changed, and whether
        its body is dropped."""
        where = (Delivery.status == status) & (Delivery.updated_at < body_cutoff)
        if moment is not None:
            where &= Delivery.updated_at >= moment
        found = session.execute(
            select(Delivery.updated_at, Delivery.body_dropped_at.is_not(None))
            .where(where)
            .order_by(Delivery.updated_at)
            .limit(1)
        ).first()
        return None if found is None else (found[0], bool(found[1]))

    first = first_from(row_cutoff)
    if first is None:
        return body_cutoff  # nothing left to drop
    if not first[1]:
        return first[0]
    # From a dropped body (low) to where none is known dropped (high).
    low, high = first[0], body_cutoff
    while high - low > _BISECTED_TO:
        middle = low + (high - low) / 2
        found = first_from(middle)
        if found is not None and found[1]:
            low = found[0]
        else:
            high = middle
    return low


def plan(*, session: Session, policy: Policy, now: datetime | None = None) -> list[PlanLine]:
    """What :func:`prune` would do now, by action, status and event; changes nothing."""
    now = now or utcnow()
    lines: list[PlanLine] = []
    row_cutoff, body_cutoff = policy.row_cutoff(now), policy.body_cutoff(now)
    wheres: list[tuple[str, ColumnElement[bool]]] = []
    if row_cutoff is not None:
        wheres += [(DELETE_ROW, _rows_to_delete(s.value, row_cutoff)) for s in ROWS_DELETED]
    if body_cutoff is not None:
        wheres += [
            (
                DROP_BODY,
                _bodies_to_drop(
                    s.value, body_cutoff, _drop_from(session, s.value, row_cutoff, body_cutoff)
                ),
            )
            for s in BODIES_DROPPED
        ]
    for action, where in wheres:
        rows = session.execute(
            select(
                Delivery.status,
                Delivery.event,
                func.count(),
                func.coalesce(func.sum(func.length(Delivery.body)), 0),
            )
            .where(where)
            .group_by(Delivery.status, Delivery.event)
            .order_by(Delivery.event)
        ).all()
        lines += [PlanLine(action, status, event, n, int(size)) for status, event, n, size in rows]
    return lines


def prune(
    *,
    session: Session,
    policy: Policy,
    now: datetime | None = None,
    budget_seconds: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Pruned:
    """Delete the old finished rows, then drop the old bodies, one batch (one
    transaction) at a time with a pause between two (the policy's, or ``pace``
    times the batch's own time if longer); stop between batches once
    ``budget_seconds`` have passed (``finished`` is then False)."""
    now = now or utcnow()
    started = clock()
    done = Pruned()
    counts: dict[str, Counter[str]] = {DELETE_ROW: Counter(), DROP_BODY: Counter()}
    #: How long the last batch took when it was a full one (more follow, after
    #: a pause); None after a partial one.
    full: float | None = None

    def out_of_time() -> bool:
        return budget_seconds is not None and clock() - started >= budget_seconds

    def batches(action: str, status: str, where_after: Callable, after: datetime | None) -> None:
        """Batches of ``action`` on ``status`` until fewer than a batch are left."""
        nonlocal full
        while not out_of_time():
            if full is not None:
                # Between two transactions, holding nothing.
                sleep(max(policy.pause_seconds, policy.pace * full))
                if out_of_time():
                    return
            where = where_after(after)
            began = clock()
            with transaction(session, f"a retention batch: {action}"):
                chosen = _choose(session, where, policy.batch)
                if chosen:
                    sizes = {pk: size or 0 for pk, size, _ in chosen}
                    if action == DELETE_ROW:
                        keep_creators(session, list(sizes))
                    written = session.scalars(_write(action, where, list(sizes), now)).all()
                    done.batches += 1
                    done.body_bytes += sum(sizes[pk] for pk in written)
                    counts[action][status] += len(written)
                    # Oldest first: the next batch starts where this one ended.
                    after = chosen[-1][2]
            took = clock() - began
            done.busy_seconds += took
            full = took if len(chosen) == policy.batch else None
            if full is None:
                return

    row_cutoff, body_cutoff = policy.row_cutoff(now), policy.body_cutoff(now)
    if row_cutoff is not None:
        for status in ROWS_DELETED:
            batches(
                DELETE_ROW,
                status.value,
                lambda _after, s=status.value: _rows_to_delete(s, row_cutoff),
                None,
            )
    if body_cutoff is not None:
        for status in BODIES_DROPPED:
            batches(
                DROP_BODY,
                status.value,
                lambda after, s=status.value: _bodies_to_drop(s, body_cutoff, after),
                _drop_from(session, status.value, row_cutoff, body_cutoff),
            )
    done.deleted, done.dropped = (
        {status: n for status, n in counts[action].items() if n}
        for action in (DELETE_ROW, DROP_BODY)
    )
    done.finished = not out_of_time() or not _anything_left(session, policy, now)
    done.seconds = round(clock() - started, 3)
    done.busy_seconds = round(done.busy_seconds, 3)
    return done


def _write(action: str, where: ColumnElement[bool], pks: list[int], now: datetime):
    """The batch's statement: by primary key, the conditions checked again (a
    row that changed since it was chosen is left alone); RETURNING the keys."""
    if action == DELETE_ROW:
        statement = delete(Delivery)
    else:
        statement = update(Delivery).values(
            body=b"", body_dropped_at=now, **dict.fromkeys(DRAFT_COLUMNS)
        )
    return (
        statement.where(Delivery.id.in_(pks), where)
        .returning(Delivery.id)
        .execution_options(synchronize_session=False)
    )


def _choose(session: Session, where: ColumnElement[bool], limit: int) -> list:
    """Up to ``limit`` rows ``where`` holds, oldest first: (id, body bytes,
    updated_at), through ``ix_deliveries_status_updated_at`` (``where`` names
    one status)."""
    return list(
        session.execute(
            select(Delivery.id, func.length(Delivery.body), Delivery.updated_at)
            .where(where)
            .order_by(Delivery.updated_at)
            .limit(limit)
        )
    )


def _anything_left(session: Session, policy: Policy, now: datetime) -> bool:
    row_cutoff, body_cutoff = policy.row_cutoff(now), policy.body_cutoff(now)
    wheres = []
    if row_cutoff is not None:
        wheres += [_rows_to_delete(s.value, row_cutoff) for s in ROWS_DELETED]
    if body_cutoff is not None:
        wheres += [
            _bodies_to_drop(
                s.value, body_cutoff, _drop_from(session, s.value, row_cutoff, body_cutoff)
            )
            for s in BODIES_DROPPED
        ]
    return any(_choose(session, where, 1) for where in wheres)
