"""A task's own names live on its row; the ledger keeps the rest.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06

``tasks`` gains ``stable_key`` (the provider's stable key of the item), with
a unique index per workspace as ``external_id`` has. A task's own names --
its external id and its stable key -- are read from its row while it holds
them; ``identities`` keeps only the names that are not a live task's own
(aliases, and names whose task was deleted or released), written when a
task gives a name up. A plain create then writes no ledger row
(docs/performance.md §15).

The upgrade moves each live task's own stable key onto its row, keeps each
creating delivery in ``identity_deliveries`` (so it never creates again,
whatever retention does to its inbox row), and deletes the ledger rows the
tasks now hold. The downgrade writes them back.

Operational note: one nullable column and a partial index on ``tasks``; the
data steps read ``identities`` once. Processes of revision 0018 write own
names into ``identities`` and do not set ``tasks.stable_key``: stop them
before the upgrade.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.timeouts import longer_statements

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: A live task's own name in the ledger of revision 0018.
_OWN_LIVE = "NOT i.is_alias AND i.state IN ('held', 'archived')"


def upgrade() -> None:
    with op.batch_alter_table("tasks") as tasks:
        tasks.add_column(
            sa.Column(
                "stable_key",
                sa.Text().with_variant(sa.Text(collation="C"), "postgresql"),
                nullable=True,
            )
        )
    # Backfills and an index over every task: longer than the default
    # statement timeout on a large store (migrations/timeouts.py).
    with longer_statements("30min"):
        op.execute(
            f"""
            UPDATE tasks SET stable_key = (
                SELECT i.name FROM identities i
                WHERE i.task_id = tasks.id AND i.workspace_id = tasks.workspace_id
                  AND i.kind = 'stable' AND {_OWN_LIVE})
            """
        )
        op.create_index(
            "uniq_tasks_stable_key",
            "tasks",
            ["workspace_id", "stable_key"],
            unique=True,
            postgresql_where=sa.text("stable_key IS NOT NULL"),
            sqlite_where=sa.text("stable_key IS NOT NULL"),
        )
        # The delivery that created each live task, kept past its inbox row.
        op.execute(
            f"""
            INSERT INTO identity_deliveries (source_id, delivery_id, workspace_id, name,
                                             body_sha256, received_at, created)
            SELECT i.source_id, i.delivery_id, i.workspace_id, i.name,
                   COALESCE(i.body_sha256, ''), i.created_at, true
            FROM identities i
            WHERE i.kind = 'external' AND {_OWN_LIVE}
              AND i.source_id IS NOT NULL AND i.delivery_id IS NOT NULL
              AND EXISTS (SELECT 1 FROM webhook_sources s WHERE s.id = i.source_id)
            ON CONFLICT (source_id, delivery_id) DO NOTHING
            """
        )
        op.execute(
            f"""
            DELETE FROM identities
            WHERE EXISTS (
                SELECT 1 FROM identities i JOIN tasks t ON t.id = i.task_id
                WHERE i.workspace_id = identities.workspace_id AND i.kind = identities.kind
                  AND i.name = identities.name AND {_OWN_LIVE}
                  AND ((i.kind = 'external' AND t.external_id = i.name)
                       OR (i.kind = 'stable' AND t.stable_key = i.name)))
            """
        )


def downgrade() -> None:
    for kind, column in (("external", "external_id"), ("stable", "stable_key")):
        op.execute(
            f"""
            INSERT INTO identities (workspace_id, kind, name, task_id, state, is_alias,
                                    source_id, delivery_id, body_sha256, created_at, changed_at)
            SELECT t.workspace_id, '{kind}', t.{column}, t.id,
                   CASE WHEN t.archived_at IS NULL THEN 'held' ELSE 'archived' END,
                   false, d.source_id, d.delivery_id, d.body_sha256,
                   t.created_at, COALESCE(t.archived_at, t.created_at)
            FROM tasks t LEFT JOIN deliveries d ON d.id = t.created_by_delivery
            WHERE t.{column} IS NOT NULL
            ON CONFLICT (workspace_id, kind, name) DO UPDATE SET
                task_id = excluded.task_id, state = excluded.state, is_alias = false,
                source_id = excluded.source_id, delivery_id = excluded.delivery_id,
                body_sha256 = excluded.body_sha256, changed_at = excluded.changed_at
            """
        )
    op.drop_index("uniq_tasks_stable_key", table_name="tasks")
    with op.batch_alter_table("tasks") as tasks:
        tasks.drop_column("stable_key")
