"""Inbox: the identity a delivery names, and its body compressed with lz4.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29

``deliveries.external_id`` is the normalized external id the delivery's body
names, as the ingress read it (NULL when it names none, or for rows stored
before this revision). A PostgreSQL worker looks the identity up in the same
statement that claims the delivery, a round trip fewer per delivery; it still
parses the body itself and looks up separately whenever its own reading
differs (models/fastpath.py).

On PostgreSQL built with lz4 (Debian's is), the body is compressed with lz4
instead of pglz: the ingress's INSERT of a 10-30 KB body went from ~0.5 to
~0.35 ms, and the table is smaller (docs/performance.md).

Operational note: a nullable column and a column setting -- no rewrite, no
lock beyond a moment's. Rows stored before keep their pglz bodies and read as
before. Nothing about compression happens on SQLite.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EXACT_TEXT = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def _lz4_available() -> bool:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    if context.is_offline_mode():
        # Rendered SQL (alembic --sql, the migration lint) cannot ask the
        # server: it shows the statement a server with lz4 runs.
        return True
    return bool(
        bind.exec_driver_sql(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        ).scalar()
    )


def upgrade() -> None:
    op.add_column("deliveries", sa.Column("external_id", EXACT_TEXT, nullable=True))
    if _lz4_available():
        op.execute("ALTER TABLE deliveries ALTER COLUMN body SET COMPRESSION lz4")


def downgrade() -> None:
    if _lz4_available():
        op.execute("ALTER TABLE deliveries ALTER COLUMN body SET COMPRESSION default")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("external_id")
