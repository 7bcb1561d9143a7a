"""The create sequence's plain case in two transactions: two statements on
PostgreSQL, a few on SQLite.

The plain case is a create event for an identity nobody holds, in a
workspace whose intake step has no WIP limit, stored with the draft the
ingress read and no task from an earlier attempt. On PostgreSQL its two
statements, each its own transaction on one autocommit connection, are
composed from the very statements the general path executes one by one
(the claim and the fenced finish in ``models.inbox``; the lookup,
identifier, task insert, settlement and source link in ``models.tasks``; the
stream's next position and the event in ``models.events``), so a step is
written once. Which deliveries are the plain case is one predicate,
:func:`plain_case`, which both databases evaluate:

1. **claim and insert**: the lease, then steps 3 to 5 of the create sequence
   (docs/contract.md, "The create sequence"), with the new task's id recorded
   on the delivery as the fence (docs/contract.md, "Fencing the create");
2. **settle and finish**: steps 6 and 7, the ``task.created`` event and the
   delivery's ``done``, all or nothing.

SQLite has RETURNING but no data-modifying CTEs, so :class:`SQLiteFastPath`
runs the same statements one by one, in the same two transactions, on one
connection: SQLite has one writer at a time, and each transaction holds the
write lock from its first statement (a write) to its commit, so nothing
runs between its lookup and its insert, as nothing does inside PostgreSQL's
one statement. What it saves is half the general path's commits (each an
fsync under ``synchronous=FULL``) and its reads through the ORM: the general
path runs ~14 statements in 4 transactions.
The keys of one worker message can also share the two transactions: two
commits for the message rather than two per key. On PostgreSQL each of
the two statements takes a group's keys (a key alone is a group of one) and
writes each hot row -- the workspace's identifier sequence, its stream's
position -- once for the group; each group is one simple query the server
reads whole before it runs any of it, so no group's transaction ever waits
on its worker (:class:`FastPath` says why that matters).

Why it exists, what it hands back to the general path and when:
docs/architecture.md, "The fast path".
"""

from __future__ import annotations

import enum
import functools
import hashlib
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import errors
from psycopg import sql as psycopg_sql
from sqlalchemy import (
    Connection,
    Engine,
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal_column,
    null,
    or_,
    select,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import IntegrityError

from models.errors import LeaseTakenOver
from models.events import EventType, advance_stream, event_statement
from models.external_id import UNICODE_WHITE_SPACE
from models.identities import NAME_TAKEN, unknown_to_the_ledger
from models.inbox import DeliveryStatus, Lease, claim_statement, fenced_update, finish_values
from models.integrity import violated_unique_index
from models.tables import (
    Base,
    Delivery,
    Task,
    TaskEvent,
    WebhookSource,
    WorkflowStep,
    Workspace,
    sql_constant,
    utcnow,
)
from models.tasks import (
    MAX_DESCRIPTION_LENGTH,
    MAX_REMOTE_KEY_LENGTH,
    MAX_TITLE_LENGTH,
    SourceLink,
    advance_task_sequence,
    allocate_identifier,
    holds_identity,
    insert_task_statement,
    intake_step_query,
    link_source_statement,
    settle_statement,
    task_identifier,
)

#: A PostgreSQL regular expression for a value that is Unicode White_Space
#: only: an identity no task may be created with (docs/contract.md,
#: "Validation and normalization"). The ingress never keeps one; the claim
#: refuses one all the same, and the general path says it is dead.
_BLANK = "^[" + "".join(f"\\u{ord(c):04x}" for c in UNICODE_WHITE_SPACE) + "]*$"


@dataclass(frozen=True)
class _Statement:
    """A statement compiled once for psycopg: its text with PostgreSQL's own
    ``$n`` placeholders, their names in order, and the values of the
    constants SQLAlchemy made parameters of (a status, a length limit).

    Run on a :class:`psycopg.RawCursor`, which sends the text as it is.
    psycopg rewrites a ``%(name)s`` statement into ``$n`` on every run once
    it is longer than its cache takes (4,096 characters): the claim is, and
    that rewrite cost the worker ~5 % of its CPU per delivery
    (docs/performance.md §15)."""

    text: str
    order: tuple[str, ...]
    constants: Mapping[str, Any]

    @classmethod
    def compile(cls, statement, *, parameters: frozenset[str]) -> _Statement:
        compiled = statement.compile(
            dialect=postgresql.psycopg.dialect(paramstyle="numeric_dollar")
        )
        constants = {
            name: value for name, value in compiled.params.items() if name not in parameters
        }
        missing = parameters - compiled.params.keys()
        if missing:
            raise RuntimeError(f"parameters the statement never reads: {sorted(missing)}")
        return cls(str(compiled), tuple(compiled.positiontup or ()), constants)

    def params(self, **values: object) -> list[object]:
        """The values in the statement's order: ``values`` and the constants."""
        named = {**self.constants, **values}
        return [named[name] for name in self.order]

    def run(self, connection: psycopg.Connection, **values: object) -> list[tuple]:
        """Run it with ``values``; its rows."""
        with psycopg.RawCursor(connection) as cursor:
            return cursor.execute(self.text, self.params(**values)).fetchall()

    @functools.cached_property
    def name(self) -> str:
        """Its name as a prepared statement: from its text, so a statement
        that changes is prepared anew rather than run as it was."""
        return "taskhook_" + hashlib.sha256(self.text.encode()).hexdigest()[:16]

    def execute(self, connection: psycopg.Connection, **values: object) -> str:
        """``EXECUTE`` of it with ``values`` written as literals, to be sent in
        a simple query with others (:func:`_run_together`)."""
        literals = psycopg_sql.SQL(", ").join(map(psycopg_sql.Literal, self.params(**values)))
        return f"EXECUTE {self.name}({literals.as_string(connection)})"


#: A connection's first groups before it plans its statements anew
#: (:class:`_Prepared`); then twice as many each time.
FIRST_REPLAN = 64


@dataclass
class _Prepared:
    """The statements one connection has prepared (``PREPARE``), by name,
    and when it prepares them again.

    PostgreSQL keeps the generic plan it makes at a statement's sixth run,
    and makes it from the tables' sizes then. On a fresh database the tasks
    are a few dozen rows, every index looks as good as another, and the
    plan may find a key's task by scanning all of its workspace's tasks
    (docs/performance.md §27) -- for every group after, as they grow. A
    server that analyzes its tables makes the plan anew at each analyze;
    one that does not (autovacuum off) never would. So a connection drops
    its statements at its 64th group, its 128th, and so on: a plan made
    while the tables were small lasts until they have about doubled, at
    the cost of a handful of plannings over a connection's life."""

    names: set[str] = field(default_factory=set)
    groups: int = 0
    replan_at: int = FIRST_REPLAN

    def stale(self) -> set[str]:
        """Count a group; the names to drop before it runs, if it is time."""
        self.groups += 1
        if self.groups < self.replan_at:
            return set()
        self.replan_at *= 2
        stale, self.names = self.names, set()
        return stale


_prepared: weakref.WeakKeyDictionary[psycopg.Connection, _Prepared] = weakref.WeakKeyDictionary()


def _run_together(
    connection: psycopg.Connection,
    statement: _Statement,
    delivery_pks: Sequence[int],
    execution: str,
) -> list[tuple]:
    """A group's ``execution`` (an ``EXECUTE`` of ``statement`` for the keys
    ``delivery_pks``) after its delivery rows are locked in key order, as
    one simple query: PostgreSQL reads the whole message before it runs any
    of it and runs it as one implicit transaction, committed at its end or,
    at any error, rolled back whole (and the error raised). ``statement`` is
    prepared here first where the connection has not yet. The execution's
    rows.

    The lock comes first so that two groups sharing keys (a resend, a
    redelivery) queue on their first shared row, holding nothing the other
    waits for, instead of one taking its first key and the workspace's row
    while the other takes its second (a deadlock)."""
    keys = ", ".join(str(int(pk)) for pk in sorted(set(delivery_pks)))
    lock = (
        f"SELECT id FROM {Delivery.__tablename__} WHERE id IN ({keys})"
        " ORDER BY id FOR NO KEY UPDATE"
    )
    prepared = _prepared.setdefault(connection, _Prepared())
    with psycopg.RawCursor(connection) as cursor:
        for name in prepared.stale():
            cursor.execute(f"DEALLOCATE {name}")
        if statement.name not in prepared.names:
            cursor.execute(f"PREPARE {statement.name} AS {statement.text}")
            prepared.names.add(statement.name)
        try:
            cursor.execute(f"{lock};\n{execution}")
        except errors.InvalidSqlStatementName:
            # The session forgot it (a DISCARD ALL): nothing ran; the next
            # group prepares it again.
            prepared.names.clear()
            raise
        cursor.nextset()  # past the lock's result
        return cursor.fetchall()


def _parameter(name: str, type_=None):
    return bindparam(name, type_=type_)


def _number(value: int):
    return literal_column(str(int(value)))


def plain_case(dialect: str):
    """The plain case (docs/architecture.md, "The fast path"), stated once, in
    SQL over the delivery's row and its source's: both fast paths evaluate
    this very predicate, PostgreSQL inside its claim, SQLite in the claim's
    transaction. A draft the lengths of ``models.tasks`` refuse (kept by an
    older ingress), a blank identity, an identity a task holds (step 3's
    lookup), a limited intake step (a WIP count needs the workspace lock held
    before the count's snapshot, which one statement cannot give), a task
    from an earlier attempt, or an event the source no longer creates from:
    each goes to the general path, which says why."""
    workspace_id = WebhookSource.workspace_id
    return and_(
        Delivery.created_task_id.is_(None),
        Delivery.draft_title.is_not(None),
        Delivery.draft_url.is_not(None),
        Delivery.external_id.is_not(None),
        ~Delivery.external_id.regexp_match(sql_constant(_BLANK)),
        func.char_length(Delivery.draft_title) <= _number(MAX_TITLE_LENGTH),
        func.coalesce(func.char_length(Delivery.draft_description), _number(0))
        <= _number(MAX_DESCRIPTION_LENGTH),
        func.char_length(Delivery.draft_remote_key) <= _number(MAX_REMOTE_KEY_LENGTH),
        _creates_tasks(dialect, WebhookSource.create_events, Delivery.event),
        ~exists().where(*holds_identity(workspace_id, Delivery.external_id)),
        unknown_to_the_ledger(workspace_id, Delivery.external_id, Delivery.draft_stable_key),
        intake_step_query(workspace_id)
        .with_only_columns(WorkflowStep.wip_limit.is_(None))
        .scalar_subquery(),
    )


def _creates_tasks(dialect: str, create_events, event):
    """The source's ``create_events`` (a JSON array of strings) names ``event``:
    the one part of the plain case each database spells its own way."""
    if dialect == "postgresql":
        return cast(create_events, JSONB).has_key(event)
    named = func.json_each(create_events).table_valued("value")
    return exists(select(named.c.value).where(named.c.value == event))


def _keys(name: str):
    """A parameter that is a list of the group's values, one a key, in order.

    Read through a subquery, so that no plan knows the list's length: a
    custom plan would (its values are constants), a generic plan would not,
    their costs would then differ, and PostgreSQL would plan the whole
    statement anew at every run (~1 ms) rather than reuse its generic plan
    (docs/performance.md §26)."""
    return select(cast(_parameter(name), postgresql.ARRAY(_ARRAY_TYPES[name]))).scalar_subquery()


def _listed(*names: str):
    """The lists ``names`` side by side, a row a key, numbered ``nth`` in the
    group's order: the rows of a SELECT (:meth:`Select.select_from`), and
    the ``LIMIT`` to give it, their number.

    The limit changes no result; it is there for the planner, which would
    guess 10 rows of a list it cannot see and, with a table near empty as
    its generic plan is made (a fresh database, on a server whose analyze
    has not run), scan that table once rather than look up 10 keys --
    then keep that plan while the table grows, a group's cost growing with
    it. A limit it cannot see it takes for a tenth of its input: one row,
    looked up by its key (docs/performance.md §26)."""
    rows = (
        func.unnest(*(_keys(name) for name in names))
        .table_valued(*names, with_ordinality="nth")
        .render_derived()
    )
    return rows, func.cardinality(_keys(names[0]))


#: The element type of each list parameter (:func:`_keys`): its column's.
_ARRAY_TYPES = {
    "deliveries": Delivery.id.type,
    "tasks": Task.id.type,
    "attempts": Delivery.attempts.type,
    "external_ids": Text(),
    "providers": Text(),
    "urls": Text(),
    "remote_keys": Text(),
}


@functools.cache
def _claim_and_insert() -> _Statement:
    """One statement, one snapshot, for a group of keys (a list of one: a
    key alone). The claim decides, per key, whether it is the plain case
    (:func:`plain_case`), on the row it updates, and records the id its task
    is inserted with (drawn from the table's own sequence beforehand, one a
    key) only then; any other case goes to the general path with nothing but
    the lease written. The plain keys of each workspace then take their
    identifiers with one update of its row, numbered in the group's order,
    and their tasks are inserted together. A unique violation (a rival's
    insert after our snapshot, or two keys of the group for one name) rolls
    the whole statement back.

    One row a claimed key: its delivery first, then what :func:`_claimed`
    reads."""
    now = _parameter("now", Delivery.updated_at.type)
    keys, length = _listed("deliveries")
    # The id each key's task would have, drawn in the group's order (one a
    # key, used only by a plain one), then its names.
    drawn = (
        select(
            keys.c.deliveries.label("delivery"),
            keys.c.nth,
            func.nextval(
                func.pg_get_serial_sequence(sql_constant("tasks"), sql_constant("id"))
            ).label("id"),
        )
        .limit(length)
        .cte("drawn")
    )
    new_task = (
        select(
            drawn,
            WebhookSource.workspace_id,
            Delivery.external_id,
            Delivery.draft_stable_key,
        )
        .join_from(drawn, Delivery, Delivery.id == drawn.c.delivery)
        .join(WebhookSource, WebhookSource.id == Delivery.source_id)
        .cte("new_task")
    )
    # A key that names what an earlier key of the group names is not the
    # plain case: within one snapshot it cannot see the earlier one's task,
    # and the general path finds it (the earlier key need not be plain: the
    # general path then decides).
    earlier = new_task.alias("earlier")
    named_earlier = exists().where(
        earlier.c.workspace_id == new_task.c.workspace_id,
        or_(
            earlier.c.external_id == new_task.c.external_id,
            earlier.c.draft_stable_key == new_task.c.draft_stable_key,
        ),
        earlier.c.nth < new_task.c.nth,
    )
    claimed = (
        claim_statement(
            # Joined, not ``= ANY(keys)``: a generic plan of that combined
            # the primary key with the status index, reading the entry of
            # every queued row (docs/performance.md §26).
            delivery_pk=new_task.c.delivery,
            now=now,
            lease_until=_parameter("lease_until", Delivery.lease_expires_at.type),
            max_lost=_parameter("max_lost", Delivery.attempts.type),
        )
        .values(
            created_task_id=case(
                (and_(plain_case("postgresql"), ~named_earlier), new_task.c.id),
                else_=Delivery.created_task_id,
            )
        )
        .where(WebhookSource.id == Delivery.source_id)
        .returning(
            Delivery.id,
            Delivery.attempts,
            Delivery.retries,
            Delivery.created_task_id,
            Delivery.external_id,
            Delivery.draft_title,
            Delivery.draft_description,
            Delivery.draft_url,
            Delivery.draft_remote_key,
            Delivery.draft_stable_key,
            WebhookSource.provider,
            WebhookSource.workspace_id,
            new_task.c.nth,
            new_task.c.id.label("drawn_id"),
        )
        .cte("claimed")
    )
    plain = (
        select(
            claimed,
            func.row_number()
            .over(partition_by=claimed.c.workspace_id, order_by=claimed.c.nth)
            .label("number"),
        )
        .where(claimed.c.created_task_id == claimed.c.drawn_id)
        .cte("plain")
    )
    per_workspace = (
        select(plain.c.workspace_id, func.count().label("n"))
        .group_by(plain.c.workspace_id)
        .cte("per_workspace")
    )
    numbers = (
        advance_task_sequence(per_workspace.c.workspace_id, by=per_workspace.c.n)
        .returning(
            Workspace.id,
            Workspace.task_prefix,
            (Workspace.task_sequence - per_workspace.c.n).label("last_before"),
        )
        .cte("numbers")
    )
    numbered = (
        select(
            plain,
            task_identifier(numbers.c.task_prefix, numbers.c.last_before + plain.c.number).label(
                "identifier"
            ),
        )
        .join(numbers, numbers.c.id == plain.c.workspace_id)
        .cte("numbered")
    )
    inserted = (
        insert_task_statement(
            task_id=numbered.c.created_task_id,
            workspace_id=numbered.c.workspace_id,
            identifier=numbered.c.identifier,
            title=numbered.c.draft_title,
            description=numbered.c.draft_description,
            step_id=intake_step_query(numbered.c.workspace_id)
            .with_only_columns(WorkflowStep.id)
            .scalar_subquery(),
            external_id=numbered.c.external_id,
            stable_key=numbered.c.draft_stable_key,
            created_by_delivery=numbered.c.id,
            now=now,
        )
        .returning(Task.id, Task.identifier)
        .cte("inserted")
    )
    statement = (
        select(
            claimed.c.id,
            claimed.c.attempts,
            claimed.c.retries,
            inserted.c.id,
            inserted.c.identifier,
            claimed.c.workspace_id,
            claimed.c.external_id,
            claimed.c.provider,
            claimed.c.draft_url,
            claimed.c.draft_remote_key,
            exists().where(plain.c.id == claimed.c.id).label("marked"),
        )
        .select_from(claimed)
        .outerjoin(inserted, inserted.c.id == claimed.c.created_task_id)
    )
    return _Statement.compile(
        statement, parameters=frozenset({"deliveries", "now", "lease_until", "max_lost"})
    )


@functools.cache
def _settle_and_finish() -> _Statement:
    """Steps 6 and 7, the events and the deliveries' ``done`` for a group of
    plain keys (a list of one: a key alone), each given as its task, the
    identity it was created with, its source link, its delivery and
    attempt. Each part of a key runs only when its settlement matched its
    task's row: the event exists exactly when the create settled, and the
    delivery is done exactly then. Each workspace's stream advances once
    for its settled keys, numbered in the group's order; its row stays
    locked until this statement commits.

    One row a key, in order: whether it settled, whether it finished."""
    now = _parameter("now", Task.created_at.type)
    rows, length = _listed(*_SETTLED_KEYS)
    given = select(rows).limit(length).cte("given")
    source = (
        link_source_statement(
            "postgresql",
            task_id=given.c.tasks,
            provider=given.c.providers,
            url=given.c.urls,
            remote_key=given.c.remote_keys,
            now=now,
        )
        .returning(literal_column("1"))
        .cte("source")
    )
    settled = (
        settle_statement(task_id=given.c.tasks, external_id=given.c.external_ids, now=now)
        .returning(Task.id, Task.workspace_id, Task.external_id, given.c.nth)
        .cte("settled")
    )
    per_workspace = (
        select(settled.c.workspace_id, func.count().label("n"))
        .group_by(settled.c.workspace_id)
        .cte("per_workspace")
    )
    stream = advance_stream("postgresql", per_workspace.c.workspace_id, by=per_workspace.c.n).cte(
        "stream"
    )
    position = (
        stream.c.last_position
        - per_workspace.c.n
        + func.row_number().over(partition_by=settled.c.workspace_id, order_by=settled.c.nth)
    )
    numbered = (
        select(
            settled.c.id,
            settled.c.workspace_id,
            settled.c.external_id,
            position.label("position"),
        )
        .join(per_workspace, per_workspace.c.workspace_id == settled.c.workspace_id)
        .join(stream, stream.c.workspace_id == settled.c.workspace_id)
        .cte("numbered")
    )
    event = (
        event_statement(
            workspace_id=numbered.c.workspace_id,
            position=numbered.c.position,
            type=sql_constant(EventType.CREATED.value),
            task_id=numbered.c.id,
            external_id=numbered.c.external_id,
            occurred_at=now,
        )
        .returning(literal_column("1"))
        .cte("event")
    )
    finished = (
        fenced_update(delivery_pk=given.c.deliveries, attempt=given.c.attempts)
        .where(exists().where(settled.c.id == given.c.tasks))
        .values(
            finish_values(
                status=sql_constant(DeliveryStatus.DONE.value),
                reason=null(),
                now=now,
                outcome=sql_constant("created"),
                task_id=given.c.tasks,
            )
        )
        .returning(Delivery.id)
        .cte("finished")
    )
    statement = (
        select(
            exists().where(settled.c.id == given.c.tasks),
            exists().where(finished.c.id == given.c.deliveries),
        )
        .select_from(given)
        .order_by(given.c.nth)
        .add_cte(source, event)
    )
    return _Statement.compile(statement, parameters=frozenset({*_SETTLED_KEYS, "now"}))


#: A settled key's values, each a list parameter (:func:`_keys`), in order.
_SETTLED_KEYS = (
    "tasks",
    "external_ids",
    "providers",
    "urls",
    "remote_keys",
    "deliveries",
    "attempts",
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

    @classmethod
    def of(
        cls,
        *,
        task_id: int,
        workspace_id: int,
        identifier: str,
        external_id: str,
        delivery_pk: int,
        source: SourceLink,
    ) -> Inserted:
        """The task as its insert wrote it: what its settlement and the
        general path's completion read of it."""
        task = Task(
            id=task_id,
            workspace_id=workspace_id,
            identifier=identifier,
            external_id=external_id,
            created_by_delivery=delivery_pk,
        )
        return cls(task, source)


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
    """The two statements on one psycopg connection in autocommit mode.

    The keys of one message may share the two transactions, as on SQLite
    (:meth:`claim_and_insert_many`, :meth:`settle_and_finish_many`): every
    create in a workspace updates its row (the identifier) and holds it to
    its commit, so one key a transaction queues each create behind the one
    before's WAL flush, while a group flushes once. And each update leaves a
    version of the row that later creates walk past until a vacuum, so a
    group updates each workspace's row, and each stream's, once for all its
    keys (docs/performance.md §26). Each group is one simple query -- its
    rows locked in key order, then an ``EXECUTE`` of the statement a key
    alone runs, given the group's keys, prepared once a connection -- so
    the server runs a group's transaction from start to
    commit without waiting on its worker: a worker cut off mid-message holds
    no workspace's creates (a transaction the worker drives, statement by
    statement, would hold them until the server noticed the worker gone,
    which it cannot behind a proxy; docs/performance.md §22). Behind
    PgBouncer (``database_pooler``) no statement is prepared, and each key
    runs alone."""

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
        values = _claim_values([delivery_pk], lease_seconds=lease_seconds, max_lost=max_lost)
        with _lost_the_race():
            rows = _claim_and_insert().run(self.connection, **values)
        (claimed,) = _claims([delivery_pk], rows)
        return claimed

    def claim_and_insert_many(
        self, delivery_pks: Sequence[int], *, lease_seconds: float, max_lost: int
    ) -> list[Claimed | None]:
        """:meth:`claim_and_insert` for each key, one statement in one
        transaction (:func:`_run_together`); a key given twice is claimed
        once, and None the second time. A key that is not the plain case
        keeps its lease in it. Whatever fails (:class:`LostTheRace`, a
        database error) rolls back every key's claim and insert, then is
        raised."""
        claim = _claim_and_insert()
        values = _claim_values(delivery_pks, lease_seconds=lease_seconds, max_lost=max_lost)
        execution = claim.execute(self.connection, **values)
        with _lost_the_race():
            rows = _run_together(self.connection, claim, delivery_pks, execution)
        return _claims(delivery_pks, rows)

    def settle_and_finish(self, *, task: Task, source: SourceLink, lease: Lease) -> Settlement:
        """Steps 6 and 7, the event, and the delivery's ``done``: one transaction."""
        values = _settlement_values([Claimed(lease, Inserted(task, source))])
        try:
            (row,) = _settle_and_finish().run(self.connection, **values)
        except errors.ForeignKeyViolation:
            return Settlement.NOT_SETTLED  # the task was deleted: its source link has no row
        return _settlement(row)

    def settle_and_finish_many(self, claims: Sequence[Claimed]) -> list[Settlement] | None:
        """:meth:`settle_and_finish` for each plain case (``claimed.inserted``),
        one statement in one transaction (:func:`_run_together`). A key that
        did not settle keeps its source link, as it would alone, and is
        answered ``NOT_SETTLED``. None when a task was deleted (its source
        link has no row): the group rolled back whole, and each key settles
        alone. A database error rolls back the group and is raised."""
        settle = _settle_and_finish()
        execution = settle.execute(self.connection, **_settlement_values(claims))
        delivery_pks = [claimed.lease.delivery_pk for claimed in claims]
        try:
            rows = _run_together(self.connection, settle, delivery_pks, execution)
        except errors.ForeignKeyViolation:
            return None
        return [_settlement(row) for row in rows]


@contextmanager
def _lost_the_race() -> Iterator[None]:
    """A unique violation of a name a task holds, raised as :class:`LostTheRace`."""
    try:
        yield
    except errors.UniqueViolation as error:
        if error.diag.constraint_name not in NAME_TAKEN:
            raise
        raise LostTheRace() from error


def _claim_values(
    delivery_pks: Sequence[int], *, lease_seconds: float, max_lost: int
) -> dict[str, object]:
    now = utcnow()
    return {
        "deliveries": list(dict.fromkeys(delivery_pks)),  # each key once, in order
        "now": now,
        "lease_until": now + timedelta(seconds=lease_seconds),
        "max_lost": max_lost,
    }


def _claims(delivery_pks: Sequence[int], rows: Sequence[tuple]) -> list[Claimed | None]:
    """What the claim-and-insert statement's rows (one a claimed key, its
    delivery first) say of each key, in order."""
    claimed = {row[0]: row[1:] for row in rows}
    return [_claimed(pk, claimed.pop(pk, None)) for pk in delivery_pks]


def _claimed(delivery_pk: int, row: tuple | None) -> Claimed | None:
    """What the claim-and-insert statement's row says of ``delivery_pk``."""
    if row is None:
        return None
    attempt, retries, task_id, identifier, workspace_id, external_id = row[:6]
    provider, url, remote_key, marked = row[6:]
    lease = Lease(delivery_pk, attempt, retries)
    if marked and task_id is None:
        # Cannot happen while the claim's conditions and the insert's agree;
        # were it to, the marker names a task that does not exist, and the
        # delivery parks for an operator rather than creating twice.
        raise RuntimeError(f"delivery {delivery_pk}: claimed for a create that inserted nothing")
    if task_id is None:
        return Claimed(lease)
    inserted = Inserted.of(
        task_id=task_id,
        workspace_id=workspace_id,
        identifier=identifier,
        external_id=external_id,
        delivery_pk=delivery_pk,
        source=SourceLink(provider=provider, url=url, remote_key=remote_key),
    )
    return Claimed(lease, inserted)


def _settlement_values(claims: Sequence[Claimed]) -> dict[str, object]:
    """The settle-and-finish statement's lists (:data:`_SETTLED_KEYS`), one
    entry a plain case."""
    for claimed in claims:
        if claimed.inserted is None:
            raise ValueError(f"delivery {claimed.lease.delivery_pk}: no task to settle")
    inserted = [claimed.inserted for claimed in claims]
    return {
        "tasks": [each.task.id for each in inserted],
        "external_ids": [each.task.external_id for each in inserted],
        "providers": [each.source.provider for each in inserted],
        "urls": [each.source.url for each in inserted],
        "remote_keys": [each.source.remote_key for each in inserted],
        "deliveries": [claimed.lease.delivery_pk for claimed in claims],
        "attempts": [claimed.lease.attempt for claimed in claims],
        "now": utcnow(),
    }


def _settlement(row: tuple) -> Settlement:
    """What the settle-and-finish statement's row says."""
    settled, finished = row
    if not settled:
        return Settlement.NOT_SETTLED
    return Settlement.FINISHED if finished else Settlement.TAKEN_OVER


# --- SQLite: the same statements, one by one ------------------------------------------


@dataclass(frozen=True)
class _SQLiteStatements:
    """The plain case's statements for SQLite, built once with bound
    parameters (SQLAlchemy then compiles each once and reuses it)."""

    claim: Any
    case_facts: Any
    identifier: Any
    insert_task: Any
    mark_created: Any
    link_source: Any
    settle: Any
    stream: Any
    event: Any
    finish: Any


@functools.cache
def _sqlite_statements() -> _SQLiteStatements:
    now = _parameter("now", Delivery.updated_at.type)
    workspace = _parameter("workspace", WebhookSource.workspace_id.type)
    task = _parameter("task", Task.id.type)
    external_id = _parameter("identity", Task.external_id.type)
    fenced = fenced_update(delivery_pk=_parameter("delivery"), attempt=_parameter("attempt"))
    intake = intake_step_query(WebhookSource.workspace_id)
    return _SQLiteStatements(
        claim=claim_statement(
            delivery_pk=_parameter("delivery", Delivery.id.type),
            now=now,
            lease_until=_parameter("lease_until", Delivery.lease_expires_at.type),
            max_lost=_parameter("max_lost", Delivery.attempts.type),
        ).returning(
            Delivery.attempts,
            Delivery.retries,
            Delivery.external_id,
            Delivery.draft_title,
            Delivery.draft_description,
            Delivery.draft_url,
            Delivery.draft_remote_key,
            Delivery.draft_stable_key,
        ),
        # The plain case, step 3's lookup in it, and what its insert needs, read
        # inside the claim's write transaction: no other writer can change
        # them before the insert.
        case_facts=select(
            plain_case("sqlite").label("plain"),
            WebhookSource.workspace_id,
            WebhookSource.provider,
            intake.with_only_columns(WorkflowStep.id).scalar_subquery().label("intake_id"),
        )
        .join_from(Delivery, WebhookSource, WebhookSource.id == Delivery.source_id)
        .where(Delivery.id == _parameter("delivery", Delivery.id.type)),
        identifier=allocate_identifier(workspace),
        insert_task=insert_task_statement(
            workspace_id=workspace,
            identifier=_parameter("new_identifier", Task.identifier.type),
            title=_parameter("new_title", Task.title.type),
            description=_parameter("new_description", Task.description.type),
            step_id=_parameter("step", Task.step_id.type),
            external_id=external_id,
            stable_key=_parameter("stable_key", Task.stable_key.type),
            created_by_delivery=_parameter("delivery", Task.created_by_delivery.type),
            now=now,
        ).returning(Task.id),
        # The fence (docs/contract.md, "Fencing the create"), as
        # models.inbox.fence_create writes it on the general path.
        mark_created=fenced.values(created_task_id=task, updated_at=now),
        link_source=link_source_statement(
            "sqlite",
            task_id=task,
            provider=_parameter("link_provider"),
            url=_parameter("link_url"),
            remote_key=_parameter("link_remote_key"),
            now=now,
        ),
        settle=settle_statement(task_id=task, external_id=external_id, now=now).returning(
            Task.workspace_id
        ),
        stream=advance_stream("sqlite", workspace),
        event=event_statement(
            workspace_id=workspace,
            position=_parameter("event_position", TaskEvent.position.type),
            type=EventType.CREATED.value,
            task_id=task,
            external_id=external_id,
            occurred_at=now,
        ),
        finish=fenced.values(
            finish_values(
                status=DeliveryStatus.DONE.value,
                reason=None,
                now=now,
                outcome="created",
                task_id=task,
            )
        ),
    )


class SQLiteFastPath:
    """The plain case on one SQLite connection: the claim and the insert in
    one transaction, the settlement and the delivery's ``done`` in another.
    Each begins with a write, so it holds SQLite's write lock from its first
    statement to its commit: nothing runs between its reads and its writes.

    The keys of one worker message may share those two transactions
    (:meth:`claim_and_insert_many`, :meth:`settle_and_finish_many`): SQLite
    has one write lock for the whole file and holds it through each commit's
    fsync, so n keys commit twice instead of 2n times. Each key runs the
    one-key transaction's statements, in their order; the one-key methods are
    the group methods with a group of one. A key that fails fails its group,
    which rolls back whole, and the worker runs each key alone
    (docs/architecture.md, "The fast path"). A group's updates of its
    workspace's row and its stream's, one a key, rewrite pages its
    transaction already holds: SQLite keeps no old versions of a row, so the
    one-update-a-group statements PostgreSQL's group runs would save it
    nothing.
    """

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def claim_and_insert(
        self, delivery_pk: int, *, lease_seconds: float, max_lost: int
    ) -> Claimed | None:
        """As :meth:`FastPath.claim_and_insert`."""
        (claimed,) = self.claim_and_insert_many(
            [delivery_pk], lease_seconds=lease_seconds, max_lost=max_lost
        )
        return claimed

    def claim_and_insert_many(
        self, delivery_pks: Sequence[int], *, lease_seconds: float, max_lost: int
    ) -> list[Claimed | None]:
        """:meth:`claim_and_insert` for each key in order, all in one
        transaction. A key that is not the plain case keeps its lease in it.
        Whatever one key raises (:class:`LostTheRace`, ``LeaseTakenOver``, a
        database error) rolls back every key's claim and insert, then is raised."""
        now = utcnow()
        lease_until = now + timedelta(seconds=lease_seconds)
        connection = self.connection
        try:
            with connection.begin():
                return [
                    self._claim_and_insert(pk, now=now, lease_until=lease_until, max_lost=max_lost)
                    for pk in delivery_pks
                ]
        except IntegrityError as error:
            if violated_unique_index(error, Base.metadata) not in NAME_TAKEN:
                raise
            raise LostTheRace() from error

    def _claim_and_insert(
        self, delivery_pk: int, *, now: datetime, lease_until: datetime, max_lost: int
    ) -> Claimed | None:
        """One key's claim, lookup, insert and fence, inside the caller's transaction."""
        sql = _sqlite_statements()
        connection = self.connection
        claimed = connection.execute(
            sql.claim,
            {"delivery": delivery_pk, "now": now, "lease_until": lease_until, "max_lost": max_lost},
        ).one_or_none()
        if claimed is None:
            return None
        lease = Lease(delivery_pk, claimed.attempts, claimed.retries)
        # 3. the lookup, before any allocation (docs/contract.md, "The
        #    create sequence"), in the plain case's facts.
        facts = connection.execute(sql.case_facts, {"delivery": delivery_pk}).one()
        if not facts.plain:
            return Claimed(lease)  # the lease alone commits
        # 5. identifier, insert, and the fence in the insert's transaction.
        identifier = connection.execute(
            sql.identifier, {"workspace": facts.workspace_id}
        ).scalar_one()
        task_id = connection.execute(
            sql.insert_task,
            {
                "workspace": facts.workspace_id,
                "new_identifier": identifier,
                "new_title": claimed.draft_title,
                "new_description": claimed.draft_description,
                "step": facts.intake_id,
                "identity": claimed.external_id,
                "stable_key": claimed.draft_stable_key,
                "delivery": delivery_pk,
                "now": now,
            },
        ).scalar_one()
        marked = connection.execute(
            sql.mark_created,
            {"task": task_id, "delivery": delivery_pk, "attempt": lease.attempt, "now": now},
        ).rowcount
        if marked != 1:
            # Cannot happen: this transaction claimed the row. Were it to,
            # the insert rolls back with the lease, as the fence does.
            raise LeaseTakenOver(lease)
        inserted = Inserted.of(
            task_id=task_id,
            workspace_id=facts.workspace_id,
            identifier=identifier,
            external_id=claimed.external_id,
            delivery_pk=delivery_pk,
            source=SourceLink(
                provider=facts.provider, url=claimed.draft_url, remote_key=claimed.draft_remote_key
            ),
        )
        return Claimed(lease, inserted)

    def settle_and_finish(self, *, task: Task, source: SourceLink, lease: Lease) -> Settlement:
        """As :meth:`FastPath.settle_and_finish`: steps 6 and 7, the event and
        the delivery's ``done``, one transaction."""
        settled = self.settle_and_finish_many([Claimed(lease, Inserted(task, source))])
        return Settlement.NOT_SETTLED if settled is None else settled[0]

    def settle_and_finish_many(self, claims: Sequence[Claimed]) -> list[Settlement] | None:
        """:meth:`settle_and_finish` for each plain case (``claimed.inserted``)
        in order, all in one transaction. None when any of them would not
        settle: a key's source link must not stay without its settlement, so
        the whole group rolls back, and each key settles alone. A key whose
        lease was taken over (``TAKEN_OVER``) still settled, and commits with
        the others. A database error rolls back the group and is raised."""
        now = utcnow()
        try:
            with self.connection.begin() as transaction:
                settlements = []
                for claimed in claims:
                    settlement = self._settle_and_finish(claimed, now=now)
                    if settlement is Settlement.NOT_SETTLED:
                        transaction.rollback()
                        return None
                    settlements.append(settlement)
        except IntegrityError:
            return None  # a task was deleted: its source link has no row
        return settlements

    def _settle_and_finish(self, claimed: Claimed, *, now: datetime) -> Settlement:
        """One key's settlement, event and record, inside the caller's
        transaction; on NOT_SETTLED the caller rolls back its link row."""
        sql = _sqlite_statements()
        connection = self.connection
        if claimed.inserted is None:
            raise ValueError(f"delivery {claimed.lease.delivery_pk}: no task to settle")
        task, source = claimed.inserted.task, claimed.inserted.source
        values = {
            "task": task.id,
            "identity": task.external_id,
            "delivery": claimed.lease.delivery_pk,
            "attempt": claimed.lease.attempt,
            "now": now,
        }
        # 6. the source link; 7. the settlement, only on the task that still
        #    holds the identity it was created with.
        connection.execute(
            sql.link_source,
            {
                **values,
                "link_provider": source.provider,
                "link_url": source.url,
                "link_remote_key": source.remote_key,
            },
        )
        settled = connection.execute(sql.settle, values).one_or_none()
        if settled is None:
            return Settlement.NOT_SETTLED
        # The event commits with the settlement, in the workspace's stream.
        position, workspace_id = connection.execute(
            sql.stream, {"workspace": settled.workspace_id}
        ).one()
        connection.execute(
            sql.event, {**values, "workspace": workspace_id, "event_position": position}
        )
        finished = connection.execute(sql.finish, values).rowcount
        return Settlement.FINISHED if finished == 1 else Settlement.TAKEN_OVER


@contextmanager
def fast_path(engine: Engine) -> Iterator[FastPath | SQLiteFastPath | None]:
    """A fast path on a connection from ``engine``'s pool: :class:`FastPath`
    on PostgreSQL, :class:`SQLiteFastPath` on SQLite, None on anything else.

    On PostgreSQL the connection is switched to autocommit for the delivery and back before
    it returns to the pool. One that broke (the server went away) is
    invalidated, so the pool does not hand it out again.
    """
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            yield SQLiteFastPath(connection)
        return
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
