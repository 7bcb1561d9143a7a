"""Deletes are audited, and a workspace may reserve them to operators.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06

``task_deletions`` keeps one row per deleted task: who deleted it (the
token's name and role), when, and the identity the delete freed -- as
``identity_releases`` does for a release. ``workspaces`` gains
``deletes_need_operator`` (false: a member token may delete, as before).
See docs/contract.md §11 and docs/runbook.md, "Who may delete a task".

Operational note: one small table and a NOT NULL column with a constant
default, no backfill; on PostgreSQL 11+ the column is a catalog change.
Deletes made before this revision have no audit row (their ``task.deleted``
event remains).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _external_id_text() -> sa.types.TypeEngine:
    return sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "task_deletions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("identifier", sa.String(40), nullable=False),
        sa.Column("external_id", _external_id_text(), nullable=True),
        sa.Column("operator", sa.String(200), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_task_deletions_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_task_deletions"),
    )
    op.create_index("ix_task_deletions_task_id", "task_deletions", ["task_id"])
    # Not in a batch: on SQLite a batch recreates the table, and dropping the
    # old ``workspaces`` cascades to every source and delivery. SQLite adds a
    # NOT NULL column with a constant default in place.
    op.add_column(
        "workspaces",
        sa.Column("deletes_need_operator", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("workspaces", "deletes_need_operator")  # in place, as it was added
    op.drop_index("ix_task_deletions_task_id", table_name="task_deletions")
    op.drop_table("task_deletions")
