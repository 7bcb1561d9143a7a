"""Bulk operations on the inbox, and the filter they share with the listings.

A :class:`DeliveryFilter` says which deliveries (status, source, event, when
received, a search by key), within the workspaces a caller may see. The
console's lists and ``taskhook deliveries list`` page through it
(``models.reports.list_deliveries``); a bulk replay counts what it matches
first (:func:`count_replayable`, the dry run), then queues every replayable
row again (:func:`bulk_replay`), recorded as an :class:`~models.tables.Operation`
-- the operations history. Nothing else here writes.

Both ask one question of the inbox, :func:`selected_for_replay`: a delivery
whose task was deleted before its creation settled is left out unless the
operator names it (a replay of one creates that task again), and every
surface that replays in bulk gets that answer from here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, false, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql import ColumnElement

from models import idempotency
from models.db import session_scope
from models.errors import (
    InvalidExternalId,
    InvalidFilter,
    InvalidOperation,
    InvalidRelease,
    NotReplayable,
    OperationNotFound,
)
from models.external_id import UNICODE_WHITE_SPACE, normalize_external_id
from models.inbox import (
    BULK_REPLAYABLE,
    KEY_ORDER_SLACK,
    DeliveryStatus,
    created_task_gone,
    first_received_since,
    of_workspaces,
    only_replayable,
    replay_delivery,
)
from models.tables import MAX_ROW_ID, Delivery, Operation, Task, WebhookSource, Workspace, utcnow
from models.tasks import MAX_OPERATOR_LENGTH, clean_release_text

log = logging.getLogger(__name__)

#: ``operations.kind`` of a bulk replay.
BULK_REPLAY = "bulk-replay"
#: The longest search: longer than any delivery id (a mismatch's is the
#: sender's id, ``#`` and 16 hex digits) or external id (255 bytes) it could match.
MAX_SEARCH_LENGTH = 300
#: The longest operation name ``operations.name`` keeps.
MAX_OPERATION_NAME_LENGTH = 200
#: The most operations one listing holds.
MAX_OPERATIONS_PAGE = 500
#: The most rows one batch of a bulk replay changes in one transaction.
MAX_BATCH = 5000
#: The most deliveries an operator may name for a bulk replay to recreate
#: their deleted task (one by one, each a decision), and the most of those
#: left out that a dry run lists by id.
MAX_NAMED = 500

# ``webhook_sources.slug`` and ``deliveries.event`` hold no more.
_MAX_SOURCE_LENGTH = 64
_MAX_EVENT_LENGTH = 200


# --- the filter ----------------------------------------------------------------------


@dataclass(frozen=True)
class DeliveryFilter:
    """Which deliveries: every given criterion must hold (None: any).

    ``search`` matches a delivery by its provider's delivery id (exactly), by
    external id (normalized: the one the delivery names, or the one its task
    holds), or, when it is all digits, by its inbox id. Built values are
    checked and cleaned (trimmed, times in UTC); a wrong one raises
    :class:`InvalidFilter`. ``workspace_ids`` is the caller's scope, never a
    criterion: :meth:`criteria` leaves it out.
    """

    status: str | None = None
    source: str | None = None
    event: str | None = None
    #: Received at or after (inclusive), before (exclusive); timezone-aware.
    received_from: datetime | None = None
    received_until: datetime | None = None
    search: str | None = None
    #: The workspaces whose sources' deliveries it may match; None: every one.
    workspace_ids: frozenset[int] | None = None

    def __post_init__(self) -> None:
        if self.status is not None:
            try:
                status = DeliveryStatus(self.status).value
            except ValueError:
                known = ", ".join(s.value for s in DeliveryStatus)
                raise InvalidFilter(
                    f"unknown status {self.status!r}; it is one of {known}"
                ) from None
            object.__setattr__(self, "status", status)
        object.__setattr__(self, "source", _text(self.source, "source", _MAX_SOURCE_LENGTH))
        object.__setattr__(self, "event", _text(self.event, "event", _MAX_EVENT_LENGTH))
        object.__setattr__(self, "search", _text(self.search, "search", MAX_SEARCH_LENGTH))
        for name in ("received_from", "received_until"):
            object.__setattr__(self, name, _utc(getattr(self, name), name))
        if (
            self.received_from is not None
            and self.received_until is not None
            and self.received_from >= self.received_until
        ):
            raise InvalidFilter("received_from must be before received_until")
        if self.workspace_ids is not None:
            object.__setattr__(self, "workspace_ids", frozenset(self.workspace_ids))

    def criteria(self) -> dict[str, str]:
        """The criteria given, as JSON (times in ISO 8601), for the history."""
        found: dict[str, str] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "workspace_ids" or value is None:
                continue
            found[field.name] = value.isoformat() if isinstance(value, datetime) else value
        return found

    @classmethod
    def from_criteria(
        cls, criteria: Mapping[str, object], *, workspace_ids: frozenset[int] | None = None
    ) -> DeliveryFilter:
        """The filter :meth:`criteria` describes, in the scope ``workspace_ids``."""
        known = {field.name for field in fields(cls)} - {"workspace_ids"}
        if unknown := sorted(set(criteria) - known):
            raise InvalidFilter(f"unknown criterion {unknown[0]!r}")
        values: dict[str, object] = dict(criteria)
        for name in ("received_from", "received_until"):
            if isinstance(values.get(name), str):
                try:
                    values[name] = datetime.fromisoformat(values[name])
                except ValueError:
                    raise InvalidFilter(f"{name} is not an ISO 8601 time") from None
        return cls(**values, workspace_ids=workspace_ids)

    def conditions(self, *, session: Session) -> list:
        """The WHERE conditions on ``deliveries`` (no join needed) that select
        what the filter matches. The time bounds become key bounds too
        (:func:`models.inbox.first_received_since`): there is no index on
        ``received_at``, and a range of keys is read by the primary key."""
        conditions = [of_workspaces(self.workspace_ids)]
        if self.status is not None:
            conditions.append(Delivery.status == self.status)
        if self.source is not None:
            conditions.append(
                Delivery.source_id.in_(
                    select(WebhookSource.id).where(WebhookSource.slug == self.source)
                )
            )
        if self.event is not None:
            conditions.append(Delivery.event == self.event)
        if self.received_from is not None:
            first = first_received_since(
                session=session, since=self.received_from - KEY_ORDER_SLACK
            )
            conditions.append(false() if first is None else Delivery.id >= first)
            conditions.append(Delivery.received_at >= self.received_from)
        if self.received_until is not None:
            later = first_received_since(
                session=session, since=self.received_until + KEY_ORDER_SLACK
            )
            if later is not None:
                conditions.append(Delivery.id < later)
            conditions.append(Delivery.received_at < self.received_until)
        if self.search is not None:
            conditions.append(self._searched())
        return conditions

    def _searched(self):
        search = self.search
        matches = [Delivery.delivery_id == search]
        try:
            external_id = normalize_external_id(search)
        except InvalidExternalId:  # longer than an external id may be: no delivery names it
            external_id = None
        if external_id is not None:
            workspaces = select(Workspace.id)
            if self.workspace_ids is not None:
                workspaces = workspaces.where(Workspace.id.in_(sorted(self.workspace_ids)))
            matches.append(Delivery.external_id == external_id)
            # By workspace, so the lookup is one of uniq_tasks_external_id's.
            matches.append(
                Delivery.task_id.in_(
                    select(Task.id).where(
                        Task.workspace_id.in_(workspaces), Task.external_id == external_id
                    )
                )
            )
        if search.isascii() and search.isdigit() and int(search) <= MAX_ROW_ID:
            matches.append(Delivery.id == int(search))
        return or_(*matches)


def _text(value: object, name: str, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidFilter(f"{name} must be text")
    if any(ord(character) < 0x20 or ord(character) == 0x7F for character in value):
        raise InvalidFilter(f"{name} must be one line without control characters")
    text = value.strip(UNICODE_WHITE_SPACE)
    if len(text) > limit:
        raise InvalidFilter(f"{name} must be at most {limit} characters (got {len(text)})")
    return text or None


def _utc(value: object, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidFilter(f"{name} must be a time")
    if value.tzinfo is None:
        raise InvalidFilter(f"{name} must say its time zone")
    return value.astimezone(UTC)


# --- the dry run -----------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayCount:
    """What a bulk replay of a filter would do now."""

    #: Rows it would queue again (the named ones among them).
    replayable: int
    #: Matching needs_operator and dead rows whose body the retention policy
    #: dropped: only their record is kept, so they cannot be replayed.
    bodies_dropped: int
    #: Matching rows whose task was deleted before its creation settled, not
    #: named: left out, since replaying one creates that task again.
    task_deleted: int = 0
    #: Their ids, in key order (at most :data:`MAX_NAMED`): what to name.
    task_deleted_ids: tuple[int, ...] = ()


def bulk_statuses(filter: DeliveryFilter) -> frozenset[DeliveryStatus]:
    """The statuses a bulk replay of ``filter`` queues again; raises
    :class:`NotReplayable` when its status is none of them."""
    if filter.status is None:
        return BULK_REPLAYABLE
    status = DeliveryStatus(filter.status)
    if status not in BULK_REPLAYABLE:
        raise NotReplayable(
            f"{status} deliveries cannot be replayed in bulk: {only_replayable(BULK_REPLAYABLE)}"
            " that way (a replay or mismatch delivery is replayed on its own, once its sender"
            " is known to be genuine)"
        )
    return frozenset({status})


def checked_named(named: Iterable[object]) -> frozenset[int]:
    """The deliveries an operator named to replay although their task was
    deleted, as inbox ids; :class:`InvalidOperation` for anything else."""
    ids: set[int] = set()
    for value in named:
        text = str(value).strip()
        if not (text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_ROW_ID):
            raise InvalidOperation(f"{value!r} is not a delivery's id (an inbox id, 1 or more)")
        ids.add(int(text))
    if len(ids) > MAX_NAMED:
        raise InvalidOperation(f"at most {MAX_NAMED} deliveries can be named (got {len(ids)})")
    return frozenset(ids)


@dataclass(frozen=True)
class Selection:
    """A bulk replay's conditions on ``deliveries``, in SQL."""

    #: Rows in a status replayed in bulk that the filter matches.
    matched: list
    #: Of those, the ones it queues again: body kept; task not deleted
    #: before its creation settled, or named.
    replayed: ColumnElement[bool]
    #: Of those, the ones it leaves out: body kept, task deleted before its
    #: creation settled, not named.
    left_out: ColumnElement[bool]


def selected_for_replay(
    *, session: Session, filter: DeliveryFilter, named: frozenset[int] = frozenset()
) -> Selection:
    """What a bulk replay of ``filter`` queues again: every needs_operator and
    dead row it matches whose body is kept, except those whose task was
    deleted before its creation settled -- their replay creates that task
    again, and the runbook's "replay only if the task should exist" is a
    decision per item -- unless ``named``. The one answer the dry run, the
    run and every surface share.

    Raises :class:`NotReplayable` for a filter on a status not replayed in
    bulk, and when a named delivery is not one the filter leaves out that
    way: a named id is a decision about one delivery, and a wrong one
    (mistyped, or outside the filter) must not pass unnoticed.
    """
    statuses = bulk_statuses(filter)
    matched = [
        Delivery.status.in_([status.value for status in statuses]),
        *filter.conditions(session=session),
    ]
    body_kept = Delivery.body_dropped_at.is_(None)
    gone = created_task_gone()
    if named:
        listed = Delivery.id.in_(sorted(named))
        found = set(session.scalars(select(Delivery.id).where(*matched, body_kept, gone, listed)))
        if missing := sorted(named - found):
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            raise NotReplayable(
                "a named delivery must be one this replay leaves out because its task was "
                f"deleted before its creation settled; not so: {shown}"
            )
        return Selection(
            matched=matched,
            replayed=and_(body_kept, or_(~gone, listed)),
            left_out=and_(body_kept, gone, ~listed),
        )
    return Selection(
        matched=matched, replayed=and_(body_kept, ~gone), left_out=and_(body_kept, gone)
    )


def count_replayable(
    *, session: Session, filter: DeliveryFilter, named: frozenset[int] = frozenset()
) -> ReplayCount:
    """The dry run of :func:`bulk_replay`: how many rows it would queue again,
    how many it would skip because their body was dropped, and which it
    would leave out because their task was deleted before its creation
    settled (unless ``named``)."""
    selection = selected_for_replay(session=session, filter=filter, named=named)
    dropped = Delivery.body_dropped_at.is_not(None)
    replayable, bodies_dropped, task_deleted = session.execute(
        select(
            func.count().filter(selection.replayed),
            func.count().filter(dropped),
            func.count().filter(selection.left_out),
        ).where(*selection.matched)
    ).one()
    ids = session.scalars(
        select(Delivery.id)
        .where(*selection.matched, selection.left_out)
        .order_by(Delivery.id)
        .limit(MAX_NAMED)
    ).all()
    return ReplayCount(
        replayable=replayable,
        bodies_dropped=bodies_dropped,
        task_deleted=task_deleted,
        task_deleted_ids=tuple(ids),
    )


# --- the run and its history -----------------------------------------------------------


@dataclass(frozen=True)
class OperationView:
    """One operation of the history, as plain values."""

    id: int
    kind: str
    name: str
    operator: str
    #: The filter's criteria (:meth:`DeliveryFilter.criteria`), and under
    #: ``recreate`` the deliveries named to create their deleted task again.
    criteria: dict
    #: The dry run's count the operator saw, if one was given.
    expected: int | None
    #: The rows the run found to replay when it started (more, if rows came
    #: to match while it ran), and those it queued again so far.
    matched: int
    done: int
    started_at: datetime
    #: None while it runs (or if its process died: see ``error``).
    finished_at: datetime | None
    #: Why it stopped before the end; None when it ran through.
    error: str | None

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


def _view(operation: Operation) -> OperationView:
    return OperationView(
        id=operation.id,
        kind=operation.kind,
        name=operation.name,
        operator=operation.operator,
        criteria=dict(operation.criteria),
        expected=operation.expected,
        matched=operation.matched,
        done=operation.done,
        started_at=operation.started_at,
        finished_at=operation.finished_at,
        error=operation.error,
    )


def _checked(value: object, *, what: str, missing: str, limit: int) -> str:
    try:
        return clean_release_text(value, what=what, missing=missing, limit=limit)
    except InvalidRelease as error:
        raise InvalidOperation(str(error)) from None


def checked_name(name: object) -> str:
    """``name`` trimmed, if an operation may hold it; else :class:`InvalidOperation`."""
    return _checked(
        name,
        what="a bulk replay's name",
        missing="a bulk replay needs a name (the history lists it by its name)",
        limit=MAX_OPERATION_NAME_LENGTH,
    )


def _bulk_replay_request(
    filter: DeliveryFilter, named: frozenset[int], name: str, expected: int | None
) -> dict[str, Any]:
    """What makes two bulk replays the same request: the criteria, the scope,
    the name and the count the caller saw."""
    criteria: dict[str, object] = dict(filter.criteria())
    if named:
        criteria["recreate"] = sorted(named)
    scope = None if filter.workspace_ids is None else sorted(filter.workspace_ids)
    return {
        "action": idempotency.Action.BULK_REPLAY,
        "target": "deliveries" if scope is None else f"deliveries of workspaces {scope}",
        "body": {"criteria": criteria, "name": name, "expected": expected},
    }


def started_under_key(
    *,
    session: Session,
    retry: idempotency.Retry,
    filter: DeliveryFilter,
    name: str,
    expected: int | None,
    named: frozenset[int] = frozenset(),
) -> OperationView | None:
    """The bulk replay a run under ``retry``'s key started, as it stands now,
    or None; for the CLI, which counts and asks before it starts one. Raises
    ``IdempotencyKeyReused`` when the key was another request's."""
    answer = idempotency.answered_before(
        session, retry, **_bulk_replay_request(filter, checked_named(named), name, expected)
    )
    if answer is None:
        return None
    return get_operation(session=session, operation_id=int(answer["operation_id"]))


def bulk_replay(
    *,
    sessions: sessionmaker[Session],
    filter: DeliveryFilter,
    name: str,
    operator: str,
    expected: int | None,
    send: Callable[[list[int]], None],
    batch: int = 500,
    named: frozenset[int] = frozenset(),
    retry: idempotency.Retry | None = None,
) -> OperationView:
    """Queue every needs_operator and dead delivery ``filter`` matches again,
    as :func:`models.inbox.replay` does each one, and record it in the history
    under ``name`` (required: the history is read by it). What it takes is
    :func:`selected_for_replay`'s answer: a delivery whose task was deleted
    before its creation settled only when ``named`` (recorded with the
    criteria as ``recreate``).

    The operation is committed before any row changes, so a run that dies is
    still on record. Then ``batch`` rows at a time, in key order: each batch
    is replayed and committed, and only then handed to ``send`` (which
    publishes the keys). A ``send`` that raises leaves its rows queued, for
    the sweeper to send later: logged, and the run goes on. Rows stored after
    the run began, and rows behind its cursor (one replayed that failed again
    meanwhile), are left alone: each row is replayed once per run. An error
    is recorded on the operation, then raised.

    Under ``retry``'s key the operation is started once: a run again with the
    key and the same request answers the first run's operation as it stands
    now (finished, still running, or stopped by an error) and queues nothing.
    """
    name = checked_name(name)
    operator = _checked(
        operator,
        what="the operator",
        missing="a bulk replay needs the operator's name",
        limit=MAX_OPERATOR_LENGTH,
    )
    if expected is not None and expected < 0:
        raise InvalidOperation(f"the expected count cannot be negative (got {expected})")
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch must be between 1 and {MAX_BATCH}")
    statuses = bulk_statuses(filter)
    named = checked_named(named)

    request = _bulk_replay_request(filter, named, name, expected)
    with session_scope(sessions) as session:
        # The rows that exist now are this run's; one stored later is not.
        last_key = session.scalar(select(func.max(Delivery.id))) or 0
        # Computed once: the time bounds' key search need not run per batch.
        selection = selected_for_replay(session=session, filter=filter, named=named)
        conditions = [*selection.matched, selection.replayed, Delivery.id <= last_key]

        def start() -> dict[str, object]:
            matched = session.scalar(select(func.count()).where(*conditions)) or 0
            operation = Operation(
                kind=BULK_REPLAY,
                name=name,
                operator=operator,
                criteria=request["body"]["criteria"],
                scope=None if filter.workspace_ids is None else sorted(filter.workspace_ids),
                expected=expected,
                matched=matched,
                done=0,
                started_at=utcnow(),
            )
            session.add(operation)
            session.flush()
            return {"operation_id": operation.id, "matched": matched}

        started, replayed = idempotency.answered_once(session, retry, **request, work=start)
        operation_id = int(started["operation_id"])
        if replayed:
            return get_operation(session=session, operation_id=operation_id)
        matched = int(started["matched"])
    reason = f"replayed by {operator} in bulk (operation {operation_id}: {name})"

    done, cursor = 0, 0
    try:
        while True:
            with session_scope(sessions) as session:
                # Locked (PostgreSQL): a row another replay queued meanwhile
                # no longer matches, and is skipped.
                rows = session.scalars(
                    select(Delivery)
                    .where(Delivery.id > cursor, *conditions)
                    .order_by(Delivery.id)
                    .limit(batch)
                    .with_for_update()
                ).all()
                if not rows:
                    break
                for delivery in rows:
                    recreate = delivery.id in named
                    replay_delivery(
                        session=session,
                        delivery=delivery,
                        reason=(
                            f"{reason}; named to create its deleted task again"
                            if recreate
                            else reason
                        ),
                        statuses=statuses,
                        # Deleted since the selection was read: not named, so
                        # the marker stays and the worker parks it again.
                        recreate_deleted=recreate,
                    )
                keys = [delivery.id for delivery in rows]
                cursor = keys[-1]
                done += len(keys)
                matched = max(matched, done)
                session.execute(
                    update(Operation)
                    .where(Operation.id == operation_id)
                    .values(done=done, matched=matched)
                )
            # Committed: only now may a worker see them (store, commit, then enqueue).
            try:
                send(keys)
            except Exception:
                log.warning(
                    "operation %s: %d replayed deliveries (keys %d to %d) were not sent; "
                    "they stay queued and the sweeper sends them",
                    operation_id,
                    len(keys),
                    keys[0],
                    keys[-1],
                    exc_info=True,
                )
    except BaseException as error:
        with session_scope(sessions) as session:
            session.execute(
                update(Operation)
                .where(Operation.id == operation_id)
                .values(finished_at=utcnow(), error=_said(error))
            )
        raise
    with session_scope(sessions) as session:
        session.execute(
            update(Operation).where(Operation.id == operation_id).values(finished_at=utcnow())
        )
        return get_operation(session=session, operation_id=operation_id)


def _said(error: BaseException) -> str:
    """What stopped a run, for the history: the error's class and first line."""
    text = str(error).strip().splitlines()
    return (f"{type(error).__name__}: {text[0]}" if text else type(error).__name__)[:1000]


def list_operations(
    *,
    session: Session,
    limit: int = 50,
    workspace_ids: frozenset[int] | None = None,
    kinds: Iterable[str] | None = None,
) -> list[OperationView]:
    """The history, newest first; with ``workspace_ids``, only the runs that
    could reach nothing else (a run from the CLI could reach every workspace,
    so a scoped caller never sees it); with ``kinds``, only those kinds
    (``bulk-replay``, ``mark-handled``, ``console-sign-in``). The history is
    small and read rarely: the scope is checked here, not in SQL, where JSON
    differs by database."""
    if not 1 <= limit <= MAX_OPERATIONS_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_OPERATIONS_PAGE}")
    query = select(Operation).order_by(Operation.id.desc())
    if kinds is not None:
        query = query.where(Operation.kind.in_(sorted(set(kinds))))
    found = []
    for operation in session.scalars(query):
        if workspace_ids is None or (
            operation.scope is not None and set(operation.scope) <= workspace_ids
        ):
            found.append(_view(operation))
            if len(found) == limit:
                break
    return found


def get_operation(*, session: Session, operation_id: int) -> OperationView:
    """One operation; :class:`OperationNotFound` when there is none with that id."""
    operation = session.get(Operation, operation_id) if 1 <= operation_id <= MAX_ROW_ID else None
    if operation is None:
        raise OperationNotFound(operation_id)
    return _view(operation)
