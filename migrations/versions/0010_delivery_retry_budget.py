"""Inbox: the retries a delivery has spent, kept on its row.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

``deliveries.retries`` counts the retries a delivery has spent: a worker
counts one each time it defers the delivery for a retry (a database error,
another create unsettled, a full intake step), and the limits
(``TASKHOOK_DATABASE_MAX_RETRIES``, ``TASKHOOK_UNSETTLED_MAX_RETRIES``) are
checked against it. Until now the count lived only in the broker's message,
and the message the sweeper sends for a delivery whose worker died starts
again at 0: every crash refilled the budget. A replay resets it, for a fresh
budget after the operator's fix. ``attempts`` cannot serve: it counts every
claim, crashes and replays included, and fences the lease, so it must never
go back to 0.

Operational note: one integer column, NOT NULL with a constant default --
no rewrite on PostgreSQL 11 and later, no lock beyond a moment's. Rows
stored before read as having spent nothing; a worker of this revision still
honours the count of a message an older worker sent (the larger of the two
counts), so a delivery retrying through the upgrade keeps its budget.
Workers of the previous revision ignore the column.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "deliveries",
        sa.Column("retries", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("retries")
