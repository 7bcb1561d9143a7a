"""Inbox: the task a delivery describes, as the ingress read it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29

``deliveries.draft_title``, ``draft_description``, ``draft_url`` and
``draft_remote_key``, with ``external_id`` (0005), are the TaskDraft the
ingress reads from the body anyway. On PostgreSQL the worker creates the task
from them in the statement that claims the delivery, without fetching or
parsing the body: claim, lookup and insert in one statement, then the
settlement in a second (models/fastpath.py, docs/performance.md). NULL when
the body describes no valid task, for rows stored before this revision and
after a replay; the worker then reads the body itself.

Operational note: four nullable columns -- no rewrite, no lock beyond a
moment's. Rows stored before keep working through the general path.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("draft_title", "draft_description", "draft_url", "draft_remote_key")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("deliveries", sa.Column(name, sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
