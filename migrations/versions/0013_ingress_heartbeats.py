"""Ingress heartbeats: when each ingress process was up.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01

Each ingress process inserts a row when it starts and stamps
``last_seen_at`` every ``TASKHOOK_INGRESS_HEARTBEAT_SECONDS``. A stretch of
time no row covers is a window in which no ingress took deliveries; ``taskhook
stats`` shows the windows no catch-up has covered yet (models/uptime.py).

Operational note: a new table, small (one row per process start; rows older
than the providers' logs are of no use and may be deleted). Processes of the
previous revision ignore it; an ingress of this revision against a database
not yet migrated logs the failed heartbeat and serves on.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ingress_heartbeats",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_ingress_heartbeats_last_seen_at", "ingress_heartbeats", ["last_seen_at"])


def downgrade() -> None:
    op.drop_index("ix_ingress_heartbeats_last_seen_at", table_name="ingress_heartbeats")
    op.drop_table("ingress_heartbeats")
