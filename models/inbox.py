"""The durable inbox: every state change a delivery row goes through.

    queued -> processing -> done | ignored | needs_operator | dead
    replay | mismatch (stored so, never processed)

The ingress records a row (``record_delivery``) and commits it before it
enqueues anything. A worker takes a lease on the row (``claim``) and may write
the row only while that lease is the newest: every write after the claim is
fenced by the attempt number the claim returned, so a worker whose lease
expired and was taken over cannot overwrite what the newer attempt recorded
(docs/contract.md, "The inbox and the worker"). The sweeper finds rows the
broker lost or whose worker died (``sweepable``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import (
    String,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection
from sqlalchemy.exc import NoResultFound
from sqlalchemy.orm import Session, aliased
from sqlalchemy.sql import Executable

from models.errors import DeliveryNotFound, LeaseTakenOver, NotReplayable
from models.names import NameKind
from models.providers import PROVIDERS
from models.providers.drafts import UnsupportedContentType, UnsupportedPayload
from models.statements import dialect_insert
from models.tables import (
    Delivery,
    Identity,
    IdentityDelivery,
    Task,
    WebhookSource,
    sql_constant,
    utcnow,
)
from models.tasks import InsertFence, NewTask

#: ``deliveries.origin`` of a delivery its sender posted to the ingress.
WEBHOOK_ORIGIN = "webhook"


class DeliveryStatus(enum.StrEnum):
    QUEUED = "queued"
    PROCESSING = "processing"
    DONE = "done"
    IGNORED = "ignored"
    NEEDS_OPERATOR = "needs_operator"
    DEAD = "dead"
    #: The very body of an earlier delivery of its source, under another
    #: delivery id: GitHub and Jira keep a delivery's id when they send it
    #: again, so this is someone resending a captured body. Never processed.
    REPLAY = "replay"
    #: Another body under a delivery id already stored, one that is no create
    #: for its source, kept as its own record for an operator to look at;
    #: never processed (a create is kept apart too, but queued: see
    #: :func:`kept_apart`).
    MISMATCH = "mismatch"


FINISHED = frozenset(
    {
        DeliveryStatus.DONE,
        DeliveryStatus.IGNORED,
        DeliveryStatus.NEEDS_OPERATOR,
        DeliveryStatus.DEAD,
        DeliveryStatus.REPLAY,
        DeliveryStatus.MISMATCH,
    }
)
#: Finished states an operator may send back through the worker. A replay or
#: a mismatch goes through only by an operator's decision, as any other.
REPLAYABLE = frozenset(
    {
        DeliveryStatus.NEEDS_OPERATOR,
        DeliveryStatus.DEAD,
        DeliveryStatus.REPLAY,
        DeliveryStatus.MISMATCH,
    }
)
#: What a bulk replay (``models.operations``) queues again: the deliveries
#: that wait for a person after a failure whose cause the operator fixed. A
#: replay or a mismatch is a body someone resent: each is replayed on its own
#: (:func:`replay`), once the operator knows the sender is genuine.
BULK_REPLAYABLE = frozenset({DeliveryStatus.NEEDS_OPERATOR, DeliveryStatus.DEAD})


@dataclass(frozen=True)
class IncomingDelivery:
    source_id: int
    delivery_id: str
    body: bytes
    event: str
    action: str | None
    headers: Mapping[str, str]
    content_type: str | None
    hook_id: str | None = None
    #: QUEUED for work, IGNORED for an event this source does not turn into a task.
    status: DeliveryStatus = DeliveryStatus.QUEUED
    status_reason: str | None = None
    #: The hex SHA-256 of ``body``; computed when not given (the ingress has
    #: it already, and a 28 KB body is not hashed twice).
    body_sha256: str = ""
    #: The normalized external id the body names, if the ingress read one.
    external_id: str | None = None
    #: The task the body describes, validated, if the ingress read one the
    #: worker can create as it stands (``models.intake.read_delivery``).
    task: NewTask | None = None
    #: How it reached the inbox (``models.tables.Delivery.origin``).
    origin: str = WEBHOOK_ORIGIN
    #: The catch-up run that stored it; None for a webhook's.
    catchup_run_id: int | None = None
    #: The traceparent of the span storing it (``models.tracing``); None when off.
    trace_context: str | None = None
    #: The provider that reads the body (``models.providers.PROVIDERS``): how
    #: a body under a stored delivery id is compared with the stored one
    #: (:func:`same_payload`). None: read as JSON.
    provider: str | None = None

    def __post_init__(self) -> None:
        if not self.body_sha256:
            object.__setattr__(self, "body_sha256", hashlib.sha256(self.body).hexdigest())


@dataclass(frozen=True)
class Recorded:
    """What ``record_delivery`` did: ``pk`` is the inbox row's key either way."""

    pk: int
    is_new: bool
    status: DeliveryStatus
    #: A redelivery under a stored id carried a different body (not processed again).
    payload_mismatch: bool = False


def record_delivery(*, session: Session | Connection, incoming: IncomingDelivery) -> Recorded:
    """Store the delivery once per (source, delivery id). The caller commits.

    In the statements themselves (docs/reliability.md, "Hostile input"):

    - a body its source already sent under another delivery id is stored as a
      :attr:`~DeliveryStatus.REPLAY`, never processed;
    - a second delivery under a stored id with the same body is a duplicate,
      and changes nothing; so is one whose bytes differ but whose payload, as
      its provider reads it, is the same (:func:`same_payload`: a catch-up
      copy, rebuilt from the JSON the provider's log kept);
    - with another payload, it counts a mismatch on the stored row and is
      kept as its own record (:func:`kept_apart`): processed when it is a
      create, whatever the stored row was, else a
      :attr:`~DeliveryStatus.MISMATCH`. No body under a shared id can make a
      genuine create disappear.

    Which statement runs next is decided by :func:`recording_steps`; this is
    its driver on a session or a connection, and ``ingest.runtime`` has the
    one on the event loop's psycopg connections.
    """
    # The ingress's hot path: each statement built once per dialect (see
    # _insert_statement), with the row's values as parameters.
    # A Connection too: the ingress's SQLite path writes without an ORM
    # session, whose bookkeeping costs CPU on every delivery (ingest.runtime).
    bind = session.get_bind() if isinstance(session, Session) else session
    statements = _inbox_statements(bind.dialect.name)
    steps = recording_steps(incoming)
    outcome = next_step(steps, None)
    while isinstance(outcome, InboxStep):
        result = session.execute(statements[outcome.statement], outcome.parameters)
        outcome = next_step(steps, result.one_or_none() if outcome.reads_row else None)
    return outcome


class InboxStatement(enum.Enum):
    """One of the statements that store a delivery; its value names its
    :class:`InboxSQL` field."""

    #: INSERT ... ON CONFLICT DO NOTHING RETURNING (id, status): no row when
    #: the (source, delivery id) is stored already.
    INSERT = "insert"
    #: The stored row under (source, delivery id): (id, body_sha256, status).
    STORED = "stored"
    #: The body of row ``pk``, read when another body came under its delivery
    #: id: (body, content_type).
    STORED_BODY = "stored_body"
    #: One more payload mismatch on row ``pk``; returns no row.
    COUNT_MISMATCH = "count_mismatch"


@dataclass(frozen=True)
class InboxStep:
    """The statement to run next, with its parameters."""

    statement: InboxStatement
    parameters: Mapping[str, object]

    @property
    def reads_row(self) -> bool:
        """Whether the statement answers with a row (or none), to be handed back."""
        return self.statement is not InboxStatement.COUNT_MISMATCH


#: :func:`recording_steps`: it yields the statement to run, is sent the row it
#: returned (None: no row, or a statement that returns none), and returns
#: what was recorded.
RecordingSteps = Generator[InboxStep, Sequence[object] | None, Recorded]


def recording_steps(incoming: IncomingDelivery) -> RecordingSteps:
    """How ``incoming`` is stored once, decided without I/O: every driver
    (``record_delivery``, the ingress's on the event loop) runs what this
    yields and sends back its row, so a branch cannot be lost in one of them."""
    values = delivery_values(incoming)
    inserted = yield InboxStep(InboxStatement.INSERT, values)
    if inserted is not None:
        return _inserted(inserted)
    found = yield InboxStep(InboxStatement.STORED, values)
    if found is None:
        # Deleted between the two statements (the retention policy deletes old
        # finished rows: models.retention), so the id is free again.
        inserted = yield InboxStep(InboxStatement.INSERT, values)
        if inserted is not None:
            return _inserted(inserted)
        found = yield InboxStep(InboxStatement.STORED, values)
        if found is None:
            raise NoResultFound(
                f"delivery id {incoming.delivery_id!r} was stored, then gone, twice over"
            )
    stored = stored_duplicate(incoming, *found)
    if stored.payload_mismatch:
        # Other bytes may still say the same: a catch-up copy of this very
        # delivery, or the genuine one after its copy (docs/contract.md, 15.6).
        kept = yield InboxStep(InboxStatement.STORED_BODY, {"pk": stored.pk})
        if kept is not None and same_payload(incoming, *kept):
            stored = dataclasses.replace(stored, payload_mismatch=False)
    if not stored.payload_mismatch:
        return stored
    yield InboxStep(InboxStatement.COUNT_MISMATCH, {"pk": stored.pk})
    apart = yield InboxStep(InboxStatement.INSERT, delivery_values(kept_apart(incoming, stored)))
    return kept_apart_recorded(stored, apart)


def next_step(steps: RecordingSteps, row: Sequence[object] | None) -> InboxStep | Recorded:
    """Hand ``row``, what the previous step returned (None for the first), to
    ``steps``: the next step to run, or what was recorded."""
    try:
        return steps.send(row)
    except StopIteration as done:
        return done.value


def _inserted(row: Sequence[object]) -> Recorded:
    pk, status = row
    return Recorded(pk=pk, is_new=True, status=DeliveryStatus(status))


def delivery_values(incoming: IncomingDelivery) -> dict[str, object]:
    """The parameters of the inbox statements (see :class:`InboxSQL`) for ``incoming``."""
    now = utcnow()
    return {
        "source_id": incoming.source_id,
        "delivery_id": incoming.delivery_id,
        "hook_id": incoming.hook_id,
        "body": incoming.body,
        "body_sha256": incoming.body_sha256,
        "content_type": incoming.content_type,
        "event": incoming.event,
        "action": incoming.action,
        "headers": dict(incoming.headers),
        "received_at": now,
        "updated_at": now,
        "status": incoming.status.value,
        "status_reason": incoming.status_reason,
        "attempts": 0,
        "payload_mismatches": 0,
        "external_id": incoming.external_id,
        "origin": incoming.origin,
        "catchup_run_id": incoming.catchup_run_id,
        "trace_context": incoming.trace_context,
        **_draft_columns(incoming.task),
    }


def _draft_columns(task: NewTask | None) -> dict[str, str | None]:
    if task is None or task.source is None:
        return dict.fromkeys(DRAFT_COLUMNS)
    return {
        "draft_title": task.title,
        "draft_description": task.description,
        "draft_url": task.source.url,
        "draft_remote_key": task.source.remote_key,
        "draft_stable_key": task.stable_key,
    }


def stored_duplicate(
    incoming: IncomingDelivery, pk: int, body_sha256: str, status: str
) -> Recorded:
    """What a delivery under an id already stored is: the stored row answers
    (its own status), and other bytes are a payload mismatch, counted by the
    caller with the ``count_mismatch`` statement -- unless they say the same
    (:func:`same_payload`, which :func:`recording_steps` asks with the
    stored body)."""
    return Recorded(
        pk=pk,
        is_new=False,
        status=DeliveryStatus(status),
        payload_mismatch=body_sha256 != incoming.body_sha256,
    )


def same_payload(
    incoming: IncomingDelivery, stored_body: bytes, stored_content_type: str | None
) -> bool:
    """Whether ``incoming``'s body says what the stored body under its
    delivery id says, each read as its provider reads a body (JSON without
    one): the catch-up rebuilds a delivery from the JSON the provider's log
    kept, never the bytes the sender signed, in its own spacing, key order
    and escapes, and as JSON whatever the hook's content type. Compared as
    canonical JSON, so ``1``, ``1.0`` and ``true`` stay apart. A body either
    side cannot read -- one the retention policy dropped, say -- differs."""
    try:
        return _canonical(incoming.provider, incoming.content_type, incoming.body) == _canonical(
            incoming.provider, stored_content_type, stored_body
        )
    except (ValueError, RecursionError, UnsupportedContentType, UnsupportedPayload):
        return False


def _canonical(provider: str | None, content_type: str | None, body: bytes) -> str:
    payload = (
        json.loads(body)
        if provider is None
        else PROVIDERS[provider].decode_body(content_type, body)
    )
    return json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def kept_apart(incoming: IncomingDelivery, stored: Recorded) -> IncomingDelivery:
    """``incoming``, whose id is stored with another payload, as a record of
    its own: under ``<id>#<its body's sha256, 16 digits>`` (so that it, too,
    is stored once). A create for its source is queued, whatever the stored
    row was: one id may carry two creates (GitLab's ``X-Gitlab-Event-UUID``,
    shared by every event one request caused, stands in for a missing
    ``Idempotency-Key``), and the worker finds the task of an identity already
    held, so nothing is created twice. Anything else is kept as a mismatch
    for an operator (docs/contract.md, 15.6)."""
    where = (
        f"delivery id {incoming.delivery_id!r} is stored (delivery {stored.pk}) with another body"
    )
    if incoming.status is DeliveryStatus.QUEUED:
        status, reason = DeliveryStatus.QUEUED, f"{where}; a create, processed on its own record"
    else:
        status, reason = DeliveryStatus.MISMATCH, f"{where}; not processed"
    return dataclasses.replace(
        incoming,
        delivery_id=f"{incoming.delivery_id}#{incoming.body_sha256[:16]}",
        status=status,
        status_reason=reason,
    )


def kept_apart_recorded(stored: Recorded, apart: Sequence[object] | None) -> Recorded:
    """What the ingress answers for a mismatch: its own record when it is new
    (``apart``: the insert's id and status), else -- the same mismatch sent
    again -- the stored row, as a duplicate."""
    if apart is None:
        return stored
    pk, status = apart
    return Recorded(pk=pk, is_new=True, status=DeliveryStatus(status), payload_mismatch=True)


#: The task the body describes, as the ingress read it (see Delivery).
DRAFT_COLUMNS = (
    "draft_title",
    "draft_description",
    "draft_url",
    "draft_remote_key",
    "draft_stable_key",
)

_INSERTED_COLUMNS = (
    "source_id",
    "delivery_id",
    "hook_id",
    "body",
    "body_sha256",
    "content_type",
    "event",
    "action",
    "headers",
    "received_at",
    "updated_at",
    "status",
    "status_reason",
    "attempts",
    "payload_mismatches",
    "external_id",
    "origin",
    "catchup_run_id",
    "trace_context",
    *DRAFT_COLUMNS,
)


@functools.cache
def _insert_statement(dialect: str):
    """INSERT ... ON CONFLICT DO NOTHING RETURNING id on the table itself.

    Built once: an ORM ``insert(Delivery).values(...)`` per call spent more
    time building, cache-keying and running through the ORM's bulk-insert
    path than the database spent on the row (docs/performance.md).
    """
    table = Delivery.__table__
    insert = dialect_insert(dialect)
    values = {name: bindparam(name, type_=table.c[name].type) for name in _INSERTED_COLUMNS}
    # A replay: the same body from the same source under another id
    # (ix_deliveries_source_body). Decided in the insert, on what is stored,
    # looked up once: an aggregate's one row, which the row's values select
    # from.
    earlier = (
        select(func.min(table.c.id).label("id"))
        .where(
            table.c.source_id == values["source_id"],
            table.c.body_sha256 == values["body_sha256"],
            table.c.delivery_id != values["delivery_id"],
        )
        .subquery("earlier")
    )
    # ... or the body that created a task, as the identity ledger keeps it
    # past the delivery row's retention (docs/contract.md §14): on the row of
    # a name its task gave up, ...
    created = (
        select(func.min(Identity.name))
        .where(
            Identity.source_id == values["source_id"],
            Identity.body_sha256 == values["body_sha256"],
            # The external id a person reads, not the stable key beside it.
            Identity.kind == sql_constant(NameKind.EXTERNAL.value),
            Identity.delivery_id != values["delivery_id"],
        )
        .scalar_subquery()
    )
    # ... or in identity_deliveries: another delivery the worker judged for
    # an identity, or one that created a task, kept there by retention.
    judged = (
        select(func.min(IdentityDelivery.name))
        .where(
            IdentityDelivery.source_id == values["source_id"],
            IdentityDelivery.body_sha256 == values["body_sha256"],
            IdentityDelivery.delivery_id != values["delivery_id"],
        )
        .scalar_subquery()
    )
    created = func.coalesce(created, judged)
    stored_earlier = earlier.c.id.is_not(None)
    created_earlier = created.is_not(None)
    values["status"] = case(
        (or_(stored_earlier, created_earlier), sql_constant(DeliveryStatus.REPLAY.value)),
        else_=values["status"],
    )
    values["status_reason"] = case(
        (
            stored_earlier,
            sql_constant("the same body as delivery ")
            + cast(earlier.c.id, String)
            + sql_constant(" under another delivery id: a replay, never processed"),
        ),
        (
            created_earlier,
            sql_constant("the same body as the delivery that created ")
            + created
            + sql_constant(" under another delivery id: a replay, never processed"),
        ),
        else_=values["status_reason"],
    )
    row = (
        select(*(values[name] for name in _INSERTED_COLUMNS))
        .select_from(earlier)
        # SQLite parses INSERT ... SELECT ... ON CONFLICT only with a WHERE.
        .where(true())
    )
    return (
        insert(table)
        .from_select(list(_INSERTED_COLUMNS), row)
        .on_conflict_do_nothing(index_elements=[table.c.source_id, table.c.delivery_id])
        .returning(table.c.id, table.c.status)
    )


_STORED_DELIVERY = select(Delivery.id, Delivery.body_sha256, Delivery.status).where(
    Delivery.source_id == bindparam("source_id"),
    Delivery.delivery_id == bindparam("delivery_id"),
)
_STORED_BODY = select(Delivery.body, Delivery.content_type).where(Delivery.id == bindparam("pk"))
_COUNT_MISMATCH = (
    update(Delivery.__table__)
    .where(Delivery.__table__.c.id == bindparam("pk"))
    .values(payload_mismatches=Delivery.__table__.c.payload_mismatches + literal_column("1"))
)


@functools.cache
def _inbox_statements(dialect: str) -> dict[InboxStatement, Executable]:
    return {
        InboxStatement.INSERT: _insert_statement(dialect),
        InboxStatement.STORED: _STORED_DELIVERY,
        InboxStatement.STORED_BODY: _STORED_BODY,
        InboxStatement.COUNT_MISMATCH: _COUNT_MISMATCH,
    }


@dataclass(frozen=True)
class InboxSQL:
    """``record_delivery``'s statements as PostgreSQL text for psycopg, with
    ``%(name)s`` placeholders filled from :func:`delivery_values` (``pk`` for
    ``stored_body`` and ``count_mismatch``).

    For the ingress's writer on the event loop, which runs them on a bare
    psycopg connection, without a session (ingest.runtime.AsyncInbox):
    compiled from the very statements ``record_delivery`` executes, and run
    in the order :func:`recording_steps` decides, so the two paths cannot
    drift apart. The ``headers`` value goes wrapped in
    ``psycopg.types.json.Json``; everything else as it is.
    """

    insert: str
    stored: str
    stored_body: str
    count_mismatch: str

    def of(self, statement: InboxStatement) -> str:
        return getattr(self, statement.value)


@functools.cache
def postgresql_inbox_sql() -> InboxSQL:
    dialect = postgresql.psycopg.dialect()
    statements = _inbox_statements("postgresql")
    return InboxSQL(
        **{
            statement.value: str(executable.compile(dialect=dialect))
            for statement, executable in statements.items()
        }
    )


# --- the worker's side: leases and fenced writes --------------------------------


@dataclass(frozen=True)
class Lease:
    """The right to work on one delivery, until it expires or a newer attempt claims."""

    delivery_pk: int
    attempt: int
    #: The retries the delivery has spent (``deliveries.retries``, as the claim
    #: read it): its budget, which a crash and the sweeper's new message do
    #: not refill. :func:`defer` counts one more.
    retries: int = 0


def lost_attempts():
    """The attempts of a row that ended without an answer it recorded (their
    worker died, or lost its lease), since its last replay."""
    return Delivery.attempts - Delivery.answered_attempts


def claim_statement(*, delivery_pk, now, lease_until, max_lost=None):
    """The claim's UPDATE: a ``queued`` row, or a ``processing`` one whose lease
    ran out, becomes this attempt's until ``lease_until`` -- unless ``max_lost``
    of its attempts were lost already (None: no limit), which is left for
    :func:`park_lost`. The arguments are values or bound parameters: the fast
    path (``models.fastpath``) builds its claim on this one.

    A delivery of a paused source is not claimed: it stays as it is until
    its source resumes (``models.sources.pause_source``), whatever message
    was sent for it before the pause."""
    return (
        update(Delivery)
        .where(
            Delivery.id == delivery_pk,
            ~of_paused_source(),
            or_(
                Delivery.status == DeliveryStatus.QUEUED.value,
                and_(
                    Delivery.status == DeliveryStatus.PROCESSING.value,
                    Delivery.lease_expires_at <= now,
                    true() if max_lost is None else lost_attempts() < max_lost,
                ),
            ),
        )
        .values(
            status=DeliveryStatus.PROCESSING.value,
            attempts=Delivery.attempts + 1,
            lease_expires_at=lease_until,
            updated_at=now,
        )
    )


def claim(
    *, session: Session, delivery_pk: int, lease_seconds: float, max_lost: int | None = None
) -> Lease | None:
    """Take the delivery for processing, or None when it is finished, another
    worker holds an unexpired lease, or ``max_lost`` of its attempts were lost
    (:func:`park_lost`). Each claim is a new attempt number."""
    now = utcnow()
    claimed = session.execute(
        claim_statement(
            delivery_pk=delivery_pk,
            now=now,
            lease_until=now + timedelta(seconds=lease_seconds),
            max_lost=max_lost,
        )
        .returning(Delivery.attempts, Delivery.retries)
        .execution_options(synchronize_session=False)
    ).one_or_none()
    return None if claimed is None else Lease(delivery_pk, *claimed)


def fenced_update(*, delivery_pk, attempt):
    """An UPDATE of the delivery that matches only while ``attempt`` is its
    newest lease: every write after the claim goes through it."""
    return update(Delivery).where(
        Delivery.id == delivery_pk,
        Delivery.attempts == attempt,
        Delivery.status == DeliveryStatus.PROCESSING.value,
    )


def _fenced(lease: Lease):
    return fenced_update(delivery_pk=lease.delivery_pk, attempt=lease.attempt)


def finish_values(*, status, reason, now, outcome=None, task_id=None) -> dict[str, object]:
    """The columns a delivery's final record sets (values or SQL expressions)."""
    values: dict[str, object] = {
        "status": status,
        "status_reason": reason,
        "lease_expires_at": None,
        "updated_at": now,
    }
    if outcome is not None:
        values["outcome"] = outcome
    if task_id is not None:
        values["task_id"] = task_id
    return values


def finish(
    *,
    session: Session,
    lease: Lease,
    status: DeliveryStatus,
    outcome: str | None = None,
    task_id: int | None = None,
    reason: str | None = None,
    error: str | None = None,
) -> bool:
    """Record the delivery's final state. False when the lease was taken over
    (a newer attempt owns the row now, and its record stands)."""
    if status not in FINISHED:
        raise ValueError(f"{status} is not a finished state")
    values = finish_values(
        status=status.value, reason=reason, now=utcnow(), outcome=outcome, task_id=task_id
    )
    if error is not None:
        values["last_error"] = error
    rows = session.execute(
        _fenced(lease).values(**values).execution_options(synchronize_session=False)
    ).rowcount
    return rows == 1


def defer(
    *,
    session: Session,
    lease: Lease,
    until: datetime,
    error: str | None = None,
    reason: str | None = None,
) -> bool:
    """Keep the delivery in processing and hold it until ``until`` (a retry's
    countdown): neither the sweeper nor another claim takes it before then.

    The retry is counted on the row (``retries``: the lease's count plus
    this one) before its message is sent, so a worker that dies before
    sending it leaves the count where the sweeper's message finds it.
    ``reason`` says what the delivery waits for (shown to operators while it
    waits); ``error`` keeps the error that made it wait, if one did."""
    values: dict[str, object] = {
        "lease_expires_at": until,
        "retries": lease.retries + 1,
        # This attempt ended with an answer: it is not a lost one.
        "answered_attempts": Delivery.answered_attempts + 1,
        "updated_at": utcnow(),
    }
    if error is not None:
        values["last_error"] = error
    if reason is not None:
        values["status_reason"] = reason
    rows = session.execute(
        _fenced(lease).values(**values).execution_options(synchronize_session=False)
    ).rowcount
    return rows == 1


def fence_create(lease: Lease) -> InsertFence:
    """The create's fence for a delivery's attempt: in the insert's transaction,
    record the new task as this delivery's (``created_task_id``) through an
    UPDATE fenced by the lease, and raise :class:`LeaseTakenOver` when it
    matches no row, so the insert rolls back with it (docs/contract.md,
    "Fencing the create"). On PostgreSQL the UPDATE also locks the row until
    the insert commits, so no newer claim can slip in between."""

    def fence(session: Session, task: Task) -> None:
        rows = session.execute(
            _fenced(lease)
            .values(created_task_id=task.id, updated_at=utcnow())
            .execution_options(synchronize_session=False)
        ).rowcount
        if rows != 1:
            raise LeaseTakenOver(lease)

    return fence


def park_lost(*, session: Session, delivery_pk: int, max_lost: int) -> bool:
    """Park a delivery whose lease ran out with ``max_lost`` of its attempts
    lost as ``needs_operator``: a message that kills its worker (or keeps it
    past its lease) every time must not take every worker down in turn, for
    ever. Whether it did; an operator replays it once the cause is fixed."""
    now = utcnow()
    rows = session.execute(
        update(Delivery)
        .where(
            Delivery.id == delivery_pk,
            Delivery.status == DeliveryStatus.PROCESSING.value,
            Delivery.lease_expires_at <= now,
            lost_attempts() >= max_lost,
        )
        .values(
            status=DeliveryStatus.NEEDS_OPERATOR.value,
            status_reason=(
                f"{max_lost} attempts ended without an answer (the worker died on it, or "
                "ran past its lease, each time): parked so it takes no more workers down "
                "(TASKHOOK_MAX_LOST_ATTEMPTS); fix the cause, then replay it"
            ),
            lease_expires_at=None,
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    ).rowcount
    return rows == 1


# --- the sweeper and the operator ---------------------------------------------------


def of_paused_source():
    """The condition on deliveries whose source an operator paused. Its own
    alias of the sources, so that a statement which reads the sources itself
    (the fast path's claim) does not correlate it away."""
    paused = aliased(WebhookSource)
    return (
        select(paused.id)
        .where(paused.id == Delivery.source_id, paused.paused_at.is_not(None))
        .correlate_except(paused)
        .exists()
    )


def sweepable(
    *,
    session: Session,
    queued_grace_seconds: float,
    limit: int = 500,
    after: int = 0,
    source_id: int | None = None,
) -> Sequence[int]:
    """Rows to hand to the broker again: ``queued`` ones older than the grace
    period (their message was lost, or never sent because the broker was down)
    and ``processing`` ones whose lease ran out (their worker died); at most
    ``limit``, in key order, keys above ``after`` (the last key of the previous
    page). Each queued one is stamped, so the next sweep waits another grace
    period for it. A paused source's rows wait for it to resume; with
    ``source_id``, only that source's rows (a resumed source's backlog)."""
    now = utcnow()
    stale_queued = and_(
        Delivery.status == DeliveryStatus.QUEUED.value,
        Delivery.updated_at <= now - timedelta(seconds=queued_grace_seconds),
    )
    lease_expired = and_(
        Delivery.status == DeliveryStatus.PROCESSING.value,
        Delivery.lease_expires_at <= now,
    )
    of_source = true() if source_id is None else Delivery.source_id == source_id
    pks = session.scalars(
        select(Delivery.id)
        .where(
            Delivery.id > after, or_(stale_queued, lease_expired), of_source, ~of_paused_source()
        )
        .order_by(Delivery.id)
        .limit(limit)
    ).all()
    if pks:
        session.execute(
            update(Delivery)
            .where(Delivery.id.in_(pks), Delivery.status == DeliveryStatus.QUEUED.value)
            .values(updated_at=now)
            .execution_options(synchronize_session=False)
        )
    return pks


def body_dropped_note(*, received_at: datetime, dropped_at: datetime) -> str:
    """What a delivery whose body the retention policy dropped says in place of
    its body (``models.retention``): how long after it was received."""
    days = max(0, (dropped_at - received_at).days)
    return f"body dropped after {days} day{'s' if days != 1 else ''} by the retention policy"


def replay(*, session: Session, delivery_pk: int) -> Delivery:
    """Send a parked (needs_operator) or dead delivery through the worker again."""
    delivery = session.get(Delivery, delivery_pk)
    if delivery is None:
        raise DeliveryNotFound(delivery_pk)
    replay_delivery(session=session, delivery=delivery)
    session.flush()
    return delivery


def replay_delivery(
    *,
    session: Session,
    delivery: Delivery,
    reason: str = "replayed by an operator",
    statuses: frozenset[DeliveryStatus] = REPLAYABLE,
    recreate_deleted: bool = True,
) -> None:
    """Queue ``delivery`` again, as a replay does: the one per-row change of
    :func:`replay` and of a bulk replay (``models.operations``). Raises
    :class:`NotReplayable` when its body was dropped or its status is not one
    of ``statuses``. With ``recreate_deleted`` (an operator named this
    delivery), a task its create inserted that is gone is created again;
    without, the worker finds it gone and parks the delivery again. The
    caller flushes and commits."""
    refusal = replay_refusal(delivery, statuses=statuses)
    if refusal is not None:
        raise NotReplayable(refusal)
    delivery.status = DeliveryStatus.QUEUED.value
    delivery.status_reason = reason
    # A fresh retry budget: an operator replays after fixing the cause; and
    # the attempts lost so far are forgiven with it.
    delivery.retries = 0
    delivery.answered_attempts = delivery.attempts
    if (
        recreate_deleted
        and delivery.created_task_id is not None
        and session.get(Task, delivery.created_task_id) is None
    ):
        # Its task was deleted before its creation settled, and the worker
        # parked it rather than create it again: replaying is the operator's
        # word that it should be created again.
        delivery.created_task_id = None
    # A replay reads the body afresh, with the adapters as they are now: an
    # operator replays after a fix, and the fix must apply.
    for column in DRAFT_COLUMNS:
        setattr(delivery, column, None)
    delivery.lease_expires_at = None
    delivery.updated_at = utcnow()
    if recreate_deleted:
        # One delivery the operator named, having been told what it does: the
        # delivery received anew, by their decision, as the identity ledger
        # judges it (models.identities.Entrance). A bulk replay's other rows
        # keep their receipt, so none brings back what was removed since.
        delivery.replayed_at = delivery.updated_at


def replay_refusal(
    delivery: Delivery, *, statuses: frozenset[DeliveryStatus] = REPLAYABLE
) -> str | None:
    """Why ``delivery`` cannot be replayed from ``statuses``; None when it can."""
    if delivery.body_dropped_at is not None:
        note = body_dropped_note(
            received_at=delivery.received_at, dropped_at=delivery.body_dropped_at
        )
        return f"delivery {delivery.id} cannot be replayed: {note}, only its record is kept"
    if delivery.status not in statuses:
        return f"delivery {delivery.id} is {delivery.status}; {only_replayable(statuses)}"
    return None


def created_task_gone():
    """The condition on deliveries whose own create inserted a task that is
    gone: someone deleted it before that create settled, and the worker
    parked the delivery rather than undo the delete (docs/contract.md, "14.
    Fencing the create"). A replay of one creates the task again
    (:func:`replay_delivery` clears the marker), so only a person who named
    it should start one: a bulk replay leaves these out (``models.operations``)."""
    return and_(
        Delivery.created_task_id.is_not(None),
        ~select(Task.id).where(Task.id == Delivery.created_task_id).exists(),
    )


def only_replayable(statuses: frozenset[DeliveryStatus]) -> str:
    """``only dead or needs_operator deliveries can be replayed``, for ``statuses``."""
    names = sorted(statuses)
    listed = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
    return f"only {listed} deliveries can be replayed"


def of_workspaces(workspace_ids: frozenset[int] | None):
    """The condition on deliveries that keeps those of the workspaces'
    sources; None: every workspace (an empty set keeps none)."""
    if workspace_ids is None:
        return true()
    return Delivery.source_id.in_(
        select(WebhookSource.id).where(WebhookSource.workspace_id.in_(sorted(workspace_ids)))
    )


#: How much later a row may have been received than a row with a higher key
#: (see :func:`first_received_since`): a writer that waited for SQLite's lock
#: (TASKHOOK_SQLITE_BUSY_TIMEOUT_MS, 5 s by default), clocks of several
#: ingress hosts a little apart. Searches by time widen their range by it.
KEY_ORDER_SLACK = timedelta(minutes=1)


def first_received_since(*, session: Session, since: datetime) -> int | None:
    """The key of the first delivery received at or after ``since``, or None
    when none was; found without an index on ``received_at`` (there is none,
    and the ingress's insert should not pay for one), by a binary search over
    the primary key: about 31 lookups by key, whatever the inbox holds.

    Keys grow with the time a row is received: every row gets ``received_at =
    now`` in :func:`delivery_values` just before its INSERT allocates the key
    -- webhook deliveries (also the ingress's psycopg writer, which uses the
    same values) and catch-up ones alike (``worker.catchup.service`` stores
    through :func:`record_delivery`). Only a transaction that waited for a
    lock between the two, or clocks of several ingress hosts, put a row's key
    slightly out of order: callers search :data:`KEY_ORDER_SLACK` wider and
    filter on ``received_at`` exactly. Gaps (rows the retention policy
    deleted) are skipped: each probe reads the first row at or after its key.
    """
    probe = (
        select(Delivery.id, Delivery.received_at)
        .where(Delivery.id >= bindparam("at_least"))
        .order_by(Delivery.id)
        .limit(1)
    )
    low = session.scalar(select(func.min(Delivery.id)))
    high = session.scalar(select(func.max(Delivery.id)))
    if low is None or high is None:
        return None
    found = None
    # Invariant: every row below ``low`` was received before ``since``; the
    # row ``found`` (if any) was received at or after it, and none between
    # ``high`` and ``found`` exists or was received before.
    while low <= high:
        middle = (low + high) // 2
        row = session.execute(probe, {"at_least": middle}).one_or_none()
        if row is None or row.id > high:
            high = middle - 1
        elif row.received_at >= since:
            found, high = row.id, middle - 1
        else:
            low = row.id + 1
    return found


def counts_by_status(
    *, session: Session, workspace_ids: frozenset[int] | None = None
) -> dict[str, int]:
    """Deliveries by status, of the workspaces' sources (None: every workspace)."""
    rows = session.execute(
        select(Delivery.status, func.count())
        .where(of_workspaces(workspace_ids))
        .group_by(Delivery.status)
    ).all()
    return {status.value: 0 for status in DeliveryStatus} | dict(rows)


def oldest_queued_at(
    *, session: Session, workspace_ids: frozenset[int] | None = None
) -> datetime | None:
    return session.scalar(
        select(func.min(Delivery.received_at)).where(
            Delivery.status == DeliveryStatus.QUEUED.value, of_workspaces(workspace_ids)
        )
    )
