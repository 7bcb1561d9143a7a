"""Task lifecycle events: a durable stream per workspace, resumable by position.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29

``task_events`` holds the events; ``event_streams`` the last position handed
out per workspace (its row lock orders appends by commit). Operational note:
two new tables, nothing existing is touched.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "event_streams",
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("last_position", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_event_streams_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", name=op.f("pk_event_streams")),
    )
    op.create_table(
        "task_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column(
            "external_id",
            sa.Text().with_variant(sa.Text(collation="C"), "postgresql"),
            nullable=True,
        ),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_task_events_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_events")),
        sa.UniqueConstraint(
            "workspace_id", "position", name=op.f("uniq_task_events_workspace_id_position")
        ),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("task_events")
    op.drop_table("event_streams")
