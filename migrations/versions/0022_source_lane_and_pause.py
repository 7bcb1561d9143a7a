"""A source's lane and its pause: an operator's answers to a storm.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06

``webhook_sources`` gains ``lane`` (``auto``: live unless it floods;
``background``: always behind everyone's live deliveries) and ``paused_at``
(set: its deliveries are stored and answered, but no worker takes them
until it resumes). See docs/runbook.md, "A storm".

Operational note: a NOT NULL column with a constant default and a nullable
one, no backfill; on PostgreSQL 11+ both are catalog changes, instant on a
table of any size.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_sources") as sources:
        sources.add_column(
            sa.Column("lane", sa.String(length=16), nullable=False, server_default="auto")
        )
        sources.add_column(sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("webhook_sources") as sources:
        sources.drop_column("paused_at")
        sources.drop_column("lane")
