"""A window of downtime an operator handled by hand: who and why.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06

``catchup_runs`` gains ``operator`` and ``reason``: a run of kind
``by-hand`` (``taskhook catch-up mark-handled``) reads nothing, covers the
window the operator names, and keeps who marked it and why. Catch-ups leave
both NULL.

Operational note: two nullable columns, no backfill; on PostgreSQL an
instant catalog change.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("catchup_runs") as runs:
        runs.add_column(sa.Column("operator", sa.String(length=200), nullable=True))
        runs.add_column(sa.Column("reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("catchup_runs") as runs:
        runs.drop_column("reason")
        runs.drop_column("operator")
