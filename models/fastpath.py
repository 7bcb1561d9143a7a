"""The create sequence's plain case on PostgreSQL, in two statements.

The plain case is a create event for an identity nobody holds, in a
workspace whose intake step has no WIP limit, stored with the draft the
ingress read and no task from an earlier attempt. Its two statements, each
its own transaction on one autocommit connection, are composed from the
very statements the general path executes one by one (the claim and the
fenced finish in ``models.inbox``, the lookup, identifier, settlement and
source link in ``models.tasks``, the stream's next position in
``models.events``), so a step is written once:

1. **claim and insert**: the lease, then steps 3 to 5 of the create sequence
   (docs/contract.md, "The create sequence"), with the new task's id recorded
   on the delivery as the fence (docs/contract.md, "Fencing the create");
2. **settle and finish**: steps 6 and 7, the ``task.created`` event and the
   delivery's ``done``, all or nothing.

Why it exists, what it hands back to the general path and when:
docs/architecture.md, "The fast path".
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import errors
from sqlalchemy import (
    Engine,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    insert,
    literal_column,
    null,
    select,
    true,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB

from models.events import EventType, advance_stream
from models.external_id import UNICODE_WHITE_SPACE
from models.inbox import DeliveryStatus, Lease, claim_statement, fenced_update, finish_values
from models.tables import (
    EXTERNAL_ID_INDEX,
    Delivery,
    EventStream,
    Task,
    TaskEvent,
    WebhookSource,
    WorkflowStep,
    sql_constant,
    utcnow,
)
from models.tasks import (
    MAX_DESCRIPTION_LENGTH,
    MAX_REMOTE_KEY_LENGTH,
    MAX_TITLE_LENGTH,
    SourceLink,
    allocate_identifier,
    holds_identity,
    intake_step_query,
    link_source_statement,
    settle_statement,
)

#: A PostgreSQL regular expression for a value that is Unicode White_Space
#: only: an identity no task may be created with (docs/contract.md,
#: "Validation and normalization"). The ingress never keeps one; the claim
#: refuses one all the same, and the general path says it is dead.
_BLANK = "^[" + "".join(f"\\u{ord(c):04x}" for c in UNICODE_WHITE_SPACE) + "]*$"


@dataclass(frozen=True)
class _Statement:
    """A statement compiled once for psycopg: its text, and the values of the
    constants SQLAlchemy made parameters of (a status, a length limit)."""

    text: str
    constants: Mapping[str, Any]

    @classmethod
    def compile(cls, statement, *, parameters: frozenset[str]) -> _Statement:
        compiled = statement.compile(dialect=postgresql.psycopg.dialect())
        constants = {
            name: value for name, value in compiled.params.items() if name not in parameters
        }
        missing = parameters - compiled.params.keys()
        if missing:
            raise RuntimeError(f"parameters the statement never reads: {sorted(missing)}")
        return cls(str(compiled), constants)

    def params(self, **values: object) -> dict[str, object]:
        return {**self.constants, **values}


def _parameter(name: str, type_=None):
    return bindparam(name, type_=type_)


def _number(value: int):
    return literal_column(str(int(value)))


@functools.cache
def _claim_and_insert() -> _Statement:
    """One statement, one snapshot. The claim decides whether this is the plain
    case, on the row it updates, and records the id the task is inserted with
    (drawn from the table's own sequence beforehand) only then. A draft the
    lengths of ``models.tasks`` refuse (kept by an older ingress), a limited
    intake step (a WIP count needs the workspace lock held before the count's
    snapshot, which one statement cannot give) or any other case goes to the
    general path with nothing but the lease written. A unique violation (a
    rival's insert after our snapshot) rolls the whole statement back."""
    delivery = _parameter("delivery", Delivery.id.type)
    now = _parameter("now", Delivery.updated_at.type)
    new_task = select(
        func.nextval(func.pg_get_serial_sequence(sql_constant("tasks"), sql_constant("id"))).label(
            "id"
        )
    ).cte("new_task")
    workspace_id = WebhookSource.workspace_id
    plain_case = and_(
        Delivery.created_task_id.is_(None),
        Delivery.draft_title.is_not(None),
        Delivery.external_id.is_not(None),
        ~Delivery.external_id.regexp_match(sql_constant(_BLANK)),
        func.char_length(Delivery.draft_title) <= _number(MAX_TITLE_LENGTH),
        func.coalesce(func.char_length(Delivery.draft_description), _number(0))
        <= _number(MAX_DESCRIPTION_LENGTH),
        func.char_length(Delivery.draft_remote_key) <= _number(MAX_REMOTE_KEY_LENGTH),
        cast(WebhookSource.create_events, JSONB).has_key(Delivery.event),
        ~exists().where(*holds_identity(workspace_id, Delivery.external_id)),
        intake_step_query(workspace_id)
        .with_only_columns(WorkflowStep.wip_limit.is_(None))
        .scalar_subquery(),
    )
    claimed = (
        claim_statement(
            delivery_pk=delivery,
            now=now,
            lease_until=_parameter("lease_until", Delivery.lease_expires_at.type),
            max_lost=_parameter("max_lost", Delivery.attempts.type),
        )
        .values(
            created_task_id=case(
                (plain_case, select(new_task.c.id).scalar_subquery()),
                else_=Delivery.created_task_id,
            )
        )
        .where(WebhookSource.id == Delivery.source_id)
        .returning(
            Delivery.attempts,
            Delivery.retries,
            Delivery.created_task_id,
            Delivery.external_id,
            Delivery.draft_title,
            Delivery.draft_description,
            Delivery.draft_url,
            Delivery.draft_remote_key,
            WebhookSource.provider,
            workspace_id,
        )
        .cte("claimed")
    )
    plain = select(*claimed.c).where(claimed.c.created_task_id == new_task.c.id).cte("plain")
    intake = (
        intake_step_query(plain.c.workspace_id).with_only_columns(WorkflowStep.id).cte("intake")
    )
    number = allocate_identifier(plain.c.workspace_id).cte("number")
    inserted = (
        insert(Task)
        .from_select(
            [
                Task.id,
                Task.workspace_id,
                Task.identifier,
                Task.title,
                Task.description,
                Task.step_id,
                Task.external_id,
                Task.created_by_delivery,
                Task.created_at,
                Task.updated_at,
            ],
            select(
                plain.c.created_task_id,
                plain.c.workspace_id,
                number.c.identifier,
                plain.c.draft_title,
                plain.c.draft_description,
                intake.c.id,
                plain.c.external_id,
                delivery,
                now,
                now,
            ),
        )
        .returning(Task.id, Task.identifier)
        .cte("inserted")
    )
    statement = select(
        claimed.c.attempts,
        claimed.c.retries,
        inserted.c.id,
        inserted.c.identifier,
        claimed.c.workspace_id,
        claimed.c.external_id,
        claimed.c.provider,
        claimed.c.draft_url,
        claimed.c.draft_remote_key,
        exists(select(plain.c.created_task_id)).label("marked"),
    ).select_from(claimed.outerjoin(inserted, true()))
    return _Statement.compile(
        statement, parameters=frozenset({"delivery", "now", "lease_until", "max_lost"})
    )


@functools.cache
def _settle_and_finish() -> _Statement:
    """Each part runs only when the settlement matched one row: the event
    exists exactly when the create settled, and the delivery is done exactly
    then. The stream row stays locked until this statement commits."""
    task = _parameter("task", Task.id.type)
    external_id = _parameter("external_id", Task.external_id.type)
    now = _parameter("now", Task.created_at.type)
    source = (
        link_source_statement(
            "postgresql",
            task_id=task,
            provider=_parameter("provider"),
            url=_parameter("url"),
            remote_key=_parameter("remote_key"),
            now=now,
        )
        .returning(literal_column("1"))
        .cte("source")
    )
    settled = (
        settle_statement(task_id=task, external_id=external_id, now=now)
        .returning(Task.workspace_id)
        .cte("settled")
    )
    stream = advance_stream(
        postgresql.insert(EventStream).from_select(
            [EventStream.workspace_id, EventStream.last_position],
            select(settled.c.workspace_id, _number(1)),
        )
    ).cte("stream")
    event = (
        insert(TaskEvent)
        .from_select(
            [
                TaskEvent.workspace_id,
                TaskEvent.position,
                TaskEvent.type,
                TaskEvent.task_id,
                TaskEvent.external_id,
                TaskEvent.occurred_at,
            ],
            select(
                stream.c.workspace_id,
                stream.c.last_position,
                sql_constant(EventType.CREATED.value),
                task,
                external_id,
                now,
            ),
        )
        .returning(literal_column("1"))
        .cte("event")
    )
    settled_one = exists(select(settled.c.workspace_id))
    finished = (
        fenced_update(delivery_pk=_parameter("delivery"), attempt=_parameter("attempt"))
        .where(settled_one)
        .values(
            finish_values(
                status=sql_constant(DeliveryStatus.DONE.value),
                reason=null(),
                now=now,
                outcome=sql_constant("created"),
                task_id=task,
            )
        )
        .returning(Delivery.id)
        .cte("finished")
    )
    statement = select(settled_one, exists(select(finished.c.id))).add_cte(source, event)
    return _Statement.compile(
        statement,
        parameters=frozenset(
            {"task", "external_id", "provider", "url", "remote_key", "delivery", "attempt", "now"}
        ),
    )


class LostTheRace(Exception):
    """Another create won the unique index between the lookup and the insert.
    Nothing was written, not even the claim: the general path's lookup finds
    the winner."""


@dataclass(frozen=True)
class Inserted:
    """The plain case's committed, unsettled task row (not in any session) and
    the source link its settlement writes."""

    task: Task
    source: SourceLink


@dataclass(frozen=True)
class Claimed:
    """A committed lease and, in the plain case, the task inserted with it."""

    lease: Lease
    #: None: not the plain case, only the lease was written.
    inserted: Inserted | None = None


class Settlement(enum.Enum):
    #: Settled, event appended, delivery done: the create is complete.
    FINISHED = "finished"
    #: Settled, but the lease was taken over: the newer attempt records the delivery.
    TAKEN_OVER = "taken_over"
    #: Nothing settled: the task was deleted or its identity released meanwhile,
    #: or a concurrent completion of the same create settled it first.
    NOT_SETTLED = "not_settled"


class FastPath:
    """The two statements on one psycopg connection in autocommit mode."""

    def __init__(self, connection: psycopg.Connection) -> None:
        self.connection = connection

    def claim_and_insert(
        self, delivery_pk: int, *, lease_seconds: float, max_lost: int
    ) -> Claimed | None:
        """Take the lease (a new attempt) and, in the plain case, insert the task;
        None when the delivery is finished, another worker holds it, or
        ``max_lost`` of its attempts were lost (``models.inbox.park_lost``).

        Raises :class:`LostTheRace` when a rival create won the unique index.
        """
        now = utcnow()
        statement = _claim_and_insert()
        params = statement.params(
            delivery=delivery_pk,
            now=now,
            lease_until=now + timedelta(seconds=lease_seconds),
            max_lost=max_lost,
        )
        try:
            row = self.connection.execute(statement.text, params).fetchone()
        except errors.UniqueViolation as error:
            if error.diag.constraint_name != EXTERNAL_ID_INDEX:
                raise
            raise LostTheRace() from error
        if row is None:
            return None
        attempt, retries, task_id, identifier, workspace_id, external_id = row[:6]
        provider, url, remote_key, marked = row[6:]
        lease = Lease(delivery_pk, attempt, retries)
        if marked and task_id is None:
            # Cannot happen while the claim's conditions and the insert's agree;
            # were it to, the marker names a task that does not exist, and the
            # delivery parks for an operator rather than creating twice.
            raise RuntimeError(
                f"delivery {delivery_pk}: claimed for a create that inserted nothing"
            )
        if task_id is None:
            return Claimed(lease)
        task = Task(
            id=task_id,
            workspace_id=workspace_id,
            identifier=identifier,
            external_id=external_id,
            created_by_delivery=delivery_pk,
        )
        source = SourceLink(provider=provider, url=url, remote_key=remote_key)
        return Claimed(lease, Inserted(task, source))

    def settle_and_finish(self, *, task: Task, source: SourceLink, lease: Lease) -> Settlement:
        """Steps 6 and 7, the event, and the delivery's ``done``: one transaction."""
        statement = _settle_and_finish()
        params = statement.params(
            task=task.id,
            external_id=task.external_id,
            provider=source.provider,
            url=source.url,
            remote_key=source.remote_key,
            delivery=lease.delivery_pk,
            attempt=lease.attempt,
            now=utcnow(),
        )
        try:
            settled, finished = self.connection.execute(statement.text, params).fetchone()
        except errors.ForeignKeyViolation:
            return Settlement.NOT_SETTLED  # the task was deleted: its source link has no row
        if not settled:
            return Settlement.NOT_SETTLED
        return Settlement.FINISHED if finished else Settlement.TAKEN_OVER


@contextmanager
def fast_path(engine: Engine) -> Iterator[FastPath | None]:
    """A FastPath on a connection from ``engine``'s pool; None for SQLite,
    where a commit costs no network round trip and the general path runs.

    The connection is switched to autocommit for the delivery and back before
    it returns to the pool. One that broke (the server went away) is
    invalidated, so the pool does not hand it out again.
    """
    if engine.dialect.name != "postgresql":
        yield None
        return
    pooled = engine.raw_connection()
    connection: psycopg.Connection = pooled.driver_connection
    try:
        connection.autocommit = True
        yield FastPath(connection)
    finally:
        if connection.broken or connection.closed:
            pooled.invalidate()
        else:
            connection.autocommit = False
        pooled.close()
