"""The task store: workspaces, workflow steps, tasks with external identities,
task sources and the identity-release audit trail.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Operational note: this creates empty tables only; nothing is locked for long.
``tasks.external_id`` is byte-exact on both databases: ``COLLATE "C"`` on
PostgreSQL (an unqualified TEXT would follow the database collation, and the
partial unique index could not serve plain ``=`` lookups), BINARY on SQLite.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EXTERNAL_ID = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "workspaces",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("task_prefix", sa.String(16), nullable=False),
        sa.Column("task_sequence", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workspaces"),
        sa.UniqueConstraint("slug", name="uniq_workspaces_slug"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "workflow_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("wip_limit", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_workflow_steps_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_workflow_steps"),
        sa.UniqueConstraint(
            "workspace_id", "position", name="uniq_workflow_steps_workspace_id_position"
        ),
    )
    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("identifier", sa.String(40), nullable=False),
        sa.Column("title", sa.String(500), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("step_id", sa.Integer(), nullable=False),
        sa.Column("archived_at", TIMESTAMP, nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.Column("external_id", EXTERNAL_ID, nullable=True),
        sa.Column("external_id_settled_at", TIMESTAMP, nullable=True),
        sa.ForeignKeyConstraint(
            ["step_id"], ["workflow_steps.id"], name="fk_tasks_step_id_workflow_steps"
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_tasks_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_tasks"),
        sa.UniqueConstraint(
            "workspace_id", "identifier", name="uniq_tasks_workspace_id_identifier"
        ),
        # SQLite would otherwise hand a deleted task's id to the next task.
        sqlite_autoincrement=True,
    )
    op.create_index("ix_tasks_step_id", "tasks", ["step_id"])
    # The identity claim itself. Its name is load-bearing: the create sequence
    # turns a violation of this index -- and only this one -- into Found.
    op.create_index(
        "uniq_tasks_external_id",
        "tasks",
        ["workspace_id", "external_id"],
        unique=True,
        postgresql_where=sa.text("external_id IS NOT NULL"),
        sqlite_where=sa.text("external_id IS NOT NULL"),
    )
    op.create_table(
        "task_sources",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(32), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("remote_key", sa.String(255), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name="fk_task_sources_task_id_tasks", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_task_sources"),
        sa.UniqueConstraint("task_id", name="uniq_task_sources_task_id"),
    )
    op.create_table(
        "identity_releases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("external_id", EXTERNAL_ID, nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("operator", sa.String(200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("released_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_identity_releases_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_identity_releases"),
    )


def downgrade() -> None:
    op.drop_table("identity_releases")
    op.drop_table("task_sources")
    op.drop_index("uniq_tasks_external_id", table_name="tasks")
    op.drop_index("ix_tasks_step_id", table_name="tasks")
    op.drop_table("tasks")
    op.drop_table("workflow_steps")
    op.drop_table("workspaces")
