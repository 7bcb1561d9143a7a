"""An ingress process's clean stop ends its uptime.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06

``ingress_heartbeats`` gains ``stopped_at``: set when a process stops
cleanly, so the downtime after it starts then, not two heartbeats later
(``models.uptime``). A process that died leaves it NULL and counts as up
until two heartbeats after its last.

Operational note: one nullable column. Processes of revision 0019 never
set it; their stops count as unclean, as before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ingress_heartbeats") as heartbeats:
        heartbeats.add_column(sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ingress_heartbeats") as heartbeats:
        heartbeats.drop_column("stopped_at")
