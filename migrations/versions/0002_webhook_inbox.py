"""The webhook inbox: sources with their signing secrets, and deliveries.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

Adds ``webhook_sources`` (a GitHub or Jira connection to one workspace),
``source_secrets`` (several active at once, so secrets rotate without
downtime), ``deliveries`` (the durable inbox, body kept byte-exact as bytes),
and ``tasks.created_by_delivery`` so a redelivery can tell its own unfinished
create from another delivery's.

Operational note: new tables, plus one nullable column on ``tasks`` with no
default -- a catalog-only change on PostgreSQL, no table rewrite.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

TIMESTAMP = sa.DateTime(timezone=True)
# Delivery ids are compared byte-exactly, like external ids.
EXACT_TEXT = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "webhook_sources",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(length=64), nullable=False),
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("create_events", sa.JSON(), nullable=False),
        sa.Column("site_url", sa.Text(), nullable=True),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_webhook_sources_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_sources")),
        sa.UniqueConstraint("slug", name=op.f("uniq_webhook_sources_slug")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("source_id", sa.Integer(), nullable=False),
        sa.Column("delivery_id", EXACT_TEXT, nullable=False),
        sa.Column("hook_id", sa.String(length=64), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("body_sha256", sa.String(length=64), nullable=False),
        sa.Column("content_type", sa.String(length=200), nullable=True),
        sa.Column("event", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=100), nullable=True),
        sa.Column("headers", sa.JSON(), nullable=False),
        sa.Column("received_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("lease_expires_at", TIMESTAMP, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("outcome", sa.String(length=32), nullable=True),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("payload_mismatches", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.ForeignKeyConstraint(
            ["source_id"],
            ["webhook_sources.id"],
            name=op.f("fk_deliveries_source_id_webhook_sources"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
        sa.UniqueConstraint(
            "source_id", "delivery_id", name=op.f("uniq_deliveries_source_id_delivery_id")
        ),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_deliveries_status_updated_at", "deliveries", ["status", "updated_at"], unique=False
    )
    op.create_index("ix_deliveries_task_id", "deliveries", ["task_id"], unique=False)
    op.create_table(
        "source_secrets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("source_id", sa.Integer(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("retired_at", TIMESTAMP, nullable=True),
        sa.ForeignKeyConstraint(
            ["source_id"],
            ["webhook_sources.id"],
            name=op.f("fk_source_secrets_source_id_webhook_sources"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_source_secrets")),
    )
    op.create_index(
        op.f("ix_source_secrets_source_id"), "source_secrets", ["source_id"], unique=False
    )
    op.add_column("tasks", sa.Column("created_by_delivery", sa.Integer(), nullable=True))


def downgrade() -> None:
    # batch: SQLite rebuilds the table, PostgreSQL drops the column in place.
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("created_by_delivery")
    op.drop_index(op.f("ix_source_secrets_source_id"), table_name="source_secrets")
    op.drop_table("source_secrets")
    op.drop_index("ix_deliveries_task_id", table_name="deliveries")
    op.drop_index("ix_deliveries_status_updated_at", table_name="deliveries")
    op.drop_table("deliveries")
    op.drop_table("webhook_sources")
