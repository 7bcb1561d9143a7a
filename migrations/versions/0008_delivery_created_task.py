"""Inbox: the task a delivery's create inserted, written with the insert.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

``deliveries.created_task_id`` is set in the same transaction as the task
row an attempt of this delivery inserts, by an UPDATE fenced by that
attempt's lease: an attempt whose lease was taken over cannot insert at all
(docs/contract.md, "Fencing the create"). Because it is not a foreign key, it
outlives a task deleted before its creation settled, which is how a later
attempt knows to park the delivery for an operator instead of creating the
task again. A replay clears it when its task is gone: the operator asked for
the task to be created again.

Operational note: one nullable column -- no rewrite, no lock beyond a
moment's. Rows stored before it read as "no attempt inserted a task", as
before this revision.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("deliveries", sa.Column("created_task_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("created_task_id")
