"""Retries of every change that is not a create: the keys they carry.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07

``idempotency_keys`` keeps one row per ``Idempotency-Key`` a caller sent with
a release, an archive, a delete, a merge or another change (models/
idempotency.py): who sent it, a fingerprint of the request, and the receipt
-- the committed event where the change appended one, else its status and
answer. Unique on ``key`` (the key is one actor's, for one target); rows expire after
``TASKHOOK_IDEMPOTENCY_WINDOW_HOURS`` and retention deletes them.
See docs/contract.md, "Retries of everything that is not a create".

Operational note: one new table, nothing else changes; no backfill. Version
0.1.0's code never names it, so it runs on this schema unchanged.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _key_type() -> sa.types.TypeEngine:
    # bigint identity keys on PostgreSQL, as the lint asks of a new table;
    # SQLite's rowid key must be spelled INTEGER to be one.
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # A new table that nothing references: no batch, no existing table touched.
    op.create_table(
        "idempotency_keys",
        sa.Column("id", _key_type(), sa.Identity(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=True),
        sa.Column("workspace_id", sa.BigInteger(), nullable=True),
        sa.Column("task_id", sa.BigInteger(), nullable=True),
        sa.Column("status", sa.BigInteger(), nullable=True),
        sa.Column("answer", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_idempotency_keys"),
        sa.UniqueConstraint("key", name="uniq_idempotency_keys_key"),
    )
    # On the table this revision creates: empty, nothing to block.
    op.create_index("ix_idempotency_keys_expires_at", "idempotency_keys", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_idempotency_keys_expires_at", table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
