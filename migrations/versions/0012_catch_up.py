"""Catch-up: where a source reads its provider's delivery log, its runs, and
how each delivery reached the inbox.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01

GitHub never redelivers a delivery our ingress failed to take; it keeps its
log of deliveries for 3 days (7 on Enterprise Server). ``catchup_sources``
holds, per source, the API base URL, the hook's owner (``repos/O/R``,
``orgs/O``, or ``app`` for a GitHub App's own hook), the hook id and the
credential to read that log: a token, or an App's id and private key (a
check constraint keeps exactly one); ``catchup_runs`` one
row per catch-up, whose ``covered_until`` is the cursor the next run starts
from. ``deliveries.origin`` says how a row arrived: ``webhook`` or
``catch-up`` (worker/catchup/).

Operational note: two new tables, and one column NOT NULL with a constant
default on ``deliveries`` -- no rewrite on PostgreSQL 11 and later. Rows
stored before read as ``webhook``. Processes of the previous revision ignore
all three.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column(
        "deliveries",
        sa.Column("origin", sa.String(16), server_default=sa.text("'webhook'"), nullable=False),
    )
    op.create_table(
        "catchup_sources",
        sa.Column(
            "source_id",
            sa.Integer(),
            sa.ForeignKey("webhook_sources.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("api_base_url", sa.Text(), nullable=False),
        sa.Column("target", sa.String(300), nullable=False),
        sa.Column("hook_id", sa.String(64), nullable=True),
        sa.Column("token", sa.Text(), nullable=True),
        sa.Column("app_id", sa.String(20), nullable=True),
        sa.Column("private_key", sa.Text(), nullable=True),
        sa.Column("updated_at", _TIMESTAMP, nullable=False),
        sa.CheckConstraint(
            "(token IS NOT NULL AND app_id IS NULL AND private_key IS NULL)"
            " OR (token IS NULL AND app_id IS NOT NULL AND private_key IS NOT NULL)",
            name="ck_catchup_sources_one_credential",
        ),
    )
    op.create_table(
        "catchup_runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "source_id",
            sa.Integer(),
            sa.ForeignKey("webhook_sources.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("started_at", _TIMESTAMP, nullable=False),
        sa.Column("finished_at", _TIMESTAMP, nullable=True),
        sa.Column("since", _TIMESTAMP, nullable=False),
        sa.Column("covered_until", _TIMESTAMP, nullable=True),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("attempts_listed", sa.Integer(), nullable=False),
        sa.Column("deliveries_listed", sa.Integer(), nullable=False),
        sa.Column("missed", sa.Integer(), nullable=False),
        sa.Column("recovered", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_catchup_runs_source_id", "catchup_runs", ["source_id"])


def downgrade() -> None:
    op.drop_index("ix_catchup_runs_source_id", table_name="catchup_runs")
    op.drop_table("catchup_runs")
    op.drop_table("catchup_sources")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("origin")
