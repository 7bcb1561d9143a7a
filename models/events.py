"""Task lifecycle events: a durable, per-workspace stream a client can resume.

Every event is appended in the same transaction as the change it reports, so
an event exists exactly when its change committed: ``task.created`` with the
settlement (a create that did not happen -- a Found outcome -- has none),
``task.archived``, ``task.deleted`` and ``task.identity_released`` with theirs.
Every task that was inserted has its ``task.created`` before any later event
about it: a delete or release of a task whose create never settled appends
that ``task.created`` first (docs/contract.md, "Task events").

Positions are handed out from a per-workspace counter row whose lock is held
until commit. Two appends in one workspace therefore commit in position
order, and a reader that has seen position N can never later find a
smaller one appear -- which a bare sequence (allocated at insert, visible at
commit) would not promise.

On PostgreSQL, advancing a stream also queues a notification on
:data:`EVENTS_CHANNEL` whose payload is the workspace id: PostgreSQL delivers
it when (and only if) the transaction commits, and folds identical ones of a
transaction into one, so a transaction that appends many events to one
workspace sends one. The ingress's listener (``ingest.notifications``) wakes
that workspace's open streams with it instead of their polling.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Text, cast, exists, func, select, true
from sqlalchemy.orm import Session

from models.statements import dialect_insert, insert_from_values, sql_value
from models.tables import EventStream, Task, TaskEvent, utcnow

#: The PostgreSQL channel a committed append notifies, with the workspace id.
EVENTS_CHANNEL = "taskhook_events"


class EventType(enum.StrEnum):
    CREATED = "task.created"
    ARCHIVED = "task.archived"
    DELETED = "task.deleted"
    IDENTITY_RELEASED = "task.identity_released"


def append_event(
    *,
    session: Session,
    type: EventType,
    task: Task,
    external_id: str | None = None,
    occurred_at: datetime | None = None,
) -> TaskEvent:
    """Append one event for ``task`` to its workspace's stream. The caller commits.

    ``external_id`` is the identity the event names: by default the one the
    task holds now (a release passes the one it just freed). ``occurred_at``
    defaults to now.
    """
    dialect = session.get_bind().dialect.name
    position = session.execute(advance_stream(dialect, task.workspace_id)).scalar_one()
    return session.scalars(
        event_statement(
            workspace_id=task.workspace_id,
            position=position,
            type=type.value,
            task_id=task.id,
            external_id=task.external_id if external_id is None else external_id,
            occurred_at=occurred_at or utcnow(),
        ).returning(TaskEvent)
    ).one()


# --- the append's statements -------------------------------------------------------------
#
# Each takes values or SQL expressions (bound parameters, a CTE's columns):
# append_event executes them one by one, and the worker's fast path
# (models.fastpath) runs the same statements, so the append is written once.


def advance_stream(dialect: str, workspace_id, *, by=1):
    """The next ``by`` positions of the workspace's stream (a value or an SQL
    expression), for as many events: the stream row is inserted at position
    ``by``, or advanced by ``by`` when it exists. Returns the last of the
    positions, then the workspace. The row stays locked until commit.

    On PostgreSQL the statement also notifies :data:`EVENTS_CHANNEL` with the
    workspace id (a third column, ``notified``, of no value): in the
    statement itself, so every path that appends an event notifies, and only
    at commit."""
    insert = dialect_insert(dialect)
    # WHERE true: SQLite reads an INSERT ... SELECT followed by ON CONFLICT
    # unambiguously only when the SELECT has a WHERE clause.
    first_positions = select(
        sql_value(EventStream.workspace_id, workspace_id), sql_value(EventStream.last_position, by)
    ).where(true())
    upsert = insert(EventStream).from_select(
        [EventStream.workspace_id, EventStream.last_position], first_positions
    )
    upsert = upsert.on_conflict_do_update(
        index_elements=[EventStream.workspace_id],
        set_={"last_position": EventStream.last_position + upsert.excluded.last_position},
    )
    if dialect != "postgresql":
        return upsert.returning(EventStream.last_position, EventStream.workspace_id)
    notify = func.pg_notify(EVENTS_CHANNEL, cast(EventStream.workspace_id, Text))
    return upsert.returning(
        EventStream.last_position, EventStream.workspace_id, notify.label("notified")
    )


def event_statement(*, workspace_id, position, type, task_id, external_id, occurred_at):
    """The event row at ``position`` of the workspace's stream (from
    :func:`advance_stream`, in the same transaction)."""
    values = {
        TaskEvent.workspace_id: workspace_id,
        TaskEvent.position: position,
        TaskEvent.type: type,
        TaskEvent.task_id: task_id,
        TaskEvent.external_id: external_id,
        TaskEvent.occurred_at: occurred_at,
    }
    return insert_from_values(TaskEvent, values)


def append_created_if_missing(
    *, session: Session, task: Task, external_id: str | None = None
) -> None:
    """Before a delete or a release of ``task`` (its row locked by the caller):
    append its ``task.created`` when its create never settled and so never
    appended one. ``external_id`` is the identity it was created with (by
    default the one it holds now)."""
    if task.external_id_settled_at is not None:
        return  # a settled create appended its event with the settlement
    if _has_created_event(session, task):
        return  # settled before a release cleared the stamp, or created without an identity
    # Appended late, it says when the task was created; its position says
    # where in the stream it was reported.
    append_event(
        session=session,
        type=EventType.CREATED,
        task=task,
        external_id=external_id,
        occurred_at=task.created_at,
    )


def _has_created_event(session: Session, task: Task) -> bool:
    return session.scalar(
        select(
            exists().where(
                TaskEvent.workspace_id == task.workspace_id,
                TaskEvent.task_id == task.id,
                TaskEvent.type == EventType.CREATED.value,
            )
        )
    )


def stream_position(*, session: Session, workspace_id: int) -> int:
    """The workspace's last event position so far (0 before its first event)."""
    position = session.scalar(
        select(EventStream.last_position).where(EventStream.workspace_id == workspace_id)
    )
    return position or 0


def events_after(
    *, session: Session, workspace_id: int, after: int = 0, limit: int = 100
) -> Sequence[TaskEvent]:
    """The workspace's events with positions above ``after``, oldest first."""
    return session.scalars(
        select(TaskEvent)
        .where(TaskEvent.workspace_id == workspace_id, TaskEvent.position > after)
        .order_by(TaskEvent.position)
        .limit(limit)
    ).all()
