"""Lost attempts: a delivery whose worker dies on it every time is parked.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02

``deliveries.answered_attempts`` counts the attempts that ended with an
answer the row recorded (a wait for a retry) since the last replay; every
other attempt was lost -- its worker was killed, crashed, or lost its lease.
The claim no longer takes a row whose lost attempts reached
``TASKHOOK_MAX_LOST_ATTEMPTS``, and the worker parks it as ``needs_operator``
instead: a message that kills its worker must not take every worker down in
turn, for ever (``models.inbox``, ``park_lost``).

Operational note: one NOT NULL column with a constant default: no rewrite on
PostgreSQL 11 and later. The rows still in work (queued, processing: a
handful) start from their ``retries``, each of which was an answered attempt,
so none counts its earlier waits as lost. Processes of the previous revision
ignore the column.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.timeouts import longer_statements

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "deliveries",
        sa.Column("answered_attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    # Reads the whole inbox: a backfill, longer than the default statement
    # timeout on a large one (migrations/timeouts.py).
    with longer_statements("30min"):
        op.execute(
            "UPDATE deliveries SET answered_attempts = retries "
            "WHERE status IN ('queued', 'processing')"
        )


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("answered_attempts")
