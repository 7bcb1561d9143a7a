"""Catch-up beyond the delivery log: state scans, Jira's search, and what each
run recovered.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02

``catchup_sources`` gains ``email`` (a Jira Cloud site is read with an email
and an API token; a token alone is a Data Center personal access token) and
``jql`` (the filter the source's Jira webhook uses, which narrows its search).
``catchup_runs.kind`` says what a run read: ``log`` (GitHub's delivery log),
``scan`` (GitHub's issue listing) or ``search`` (Jira's JQL search).
``deliveries.catchup_run_id`` names the run that stored a recovered delivery,
so ``taskhook stats`` can say what the last run recovered; it is indexed only
where set (partial index), since webhook deliveries never set it.

Operational note: four nullable or constant-default columns and one partial
index on a column that is NULL on every existing row: no rewrite on
PostgreSQL 11 and later. Processes of the previous revision ignore them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RECOVERED = "catchup_run_id IS NOT NULL"


def upgrade() -> None:
    op.add_column("catchup_sources", sa.Column("email", sa.String(320), nullable=True))
    op.add_column("catchup_sources", sa.Column("jql", sa.Text(), nullable=True))
    op.add_column(
        "catchup_runs",
        sa.Column("kind", sa.String(16), server_default=sa.text("'log'"), nullable=False),
    )
    op.add_column("deliveries", sa.Column("catchup_run_id", sa.Integer(), nullable=True))
    op.create_index(
        "ix_deliveries_catchup_run_id",
        "deliveries",
        ["catchup_run_id"],
        postgresql_where=sa.text(_RECOVERED),
        sqlite_where=sa.text(_RECOVERED),
    )


def downgrade() -> None:
    op.drop_index("ix_deliveries_catchup_run_id", table_name="deliveries")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("catchup_run_id")
    with op.batch_alter_table("catchup_runs") as batch:
        batch.drop_column("kind")
    with op.batch_alter_table("catchup_sources") as batch:
        batch.drop_column("jql")
        batch.drop_column("email")
