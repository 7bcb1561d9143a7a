"""Task events reference their workspace's stream, not the workspace.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29

``task_events.workspace_id`` now references ``event_streams.workspace_id``
(ON DELETE CASCADE; the stream row goes with its workspace, so events still
go with it too). Every event's position comes from its stream's counter row,
so the row always exists. Checking the reference locks a row the appending
transaction already holds; checking it against ``workspaces`` locked the row
every create updates for its identifier, and PostgreSQL had to share that
lock among concurrent transactions (a multixact per event): measured with 8
concurrent workers, ~0.1 ms of database CPU per delivery
(docs/performance.md).

Operational note: the new constraint validates every event row (one index
probe each) while holding a lock that blocks writes to both tables; on a
large events table, run it in a quiet moment. SQLite rebuilds the table.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("task_events") as batch:
        batch.drop_constraint(op.f("fk_task_events_workspace_id_workspaces"), type_="foreignkey")
        batch.create_foreign_key(
            op.f("fk_task_events_workspace_id_event_streams"),
            "event_streams",
            ["workspace_id"],
            ["workspace_id"],
            ondelete="CASCADE",
        )


def downgrade() -> None:
    with op.batch_alter_table("task_events") as batch:
        batch.drop_constraint(op.f("fk_task_events_workspace_id_event_streams"), type_="foreignkey")
        batch.create_foreign_key(
            op.f("fk_task_events_workspace_id_workspaces"),
            "workspaces",
            ["workspace_id"],
            ["id"],
            ondelete="CASCADE",
        )
