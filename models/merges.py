"""An operator's merge of two tasks that are one real item, and its undo.

A move that no event announced (a Jira site migration gives every issue new
ids) leaves two tasks for one item, and nothing in a delivery can tell. An
operator who can tell merges the second task's names into the first:

- every live name of the task merged *from* (held or archived) becomes an
  alias of the task merged *into*, in that task's state, marked with the
  merge's id;
- the task merged from gives up its external id (as a release does, so the
  create sequence's holder lookup no longer finds it) and is archived: it
  stops answering to the names, and is never deleted;
- an ``identity_merges`` row records who, why, and each name as it was, so
  :func:`unmerge` can put everything back.

The rules and their reasons: docs/contract.md §15, item 10.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from models.access import Caller
from models.errors import InvalidMerge, MergeNotFound, MergeRefused, TaskNotFound
from models.events import EventType, append_event
from models.identities import (
    IdentityState,
    LedgerRow,
    NameView,
    give_up_own_names,
    names_of,
    names_shown,
    take_back_own_names,
)
from models.names import Name, NameKind
from models.tables import Identity, IdentityMerge, Task, utcnow
from models.tasks import MAX_OPERATOR_LENGTH, MAX_RELEASE_REASON_LENGTH, clean_release_text

_LIVE = (IdentityState.HELD.value, IdentityState.ARCHIVED.value)


@dataclass(frozen=True)
class MovedName:
    """One name a merge moved, as it was before: what an undo puts back.

    Kept in ``identity_merges.names`` as ``[kind, name, state, is_alias,
    merge_id, settled_at]``: ``merge_id`` is an earlier merge that had made it
    an alias of the task merged from, ``settled_at`` (ISO text) is set on the
    name that task held as its external id -- its settlement, given back."""

    kind: str
    name: str
    state: str
    is_alias: bool
    merge_id: int | None = None
    settled_at: str | None = None

    def stored(self) -> list[Any]:
        return [self.kind, self.name, self.state, self.is_alias, self.merge_id, self.settled_at]

    @classmethod
    def read(cls, stored: list[Any]) -> MovedName:
        kind, name, state, is_alias, *rest = stored
        merge_id, settled_at = [*rest, None, None][:2]
        return cls(kind, name, state, bool(is_alias), merge_id, settled_at)


@dataclass(frozen=True)
class MergeView:
    id: int
    workspace_id: int
    into_task_id: int
    from_task_id: int
    names: list[MovedName]
    operator: str
    reason: str
    merged_at: datetime
    undone_at: datetime | None
    undone_by: str | None

    @property
    def undone(self) -> bool:
        return self.undone_at is not None


@dataclass(frozen=True)
class MergeSide:
    id: int
    identifier: str
    title: str
    external_id: str | None
    archived: bool
    names: list[NameView]


@dataclass(frozen=True)
class MergePlan:
    """What a merge would do, shown before it is done."""

    workspace_id: int
    into: MergeSide
    from_: MergeSide
    #: The names that would become ``into``'s aliases.
    moving: list[NameView]
    #: The merge would archive ``from_`` (it is not archived yet).
    archives_from: bool


def _view(merge: IdentityMerge) -> MergeView:
    return MergeView(
        id=merge.id,
        workspace_id=merge.workspace_id,
        into_task_id=merge.into_task_id,
        from_task_id=merge.from_task_id,
        names=[MovedName.read(row) for row in merge.names],
        operator=merge.operator,
        reason=merge.reason,
        merged_at=merge.merged_at,
        undone_at=merge.undone_at,
        undone_by=merge.undone_by,
    )


def _audit_text(value: object, *, what: str, missing: str, limit: int) -> str:
    return clean_release_text(value, what=what, missing=missing, limit=limit, error=InvalidMerge)


def _operator(value: object) -> str:
    return _audit_text(
        value,
        what="the operator",
        missing="a merge must name its operator",
        limit=MAX_OPERATOR_LENGTH,
    )


def _reason(value: object) -> str:
    return _audit_text(
        value,
        what="the reason",
        missing="a merge must give a reason",
        limit=MAX_RELEASE_REASON_LENGTH,
    )


def _task(session: Session, caller: Caller, task_id: object, *, lock: bool = False) -> Task:
    if type(task_id) is not int:
        raise InvalidMerge(f"a task id is a number (got {task_id!r})")
    query = select(Task).where(Task.id == task_id).execution_options(populate_existing=True)
    task = session.scalars(query.with_for_update() if lock else query).one_or_none()
    if task is None or not caller.may_access(task.workspace_id):
        raise TaskNotFound(f"task {task_id} not found")
    return task


def _live_names(session: Session, task_id: int) -> list[LedgerRow]:
    return [row for row in names_of(session, [task_id])[task_id] if row.state in _LIVE]


def _side(session: Session, task: Task) -> MergeSide:
    return MergeSide(
        id=task.id,
        identifier=task.identifier,
        title=task.title,
        external_id=task.external_id,
        archived=task.archived_at is not None,
        names=names_shown(session, [task.id])[task.id],
    )


def _checked_pair(
    session: Session, caller: Caller, into_task_id: object, from_task_id: object, *, lock: bool
) -> tuple[Task, Task, list[LedgerRow]]:
    into = _task(session, caller, into_task_id, lock=lock)
    if into_task_id == from_task_id:
        raise InvalidMerge(f"task {into.identifier} cannot be merged into itself")
    from_ = _task(session, caller, from_task_id, lock=lock)
    if into.workspace_id != from_.workspace_id:
        raise InvalidMerge(
            f"tasks {into.identifier} and {from_.identifier} are in different workspaces: "
            "only one workspace's tasks can be one item"
        )
    for task in (into, from_):
        if task.external_id is not None and task.external_id_settled_at is None:
            raise MergeRefused(
                f"task {task.identifier}'s create has not finished (it is not settled): "
                "wait for it, then merge"
            )
    moving = _live_names(session, from_.id)
    if not moving:
        raise MergeRefused(
            f"task {from_.identifier} answers to no name (created without an external id, "
            "or released): there is nothing to merge"
        )
    return into, from_, moving


def plan_merge(
    *, session: Session, caller: Caller, into_task_id: object, from_task_id: object
) -> MergePlan:
    """What :func:`merge` would do with these tasks; read-only. Refuses as it would."""
    into, from_, moving = _checked_pair(session, caller, into_task_id, from_task_id, lock=False)
    return MergePlan(
        workspace_id=into.workspace_id,
        into=_side(session, into),
        from_=_side(session, from_),
        moving=[NameView(row.kind, row.name, row.state, row.alias) for row in moving],
        archives_from=from_.archived_at is None,
    )


def merge(
    *,
    session: Session,
    caller: Caller,
    into_task_id: object,
    from_task_id: object,
    operator: object,
    reason: object,
) -> MergeView:
    """Merge the names of task ``from_task_id`` into task ``into_task_id``, audited.

    Raises :class:`InvalidMerge` (the same task, two workspaces, no operator
    or reason), :class:`TaskNotFound`, or :class:`MergeRefused` (a task whose
    create is not settled, a task merged from that answers to no name).
    """
    operator, reason = _operator(operator), _reason(reason)
    into, from_, moving = _checked_pair(session, caller, into_task_id, from_task_id, lock=True)
    now = utcnow()
    settled = from_.external_id_settled_at
    moved = [
        MovedName(
            row.kind,
            row.name,
            row.state,
            row.alias,
            row.merge_id,
            settled.isoformat()
            if settled is not None
            and row.kind == NameKind.EXTERNAL.value
            and row.name == from_.external_id
            else None,
        )
        for row in moving
    ]
    audit = IdentityMerge(
        workspace_id=into.workspace_id,
        into_task_id=into.id,
        from_task_id=from_.id,
        names=[name.stored() for name in moved],
        operator=operator,
        reason=reason,
        merged_at=now,
    )
    session.add(audit)
    session.flush()
    # Its own names move to the ledger first (its stable key leaves its row),
    # then every live name becomes an alias of the task merged into.
    give_up_own_names(
        session,
        task=from_,
        state=IdentityState.ARCHIVED if from_.archived_at is not None else IdentityState.HELD,
        external_id=from_.external_id,
        now=now,
    )
    state = IdentityState.ARCHIVED if into.archived_at is not None else IdentityState.HELD
    for row in _rows_named(session, into.workspace_id, moved).values():
        row.task_id, row.state, row.is_alias = into.id, state.value, True
        row.merge_id, row.changed_at = audit.id, now
    if from_.archived_at is None:
        from_.archived_at = from_.updated_at = now
        append_event(session=session, type=EventType.ARCHIVED, task=from_)
    # Given up as a release gives it up: the create sequence's holder lookup
    # reads tasks.external_id first, and must find the task merged into.
    from_.external_id = from_.external_id_settled_at = None
    session.flush()
    return _view(audit)


def unmerge(
    *, session: Session, caller: Caller, merge_id: object, operator: object, reason: object
) -> MergeView:
    """Undo merge ``merge_id``: its names are the task merged from's again, as
    they were, with its external id and settlement; that task is un-archived
    when the merge archived it. The audit row keeps both, with who undid it.

    Raises :class:`MergeNotFound`, :class:`InvalidMerge` (no operator or
    reason), or :class:`MergeRefused` (undone already; the task merged from
    was deleted since; a name moved on since -- released, deleted, merged
    again; or its external id is another task's now).
    """
    operator, reason = _operator(operator), _reason(reason)
    audit = _merge_row(session, caller, merge_id, lock=True)
    if audit.undone_at is not None:
        raise MergeRefused(
            f"merge {audit.id} was undone already, at {audit.undone_at:%Y-%m-%d %H:%M:%S} UTC "
            f"by {audit.undone_by}"
        )
    from_ = session.scalars(
        select(Task)
        .where(Task.id == audit.from_task_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()
    if from_ is None:
        raise MergeRefused(
            f"task {audit.from_task_id}, merged from, was deleted since: there is nothing to "
            "give its names back to"
        )
    moved = [MovedName.read(row) for row in audit.names]
    rows = _rows_named(session, audit.workspace_id, moved)
    for name in moved:
        row = rows.get((name.kind, name.name))
        if (
            row is None
            or row.task_id != audit.into_task_id
            or row.merge_id != audit.id
            or row.state not in _LIVE
        ):
            now_is = "gone" if row is None else f"task {row.task_id}'s, {row.state}"
            raise MergeRefused(
                f"{name.name!r} has moved on since merge {audit.id} (it is {now_is} now): "
                "nothing was undone"
            )
    own = next((n for n in moved if n.settled_at is not None), None)
    # Its own names before the merge (not aliases): its row holds them again.
    own_names = [Name(NameKind(n.kind), n.name) for n in moved if not n.is_alias]
    for name in own_names:
        column = Task.external_id if name.kind is NameKind.EXTERNAL else Task.stable_key
        holder = session.scalar(
            select(Task.identifier).where(
                Task.workspace_id == audit.workspace_id, column == name.value
            )
        )
        if holder is not None:
            raise MergeRefused(f"{name.value!r} is held by task {holder} now: nothing was undone")
    now = utcnow()
    # The merge archived it when it was not archived: its names were held then.
    archived_by_merge = any(n.state == IdentityState.HELD.value for n in moved)
    for name in moved:
        row = rows[(name.kind, name.name)]
        row.task_id, row.state, row.is_alias = from_.id, name.state, name.is_alias
        row.merge_id, row.changed_at = name.merge_id, now
    if own is not None:
        from_.external_id = own.name
        from_.external_id_settled_at = datetime.fromisoformat(own.settled_at)
    session.flush()
    take_back_own_names(session, task=from_, names=own_names)
    if archived_by_merge and from_.archived_at is not None:
        from_.archived_at = None
        from_.updated_at = now
    audit.undone_at, audit.undone_by = now, operator
    # identity_merges keeps one reason; the undo's follows the merge's.
    audit.reason = f"{audit.reason} | undone: {reason}"
    session.flush()
    return _view(audit)


def _rows_named(
    session: Session, workspace_id: int, names: list[MovedName]
) -> dict[tuple[str, str], Identity]:
    rows = session.scalars(
        select(Identity)
        .where(
            Identity.workspace_id == workspace_id,
            or_(*(and_(Identity.kind == n.kind, Identity.name == n.name) for n in names)),
        )
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return {(row.kind, row.name): row for row in rows}


def _merge_row(session: Session, caller: Caller, merge_id: object, *, lock: bool) -> IdentityMerge:
    if type(merge_id) is not int:
        raise MergeNotFound(merge_id)
    query = select(IdentityMerge).where(IdentityMerge.id == merge_id)
    audit = session.scalars(
        (query.with_for_update() if lock else query).execution_options(populate_existing=True)
    ).one_or_none()
    if audit is None or not caller.may_access(audit.workspace_id):
        raise MergeNotFound(merge_id)
    return audit


def get_merge(*, session: Session, caller: Caller, merge_id: object) -> MergeView:
    return _view(_merge_row(session, caller, merge_id, lock=False))


def list_merges(
    *,
    session: Session,
    caller: Caller,
    workspace_id: int | None = None,
    task_id: int | None = None,
    limit: int = 100,
) -> list[MergeView]:
    """The merges the caller may see, newest first: of a workspace, of a task
    (merged into or from), or all."""
    query = select(IdentityMerge).order_by(IdentityMerge.id.desc()).limit(limit)
    if workspace_id is not None:
        query = query.where(IdentityMerge.workspace_id == workspace_id)
    if task_id is not None:
        query = query.where(
            or_(IdentityMerge.into_task_id == task_id, IdentityMerge.from_task_id == task_id)
        )
    return [_view(row) for row in session.scalars(query) if caller.may_access(row.workspace_id)]
