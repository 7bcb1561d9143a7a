"""The task store's tables. Alembic migrations in ``migrations/`` create them;
a test proves the migrations and these declarations agree on both databases."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar

from sqlalchemy import (
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Named constraints, so migrations and error handling can refer to them by name.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uniq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: The one unique index whose violation means "another create holds this identity".
EXTERNAL_ID_INDEX = "uniq_tasks_external_id"


def utcnow() -> datetime:
    return datetime.now(UTC)


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
# an `external_id = $1` lookup (see PERF-NOTES: 260 ms vs 0.06 ms).
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
    task_id: Mapped[int] = mapped_column(Integer)
    operator: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    released_at: Mapped[datetime] = mapped_column(default=utcnow)
