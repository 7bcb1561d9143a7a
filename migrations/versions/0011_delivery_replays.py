"""Inbox: find a source's earlier delivery of the same body, for replays.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

The ingress stores a body its source already sent under another delivery id
as a ``replay``, which is never processed, and a second body under a stored
id as a record of its own (``mismatch``, or processed when it is a create
and the stored row made no task): docs/reliability.md, "Hostile input". The
check runs inside the inbox's insert and needs ``ix_deliveries_source_body``
(source_id, body_sha256). Both statuses are new values of the ``status``
text column; no constraint lists them.

Operational note: building the index reads the whole inbox and, on
PostgreSQL, blocks inserts into it while it builds (seconds per million
rows). On a large inbox, build it first by hand without blocking --
``CREATE INDEX CONCURRENTLY ix_deliveries_source_body ON deliveries
(source_id, body_sha256)`` -- and this migration finds it there. An ingress
of the previous revision keeps working beside it: it never writes the new
statuses, and it answers a replayed body as before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from migrations.timeouts import longer_statements

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if _index_built_by_hand():
        return
    # Reads the whole inbox: on a large one, longer than the default
    # statement timeout (migrations/timeouts.py) -- the blocking build this
    # docstring's operational note warns about, as released.
    with longer_statements("30min"):
        op.create_index("ix_deliveries_source_body", "deliveries", ["source_id", "body_sha256"])


def _index_built_by_hand() -> bool:
    if context.is_offline_mode():
        return False  # rendered SQL (the migration lint) cannot ask the server
    existing = {index["name"] for index in sa.inspect(op.get_bind()).get_indexes("deliveries")}
    return "ix_deliveries_source_body" in existing


def downgrade() -> None:
    op.drop_index("ix_deliveries_source_body", table_name="deliveries")
