"""The console: browser sessions, and the operations history.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02

``console_sessions`` holds one row per signed-in browser (ingest.console): a
hash of the cookie's session key, the token it acts as, the session's CSRF
token and when it expires. Signing out deletes the row; deleting a token
deletes its sessions.

``operations`` is the operations history: each bulk replay an operator ran,
named, with its filter, the workspaces it could reach, the dry run's count,
and what the run did (models.operations).

Operational note: two new tables, both small. Processes of the previous
revision ignore them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("session_sha256", sa.String(64), nullable=False),
        sa.Column(
            "token_id",
            sa.Integer(),
            sa.ForeignKey(
                "api_tokens.id",
                ondelete="CASCADE",
                name="fk_console_sessions_token_id_api_tokens",
            ),
            nullable=False,
        ),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_console_sessions"),
        sa.UniqueConstraint("session_sha256", name="uniq_console_sessions_session_sha256"),
    )
    op.create_index("ix_console_sessions_token_id", "console_sessions", ["token_id"])
    op.create_index("ix_console_sessions_expires_at", "console_sessions", ["expires_at"])
    op.create_table(
        "operations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("operator", sa.String(200), nullable=False),
        sa.Column("criteria", sa.JSON(), nullable=False),
        sa.Column("scope", sa.JSON(), nullable=True),
        sa.Column("expected", sa.Integer(), nullable=True),
        sa.Column("matched", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_operations"),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("operations")
    op.drop_index("ix_console_sessions_expires_at", table_name="console_sessions")
    op.drop_index("ix_console_sessions_token_id", table_name="console_sessions")
    op.drop_table("console_sessions")
