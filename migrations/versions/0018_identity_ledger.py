"""The identity ledger: what every name a task was known by has become.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06

``identities`` keeps, per workspace and name (an external id, or a
provider's stable key), the task it named and what became of it: held,
archived, deleted or released; and whether it is an alias (a name learned
from a move or a merge). ``identity_deliveries`` keeps each delivery the worker judged for an
identity (no body: when it first came in, and its body's SHA-256), so a
redelivery after retention is still known; ``identity_prefixes`` keeps
repository renames;
``identity_merges`` audits operator merges. ``deliveries`` gains
``draft_stable_key`` (the ingress's reading) and ``replayed_at``.

The upgrade backfills the ledger from what the database already knows: the
tasks (held or archived), and the ``task.deleted`` and
``task.identity_released`` events of identities no task holds any more.

Operational note: three small tables and two nullable columns; the backfill
reads ``tasks`` and ``task_events`` once. Processes of the previous revision
write no ledger rows: run the upgrade before starting the new version.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.timeouts import longer_statements

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _external_id_text() -> sa.types.TypeEngine:
    return sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "identities",
        sa.Column(
            "workspace_id",
            sa.Integer(),
            sa.ForeignKey(
                "workspaces.id", ondelete="CASCADE", name="fk_identities_workspace_id_workspaces"
            ),
            nullable=False,
        ),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", _external_id_text(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("is_alias", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("source_id", sa.Integer(), nullable=True),
        sa.Column("delivery_id", _external_id_text(), nullable=True),
        sa.Column("body_sha256", sa.String(64), nullable=True),
        sa.Column("merge_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("workspace_id", "kind", "name", name="pk_identities"),
    )
    op.create_index("ix_identities_task_id", "identities", ["task_id"])
    op.create_index("ix_identities_source_body", "identities", ["source_id", "body_sha256"])
    op.create_table(
        "identity_deliveries",
        sa.Column(
            "source_id",
            sa.Integer(),
            sa.ForeignKey(
                "webhook_sources.id",
                ondelete="CASCADE",
                name="fk_identity_deliveries_source_id_webhook_sources",
            ),
            nullable=False,
        ),
        sa.Column("delivery_id", _external_id_text(), nullable=False),
        sa.Column(
            "workspace_id",
            sa.Integer(),
            sa.ForeignKey(
                "workspaces.id",
                ondelete="CASCADE",
                name="fk_identity_deliveries_workspace_id_workspaces",
            ),
            nullable=False,
        ),
        sa.Column("name", _external_id_text(), nullable=False),
        sa.Column("body_sha256", sa.String(64), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("source_id", "delivery_id", name="pk_identity_deliveries"),
    )
    op.create_index(
        "ix_identity_deliveries_source_body", "identity_deliveries", ["source_id", "body_sha256"]
    )
    op.create_table(
        "identity_prefixes",
        sa.Column(
            "workspace_id",
            sa.Integer(),
            sa.ForeignKey(
                "workspaces.id",
                ondelete="CASCADE",
                name="fk_identity_prefixes_workspace_id_workspaces",
            ),
            nullable=False,
        ),
        sa.Column("after", _external_id_text(), nullable=False),
        sa.Column("before", _external_id_text(), nullable=False),
        sa.Column("learned_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("workspace_id", "after", name="pk_identity_prefixes"),
    )
    op.create_table(
        "identity_merges",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "workspace_id",
            sa.Integer(),
            sa.ForeignKey(
                "workspaces.id",
                ondelete="CASCADE",
                name="fk_identity_merges_workspace_id_workspaces",
            ),
            nullable=False,
        ),
        sa.Column("into_task_id", sa.Integer(), nullable=False),
        sa.Column("from_task_id", sa.Integer(), nullable=False),
        sa.Column("names", sa.JSON(), nullable=False),
        sa.Column("operator", sa.String(200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("merged_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("undone_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("undone_by", sa.String(200), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_identity_merges"),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("deliveries") as deliveries:
        deliveries.add_column(sa.Column("draft_stable_key", sa.Text(), nullable=True))
        deliveries.add_column(sa.Column("replayed_at", sa.DateTime(timezone=True), nullable=True))
    # A backfill from every task and event: longer than the default statement
    # timeout on a large store (migrations/timeouts.py).
    with longer_statements("30min"):
        _backfill()


def _backfill() -> None:
    # Held and archived: every task holding an external id, with the delivery
    # that created it where that row is still kept.
    op.execute(
        """
        INSERT INTO identities (workspace_id, kind, name, task_id, state, is_alias,
                                source_id, delivery_id, body_sha256, created_at, changed_at)
        SELECT t.workspace_id, 'external', t.external_id, t.id,
               CASE WHEN t.archived_at IS NULL THEN 'held' ELSE 'archived' END,
               false, d.source_id, d.delivery_id, d.body_sha256,
               t.created_at, COALESCE(t.archived_at, t.created_at)
        FROM tasks t LEFT JOIN deliveries d ON d.id = t.created_by_delivery
        WHERE t.external_id IS NOT NULL
        """
    )
    # Deleted and released: the latest such event of each identity no task holds.
    op.execute(
        """
        INSERT INTO identities (workspace_id, kind, name, task_id, state, is_alias,
                                created_at, changed_at)
        SELECT e.workspace_id, 'external', e.external_id, e.task_id,
               CASE WHEN e.type = 'task.deleted' THEN 'deleted' ELSE 'released' END,
               false, e.occurred_at, e.occurred_at
        FROM task_events e
        WHERE e.external_id IS NOT NULL
          AND e.type IN ('task.deleted', 'task.identity_released')
          AND e.position = (
              SELECT MAX(later.position) FROM task_events later
              WHERE later.workspace_id = e.workspace_id
                AND later.external_id = e.external_id
                AND later.type IN ('task.deleted', 'task.identity_released'))
          AND NOT EXISTS (
              SELECT 1 FROM identities i
              WHERE i.workspace_id = e.workspace_id AND i.kind = 'external'
                AND i.name = e.external_id)
        """
    )


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as deliveries:
        deliveries.drop_column("replayed_at")
        deliveries.drop_column("draft_stable_key")
    op.drop_table("identity_merges")
    op.drop_table("identity_prefixes")
    op.drop_index("ix_identity_deliveries_source_body", table_name="identity_deliveries")
    op.drop_table("identity_deliveries")
    op.drop_index("ix_identities_source_body", table_name="identities")
    op.drop_index("ix_identities_task_id", table_name="identities")
    op.drop_table("identities")
