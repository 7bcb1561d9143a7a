"""Retention: a delivery whose body the retention policy dropped.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03

The retention policy (``models/retention.py``, docs/runbook.md "Retention")
empties the body of a ``done`` or ``ignored`` delivery older than
``TASKHOOK_BODY_RETENTION_DAYS`` and stamps ``deliveries.body_dropped_at``;
the row stays, with its ``body_sha256``, so a late redelivery is still
answered as a duplicate. Rows older than ``TASKHOOK_INBOX_RETENTION_DAYS``
are deleted. Both find their rows through ``ix_deliveries_status_updated_at``;
no index names the new column, so dropping a body changes no indexed column
and PostgreSQL can update the row in place (HOT) where its page has room.

Operational note: one nullable column, no rewrite and no lock beyond a
moment's. Processes of the previous revision ignore it; they never drop a
body, and none of them reads a dropped one (only ``done`` and ``ignored``
rows lose theirs, and nothing processes those again).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "deliveries", sa.Column("body_dropped_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("body_dropped_at")
