"""Identity releases: the holder the operator expected to release.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

``identity_releases.expected_task_id`` records the task the operator was
shown when the release named one (the CLI always does; REST's
``expected_task_id`` is optional). The release checks it in the same UPDATE
that frees the identity, so a request that waited in the operator queue
while the task was deleted and the identity claimed by a new task releases
nothing (docs/contract.md, "Where taskhook extends the basic contract").
With ``task_id``, the row keeps both the expected and the actual holder.

Operational note: one nullable column -- no rewrite, no lock beyond a
moment's. Rows written before it say nothing about an expected holder.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("identity_releases", sa.Column("expected_task_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("identity_releases") as batch:
        batch.drop_column("expected_task_id")
