"""A delivery keeps the trace context it was stored under.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07

``deliveries.trace_context`` holds the W3C ``traceparent`` of the span that
stored the row (the webhook's POST, or the catch-up that found it), when
tracing is on (models/tracing.py). A message that does not carry it -- the
sweeper's resend, a replay, a catch-up's send -- starts a new trace linked
to it, so every run of a delivery joins its first trace.

Operational note: one nullable column, no default, no backfill: a catalog
change on PostgreSQL and SQLite alike. Version 0.1.0's code never names it,
so it runs on this schema unchanged (CHANGELOG.md).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Not in a batch: on SQLite a batch recreates the table (0023 says why
    # that must not happen to a table others reference); a nullable column is
    # added in place.
    # text, not varchar(55): widening a varchar takes the inbox's ACCESS
    # EXCLUSIVE lock (the migration lint's prefer-text-field).
    op.add_column("deliveries", sa.Column("trace_context", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("deliveries", "trace_context")  # in place, as it was added
