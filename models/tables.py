"""The task store's tables. Alembic migrations in ``migrations/`` create them;
a test proves the migrations and these declarations agree on both databases."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    literal_column,
    text,
    true,
)
from sqlalchemy import Identity as IdentityColumn
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from models.sealing import SealedText

# Named constraints, so migrations and error handling can refer to them by name.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uniq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: The one unique index whose violation means "another create holds this identity".
EXTERNAL_ID_INDEX = "uniq_tasks_external_id"
#: The tasks' stable-key index: one task per provider's stable key, as per external id.
STABLE_KEY_INDEX = "uniq_tasks_stable_key"

#: The largest key a table holds: every id is an INTEGER column, 32 bits on
#: PostgreSQL. A larger number names no row, on either database; passed on, it
#: would overflow in the driver (SQLite) or be refused by the server.
MAX_ROW_ID = 2**31 - 1


def utcnow() -> datetime:
    return datetime.now(UTC)


def sql_constant(text: str):
    """``text`` written into a statement, not a parameter: the statements
    compiled once for psycopg (``models.inbox.InboxSQL``, ``models.fastpath``)
    take their parameters by name, and an anonymous one would go unfilled."""
    if "'" in text:
        raise ValueError(f"a quote in an SQL constant: {text!r}")
    return literal_column(f"'{text}'", String)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that always comes back timezone-aware in UTC.

    PostgreSQL keeps ``timestamptz``; SQLite has no timezone type and would
    hand back naive values, so they are stored and read as UTC here.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# Byte-exact comparison on both dialects: SQLite's default collation is
# BINARY; PostgreSQL's column must say "C", or it follows the database's
# collation (possibly non-deterministic) and the partial index cannot serve
# an `external_id = $1` lookup (docs/contract.md, "Data model").
ExternalIdText = Text().with_variant(Text(collation="C"), "postgresql")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar = {datetime: UTCDateTime()}


class Workspace(Base):
    __tablename__ = "workspaces"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slug: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    task_prefix: Mapped[str] = mapped_column(String(16))
    # The last identifier number handed out; only a create that inserts a task
    # advances it, so a deduplicated create never burns a number.
    task_sequence: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: Only an operator token may delete the workspace's tasks
    #: (``taskhook workspace deletes``); off, a member token may too.
    deletes_need_operator: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=text("false")
    )


class WorkflowStep(Base):
    __tablename__ = "workflow_steps"
    __table_args__ = (UniqueConstraint("workspace_id", "position"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    # The step with the lowest position is the workspace's intake step.
    position: Mapped[int] = mapped_column(Integer)
    wip_limit: Mapped[int | None] = mapped_column(Integer)


class Task(Base):
    __tablename__ = "tasks"
    __table_args__ = (
        UniqueConstraint("workspace_id", "identifier"),
        Index(
            EXTERNAL_ID_INDEX,
            "workspace_id",
            "external_id",
            unique=True,
            postgresql_where=text("external_id IS NOT NULL"),
            sqlite_where=text("external_id IS NOT NULL"),
        ),
        Index(
            STABLE_KEY_INDEX,
            "workspace_id",
            "stable_key",
            unique=True,
            postgresql_where=text("stable_key IS NOT NULL"),
            sqlite_where=text("stable_key IS NOT NULL"),
        ),
        Index("ix_tasks_step_id", "step_id"),
        # Never reuse a deleted task's id: clients and the audit trail keep ids.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    identifier: Mapped[str] = mapped_column(String(40))
    title: Mapped[str] = mapped_column(String(500))
    description: Mapped[str | None] = mapped_column(Text)
    step_id: Mapped[int] = mapped_column(ForeignKey("workflow_steps.id"))
    archived_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Set explicitly by edits; settle and release leave it alone ("changes nothing else").
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    external_id: Mapped[str | None] = mapped_column(ExternalIdText)
    # NULL while the create that claimed external_id has not finished its
    # required synchronous work (it may still be running, or it died).
    external_id_settled_at: Mapped[datetime | None]
    #: The inbox delivery whose create inserted this task, if one did: only
    #: that delivery may finish this task's create after a crash.
    created_by_delivery: Mapped[int | None] = mapped_column(Integer)
    #: The provider's stable key of the item (models/names.py), held as the
    #: external id is: one of the task's own names, which the identity ledger
    #: reads here while the task holds them (models/identities.py).
    stable_key: Mapped[str | None] = mapped_column(ExternalIdText)


class TaskSource(Base):
    """Where a task came from: the GitHub or Jira item behind it.

    Written by the create's required synchronous post-create step; one row per
    task, so writing it again is a no-op.
    """

    __tablename__ = "task_sources"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), unique=True)
    provider: Mapped[str] = mapped_column(String(32))
    url: Mapped[str] = mapped_column(Text)
    remote_key: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class IdentityRelease(Base):
    """The audit row of one operator release of an external identity.

    ``task_id`` is deliberately not a foreign key: the audit trail outlives a
    task that is deleted after its identity was released.
    """

    __tablename__ = "identity_releases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    external_id: Mapped[str] = mapped_column(ExternalIdText)
    #: The task released: the holder when the release ran.
    task_id: Mapped[int] = mapped_column(Integer)
    #: The holder the operator was shown and meant to release, when the
    #: request named one (the CLI always does): equal to ``task_id``, since a
    #: release whose holder changed releases nothing.
    expected_task_id: Mapped[int | None] = mapped_column(Integer)
    operator: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    released_at: Mapped[datetime] = mapped_column(default=utcnow)


class TaskDeletion(Base):
    """The audit row of one task's delete: who deleted it, when, and the
    identity the delete freed (models.tasks.delete_task writes it in the
    delete's own transaction).

    ``task_id`` is deliberately not a foreign key: the row is about a task
    that is gone.
    """

    __tablename__ = "task_deletions"
    __table_args__ = (Index("ix_task_deletions_task_id", "task_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    task_id: Mapped[int] = mapped_column(Integer)
    #: The task's identifier (``ACME-12``), kept since its row is gone.
    identifier: Mapped[str] = mapped_column(String(40))
    #: The identity the delete freed; None for a task that held none (a
    #: REST create without one, or one whose identity was released before).
    external_id: Mapped[str | None] = mapped_column(ExternalIdText)
    #: Who deleted it: the token's name.
    operator: Mapped[str] = mapped_column(String(200))
    #: The token's role (``member`` or ``operator``).
    role: Mapped[str] = mapped_column(String(16))
    deleted_at: Mapped[datetime] = mapped_column(default=utcnow)


class Identity(Base):
    """One name a workspace's task was known by, and what became of it: the
    identity ledger (models/identities.py, docs/contract.md §15, "The
    identity ledger").

    A row per name that is not a live task's own: an alias (a move's, a
    merge's), or a name whose task was deleted or released. A task's own
    names -- ``tasks.external_id`` and ``tasks.stable_key`` -- are read from
    its row while it holds them, and written here when it gives them up, so
    a plain create writes no ledger row. Never per delivery, and kept for as
    long as the workspace: delivery retention never touches it. ``task_id`` is
    deliberately not a foreign key: the row outlives a deleted task, which is
    the point.
    """

    __tablename__ = "identities"
    __table_args__ = (
        Index("ix_identities_task_id", "task_id"),
        # The ingress's replay check after retention: the body that created it.
        Index("ix_identities_source_body", "source_id", "body_sha256"),
    )

    workspace_id: Mapped[int] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    #: ``external`` (an external id) or ``stable`` (a provider's stable key).
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(ExternalIdText, primary_key=True)
    task_id: Mapped[int] = mapped_column(Integer)
    #: held | archived | deleted | released (models.identities.IdentityState)
    state: Mapped[str] = mapped_column(String(16))
    #: True for a name the task was not created under (a move's, a merge's).
    is_alias: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    #: The delivery that created the task (source and the sender's delivery
    #: id, and its body's SHA-256): kept here past the delivery row's retention,
    #: so that delivery never creates again, nor its body under another id.
    source_id: Mapped[int | None] = mapped_column(Integer)
    delivery_id: Mapped[str | None] = mapped_column(ExternalIdText)
    body_sha256: Mapped[str | None] = mapped_column(String(64))
    #: The operator merge that made this name an alias (identity_merges.id).
    merge_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: When ``state`` last changed: a delivery received before a release or a
    #: delete is judged by it.
    changed_at: Mapped[datetime] = mapped_column(default=utcnow)


class IdentityDelivery(Base):
    """A delivery the worker judged for an identity (it created, was Found or
    was turned away), kept past the inbox row's retention: a redelivery of it
    after pruning is judged by when it first came in, and its body under
    another id is still a replay (models/identities.py, docs/contract.md §15).

    The fast path writes none: it only ever creates a name the ledger does
    not know, and the ledger's row keeps that creator. One row per such
    delivery, no body: a few per item.
    """

    __tablename__ = "identity_deliveries"
    __table_args__ = (Index("ix_identity_deliveries_source_body", "source_id", "body_sha256"),)

    source_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_sources.id", ondelete="CASCADE"), primary_key=True
    )
    delivery_id: Mapped[str] = mapped_column(ExternalIdText, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    #: The external id the delivery named.
    name: Mapped[str] = mapped_column(ExternalIdText)
    body_sha256: Mapped[str] = mapped_column(String(64))
    #: When it first came in (its first inbox row's ``received_at``).
    received_at: Mapped[datetime]
    #: It created a task of the identity (one since removed).
    created: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))


class IdentityPrefix(Base):
    """A repository renamed or transferred: every external id beginning with
    ``before`` is now the one beginning with ``after`` (models/identities.py)."""

    __tablename__ = "identity_prefixes"

    workspace_id: Mapped[int] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    after: Mapped[str] = mapped_column(ExternalIdText, primary_key=True)
    before: Mapped[str] = mapped_column(ExternalIdText)
    learned_at: Mapped[datetime] = mapped_column(default=utcnow)


class IdentityMerge(Base):
    """An operator's merge of one task's names into another's, audited and undoable."""

    __tablename__ = "identity_merges"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    #: The task that keeps its names and gains the other's.
    into_task_id: Mapped[int] = mapped_column(Integer)
    #: The task whose names became aliases (archived by the merge).
    from_task_id: Mapped[int] = mapped_column(Integer)
    #: The names moved, as ``[[kind, name, state, is_alias, merge_id, settled_at], ...]``,
    #: each as it was: what an undo puts back (models.merges.MovedName).
    names: Mapped[list[list[object]]] = mapped_column(JSON)
    operator: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    merged_at: Mapped[datetime] = mapped_column(default=utcnow)
    undone_at: Mapped[datetime | None]
    undone_by: Mapped[str | None] = mapped_column(String(200))


class WebhookSource(Base):
    """A stored connection from one GitHub or Jira webhook to one workspace.

    Its ``slug`` is the last segment of the URL pasted into GitHub or Jira.
    """

    __tablename__ = "webhook_sources"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slug: Mapped[str] = mapped_column(String(64), unique=True)
    provider: Mapped[str] = mapped_column(String(16))
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    #: The events (``issues.opened``, ``jira:issue_created``) that create tasks.
    create_events: Mapped[list[str]] = mapped_column(JSON)
    #: Jira only: the site links are built from (``https://acme.atlassian.net``).
    site_url: Mapped[str | None] = mapped_column(Text)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    #: Which lane its deliveries take (``models.broker.lanes.SourceLane``):
    #: ``auto``, live unless it floods; ``background``, an operator's choice.
    lane: Mapped[str] = mapped_column(String(16), default="auto", server_default="auto")
    #: Set while an operator has paused it: its deliveries are stored, and
    #: answered, but no worker takes them until it resumes.
    paused_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SourceSecret(Base):
    """A signing secret of a source. Any active one verifies, so secrets rotate
    without downtime. HMAC needs the secret itself, so it is stored sealed
    (``models.sealing``), not as a digest; it never leaves the process in a
    log line, a listing or a response."""

    __tablename__ = "source_secrets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_sources.id", ondelete="CASCADE"), index=True
    )
    secret: Mapped[str] = mapped_column(SealedText)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    retired_at: Mapped[datetime | None]


#: A catch-up source holds one credential: a token, or a GitHub App's id and key.
CATCHUP_ONE_CREDENTIAL = (
    "(token IS NOT NULL AND app_id IS NULL AND private_key IS NULL)"
    " OR (token IS NULL AND app_id IS NOT NULL AND private_key IS NOT NULL)"
)


class CatchUpSource(Base):
    """Where a source's catch-up reads the provider's log of its deliveries,
    and with which credential (``taskhook sources catch-up``): a token, or a
    GitHub App's id and private key, never both. Both are credentials like a
    signing secret: stored sealed (``models.sealing``), because the API needs
    them, and never shown again after they are set, nor logged."""

    __tablename__ = "catchup_sources"
    __table_args__ = (
        CheckConstraint(CATCHUP_ONE_CREDENTIAL, name="ck_catchup_sources_one_credential"),
    )

    source_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_sources.id", ondelete="CASCADE"), primary_key=True
    )
    #: ``https://api.github.com``, or ``https://HOST/api/v3`` for GitHub
    #: Enterprise Server.
    api_base_url: Mapped[str] = mapped_column(Text)
    #: Whose hook: ``repos/OWNER/REPO``, ``orgs/ORG``, or ``app`` (``app/hook``);
    #: ``jira`` for a Jira site (``api_base_url`` is then the site's URL).
    target: Mapped[str] = mapped_column(String(300))
    #: The hook's id: given (``--hook-id``), or confirmed by a GitHub catch-up
    #: (``models.catchup.confirm_hook``); None: not known yet.
    hook_id: Mapped[str | None] = mapped_column(String(64))
    token: Mapped[str | None] = mapped_column(SealedText)
    #: A Jira Cloud site's: the account's email, which with ``token`` (an API
    #: token) signs in; None with a Data Center personal access token.
    email: Mapped[str | None] = mapped_column(String(320))
    #: A Jira source's filter (the JQL its webhook uses): its search is narrowed to it.
    jql: Mapped[str | None] = mapped_column(Text)
    #: A GitHub App's id and its private key (PEM): the App signs a JWT with it.
    app_id: Mapped[str | None] = mapped_column(String(20))
    private_key: Mapped[str | None] = mapped_column(SealedText)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class IngressHeartbeat(Base):
    """One ingress process's time up: when it started, and when it last said
    it was alive. Where no process was up, deliveries may have been missed
    (``models.uptime``)."""

    __tablename__ = "ingress_heartbeats"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    #: When it stopped cleanly (its uptime ends there); NULL while it runs,
    #: or when it died.
    stopped_at: Mapped[datetime | None]


class CatchUpRun(Base):
    """One catch-up of a source: what it read, what it recovered, and up to
    when the log is covered (set only when the run read its whole window,
    so an interrupted run is read again from the same point)."""

    __tablename__ = "catchup_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_sources.id", ondelete="CASCADE"), index=True
    )
    #: What was read: ``log`` (GitHub's delivery log), ``scan`` (GitHub's
    #: issues and pull requests), ``search`` (Jira's JQL search), ``gitlab``
    #: (a GitLab hook's events and its issues and merge requests); or
    #: ``by-hand``: nothing read, an operator marked the window as handled.
    kind: Mapped[str] = mapped_column(String(16), server_default=text("'log'"))
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    #: The window read: attempts delivered from ``since`` to ``covered_until``.
    since: Mapped[datetime]
    covered_until: Mapped[datetime | None]
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    #: Attempts listed, distinct deliveries (guids) among them, create
    #: deliveries the inbox did not hold, and those stored (or redelivered).
    attempts_listed: Mapped[int] = mapped_column(Integer, default=0)
    deliveries_listed: Mapped[int] = mapped_column(Integer, default=0)
    missed: Mapped[int] = mapped_column(Integer, default=0)
    recovered: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    #: A ``by-hand`` mark's operator and reason (who, why); None on a catch-up.
    operator: Mapped[str | None] = mapped_column(String(200))
    reason: Mapped[str | None] = mapped_column(Text)


class Delivery(Base):
    """The durable inbox: one row per (source, provider delivery id), body byte-exact.

    ``body`` is bytes, not text or JSON: PostgreSQL text and jsonb reject
    ``\\u0000``, and a signed body holding one must still be kept exactly.
    """

    __tablename__ = "deliveries"
    __table_args__ = (
        UniqueConstraint("source_id", "delivery_id"),
        Index("ix_deliveries_status_updated_at", "status", "updated_at"),
        Index("ix_deliveries_task_id", "task_id"),
        # The ingress's replay check: a body its source sent under another id.
        Index("ix_deliveries_source_body", "source_id", "body_sha256"),
        # What a catch-up run recovered; webhook deliveries (nearly all) are left out.
        Index(
            "ix_deliveries_catchup_run_id",
            "catchup_run_id",
            postgresql_where=text("catchup_run_id IS NOT NULL"),
            sqlite_where=text("catchup_run_id IS NOT NULL"),
        ),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source_id: Mapped[int] = mapped_column(ForeignKey("webhook_sources.id", ondelete="CASCADE"))
    delivery_id: Mapped[str] = mapped_column(ExternalIdText)
    hook_id: Mapped[str | None] = mapped_column(String(64))
    #: Empty once the retention policy dropped it (``body_dropped_at``).
    body: Mapped[bytes] = mapped_column(LargeBinary)
    #: The hex SHA-256 of the body as received; kept when the body is dropped,
    #: so a redelivery is still told from another body under the same id.
    body_sha256: Mapped[str] = mapped_column(String(64))
    #: When the retention policy dropped the body of this finished (done or
    #: ignored) delivery, keeping the row (models.retention); None: kept.
    body_dropped_at: Mapped[datetime | None]
    content_type: Mapped[str | None] = mapped_column(String(200))
    #: The adapter's event name (``issues.opened``), and GitHub's ``action`` alone.
    event: Mapped[str] = mapped_column(String(200))
    action: Mapped[str | None] = mapped_column(String(100))
    #: An allowlist of the delivery's headers; never a signature or credentials.
    headers: Mapped[dict[str, str]] = mapped_column(JSON)
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: queued -> processing -> done | ignored | needs_operator | dead
    status: Mapped[str] = mapped_column(String(20))
    status_reason: Mapped[str | None] = mapped_column(Text)
    #: Processing attempts taken so far; also the fencing generation of the
    #: current lease: a worker may write only while it holds the latest one.
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    #: Retries spent so far: the budget TASKHOOK_DATABASE_MAX_RETRIES and
    #: TASKHOOK_UNSETTLED_MAX_RETRIES bound. Counted when a worker defers the
    #: delivery for a retry, and reset by a replay; kept here, not in the
    #: broker's message, whose count starts again at 0 when the sweeper sends
    #: the delivery of a worker that died. Not ``attempts``: that one counts
    #: every claim (a crash's, a replay's) and must only ever grow, because it
    #: fences the lease, so it can neither start a replay's fresh budget nor
    #: tell a retry from a recovery. A server default only, so the ingress's
    #: INSERT (models.inbox.record_delivery) leaves the column out.
    retries: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    #: How many of its ``attempts`` ended with an answer the row recorded (a
    #: wait for a retry), counted since the last replay (which sets it to
    #: ``attempts``): the others were lost -- their worker died, or lost its
    #: lease. A row whose lost attempts reach TASKHOOK_MAX_LOST_ATTEMPTS is
    #: parked rather than claimed again (``models.inbox.park_lost``).
    answered_attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    lease_expires_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    #: The create outcome (a CreateOutcome value) and the task it named.
    outcome: Mapped[str | None] = mapped_column(String(32))
    #: Not a foreign key: the delivery's history outlives a deleted task.
    task_id: Mapped[int | None] = mapped_column(Integer)
    #: The task an attempt of this delivery inserted, written in the insert's
    #: own transaction under the attempt's lease (docs/contract.md, "Fencing
    #: the create"). Not a foreign key: it outlives a task deleted before its
    #: creation settled, so a later attempt parks instead of creating it again.
    created_task_id: Mapped[int | None] = mapped_column(Integer)
    #: Redeliveries under this id whose body differed from the stored one.
    payload_mismatches: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    #: The normalized external id the body names, as the ingress read it (NULL:
    #: none, or stored before it was kept).
    external_id: Mapped[str | None] = mapped_column(ExternalIdText)
    #: The task the body describes, as the ingress read and validated it: the
    #: PostgreSQL worker creates the task from these without reading the body
    #: (models.fastpath). NULL when the body describes no valid task, for rows
    #: stored before they were kept, and after a replay: then the worker reads
    #: the body itself and says what is wrong with it. Text without limits, so
    #: that keeping them can never fail the ingress's INSERT.
    draft_title: Mapped[str | None] = mapped_column(Text)
    draft_description: Mapped[str | None] = mapped_column(Text)
    draft_url: Mapped[str | None] = mapped_column(Text)
    draft_remote_key: Mapped[str | None] = mapped_column(Text)
    #: The provider's stable key of the item, as the ingress read it: the
    #: fast path must leave a create whose stable key the ledger knows to the
    #: general path (models.identities).
    draft_stable_key: Mapped[str | None] = mapped_column(Text)
    #: When an operator last replayed the delivery: a replay counts as the
    #: delivery received again (models.identities, "received before").
    replayed_at: Mapped[datetime | None]
    #: How the delivery reached the inbox: ``webhook`` (its sender posted it),
    #: ``catch-up`` (fetched from the provider's delivery log after the sender
    #: failed to get it through) or ``scan`` (synthesized from the item's
    #: state, by a scan or a Jira search): worker.catchup.
    origin: Mapped[str] = mapped_column(String(16), server_default=text("'webhook'"))
    #: The catch-up run that stored it (``catchup_runs.id``); None for a webhook's.
    catchup_run_id: Mapped[int | None] = mapped_column(Integer)
    #: The W3C traceparent of the span that stored it, when tracing is on
    #: (models/tracing.py): every later run of the delivery links to it.
    trace_context: Mapped[str | None] = mapped_column(Text)


class ApiToken(Base):
    """A bearer token of the REST API. Only a hash of the token is kept; the
    token itself is shown once, when it is made."""

    __tablename__ = "api_tokens"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    #: member: create, read, edit; operator: also release identities.
    role: Mapped[str] = mapped_column(String(16))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    #: The first characters of the token, so a person can tell tokens apart.
    token_prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]


class ApiTokenWorkspace(Base):
    """A workspace a token may see. A token sees nothing else."""

    __tablename__ = "api_token_workspaces"

    token_id: Mapped[int] = mapped_column(
        ForeignKey("api_tokens.id", ondelete="CASCADE"), primary_key=True
    )
    workspace_id: Mapped[int] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )


class TaskEvent(Base):
    """One thing that happened to a task, in a durable, resumable stream.

    ``position`` numbers a workspace's events 1, 2, 3, ... in commit order
    (see ``models.events``), so a reader that resumes after position N misses
    nothing and sees nothing twice.
    """

    __tablename__ = "task_events"
    __table_args__ = (
        UniqueConstraint("workspace_id", "position"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: The workspace's stream, whose counter row handed out ``position`` (and
    #: which goes with its workspace). Its key, not the workspace's: checking
    #: this reference locks the stream row the append already holds, where a
    #: check against the workspace's row, which every create updates for its
    #: identifier, made PostgreSQL share that row's lock among transactions.
    workspace_id: Mapped[int] = mapped_column(
        ForeignKey("event_streams.workspace_id", ondelete="CASCADE")
    )
    position: Mapped[int] = mapped_column(Integer)
    #: task.created, task.archived, task.deleted, task.identity_released
    type: Mapped[str] = mapped_column(String(40))
    #: Not a foreign key: a task.deleted event outlives its task.
    task_id: Mapped[int] = mapped_column(Integer)
    external_id: Mapped[str | None] = mapped_column(ExternalIdText)
    occurred_at: Mapped[datetime] = mapped_column(default=utcnow)


class EventStream(Base):
    """The last event position handed out per workspace. Appending an event
    locks this row until commit, which is what makes positions commit in order."""

    __tablename__ = "event_streams"

    workspace_id: Mapped[int] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    last_position: Mapped[int] = mapped_column(Integer)


class ConsoleSession(Base):
    """A browser's sign-in to the console (``ingest.console``): the cookie
    holds a random session key, of which only a hash is kept, so a database
    leak signs nobody in. The session acts as its token, and ends with it:
    signing out deletes the row, and a revoked token's sessions are refused."""

    __tablename__ = "console_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    token_id: Mapped[int] = mapped_column(
        ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True
    )
    #: Every form the console serves to this session carries it; an action
    #: without it is refused (cross-site request forgery).
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)


class Operation(Base):
    """An operator's bulk action, kept as the operations history: what was
    asked (``criteria``), by whom, under which name, and what it did."""

    __tablename__ = "operations"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: ``bulk-replay``: every replayable delivery matching ``criteria`` queued again;
    #: ``mark-handled``: a window of a source's downtime handled by hand
    #: (``criteria``: the source, the window and the reason; ``models.catchup``).
    kind: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(200))
    operator: Mapped[str] = mapped_column(String(200))
    #: The filter as given (``models.operations.DeliveryFilter``), as JSON.
    criteria: Mapped[dict] = mapped_column(JSON)
    #: The workspaces the run could reach (its token's), as a JSON list of
    #: ids; None: every workspace (a run from the CLI). The console shows a
    #: run only to a token that may see all of them.
    scope: Mapped[list | None] = mapped_column(JSON)
    #: The dry run's count the operator saw; then what the run found and did.
    expected: Mapped[int | None] = mapped_column(Integer)
    matched: Mapped[int] = mapped_column(Integer, default=0)
    done: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)


class IdempotencyKey(Base):
    """One ``Idempotency-Key`` a caller sent with a change (models/idempotency.py).

    Written in the change's own transaction, so a key row exists exactly when
    its change committed; a retry under the same key finds it and replays the
    receipt. ``key`` is unique: of two concurrent retries, one inserts and
    acts, the other waits for it and replays; the key belongs to one actor
    and one target, and any other request under it is refused."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (
        UniqueConstraint("key"),
        Index("ix_idempotency_keys_expires_at", "expires_at"),
    )

    #: bigint identity and text columns, as the migration lint asks of a new table.
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), IdentityColumn(), primary_key=True
    )
    #: Who sent it: ``token:<id>`` (REST, MCP, the console), ``cli:<operator>``.
    actor: Mapped[str] = mapped_column(Text)
    key: Mapped[str] = mapped_column(Text)
    #: SHA-256 over the actor, the action, the target, the body and the guard.
    fingerprint: Mapped[str] = mapped_column(Text)
    #: What the change was about, for people: ``task 42``, ``identity 3/jira:X-1``.
    target: Mapped[str] = mapped_column(Text)
    #: The receipt: the committed event when the change appended one (not a
    #: foreign key -- retention may outlive it), else ``status`` and ``answer``.
    event_id: Mapped[int | None] = mapped_column(BigInteger)
    workspace_id: Mapped[int | None] = mapped_column(BigInteger)
    task_id: Mapped[int | None] = mapped_column(BigInteger)
    status: Mapped[int | None] = mapped_column(BigInteger)
    answer: Mapped[dict | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: After this the key is forgotten: the same key is a new request.
    expires_at: Mapped[datetime]
