"""The promises, checked by SQL after every scenario (and after every step of the
stateful test).

1. Every accepted delivery is finished: done, ignored or parked for a person
   (``needs_operator``; ``dead`` only where the scenario expects it, with a
   reason that says the same body would fail again). None is left ``queued``
   or ``processing``.
2. No ``(workspace_id, external_id)`` has two tasks -- and no item (a GitHub
   issue, a Jira issue) has two tasks unless an operator released an identity
   in between: a workspace's tasks for one item are at most one plus the
   releases of those tasks.
3. ``task_sequence`` equals the number of tasks created in each workspace: no
   Found outcome, lost race or failed insert burned an identifier.
4. Every release has an audit row naming an operator and a reason, and an
   audit row's task really lost its identity. A task merged into another
   (models/merges.py) lost its identity by a merge's audit row instead.

And what follows from the create sequence: no task carries a settlement
without an identity, no task still holding an identity is unsettled once the
delivery that created it finished, and every finished delivery names an
existing task.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import Engine, text

#: Reasons a delivery may end ``dead`` with when a scenario feeds it bad input:
#: the same body would fail the same way again (worker/processing/attempt.py).
BAD_INPUT_REASONS = ("cannot become a task:", "unsupported payload:")


@dataclass
class Snapshot:
    """What the invariants looked at, for the figures."""

    deliveries: dict[str, int]
    tasks: int
    releases: int
    violations: list[str] = field(default_factory=list)


def violations(engine: Engine, *, dead_allowed: Iterable[str] = ()) -> Snapshot:
    """Every broken promise in the database behind ``engine``; none when all hold."""
    dead_allowed = tuple(dead_allowed)
    found: list[str] = []
    with engine.connect() as db:
        by_status = text("SELECT status, count(*) FROM deliveries GROUP BY 1")
        statuses = dict(db.execute(by_status).all())

        stuck = db.execute(
            text(
                "SELECT id, status, status_reason FROM deliveries "
                "WHERE status IN ('queued', 'processing') ORDER BY id LIMIT 20"
            )
        ).all()
        if stuck:
            found.append(f"{len(stuck)}+ deliveries not finished, e.g. {stuck[:5]}")

        dead = db.execute(
            text("SELECT id, status_reason, last_error FROM deliveries WHERE status = 'dead'")
        ).all()
        unexpected = [row for row in dead if not (row[1] or "").startswith(dead_allowed)]
        if unexpected:
            found.append(f"{len(unexpected)} deliveries dead, e.g. {unexpected[:5]}")

        doubles = db.execute(
            text(
                "SELECT workspace_id, external_id, count(*) FROM tasks "
                "WHERE external_id IS NOT NULL GROUP BY 1, 2 HAVING count(*) > 1"
            )
        ).all()
        if doubles:
            found.append(f"identities held by two tasks: {doubles[:5]}")

        tasks_by_item: dict[tuple, list[int]] = defaultdict(list)
        for task_id, workspace_id, provider, remote_key in db.execute(
            text(
                "SELECT t.id, t.workspace_id, s.provider, s.remote_key "
                "FROM tasks t JOIN task_sources s ON s.task_id = t.id"
            )
        ):
            tasks_by_item[(workspace_id, provider, remote_key)].append(task_id)
        released = Counter(db.execute(text("SELECT task_id FROM identity_releases")).scalars())
        for item, task_ids in tasks_by_item.items():
            releases = sum(released[task_id] for task_id in task_ids)
            if len(task_ids) > 1 + releases:
                found.append(
                    f"item {item} has {len(task_ids)} tasks {task_ids} after {releases} releases"
                )

        # Every number handed out is a task that exists or one whose delete
        # the stream reports: none burned by a Found outcome or a rolled-back insert.
        burned = db.execute(
            text(
                "SELECT id, task_sequence, made FROM ("
                "  SELECT w.id, w.task_sequence,"
                "    (SELECT count(*) FROM tasks t WHERE t.workspace_id = w.id)"
                "    + (SELECT count(DISTINCT e.task_id) FROM task_events e"
                "       WHERE e.workspace_id = w.id AND e.type = 'task.deleted') AS made"
                "  FROM workspaces w) AS numbers "
                "WHERE task_sequence <> made"
            )
        ).all()
        if burned:
            found.append(f"task_sequence differs from the tasks created: {burned}")

        # A task that came from a webhook was created holding an identity (every
        # draft has one); without it now, an operator must have released it, or
        # merged it into another task (a merge not undone: models/merges.py).
        unaudited = (
            db.execute(
                text(
                    "SELECT t.id FROM tasks t WHERE t.external_id IS NULL "
                    "AND (t.created_by_delivery IS NOT NULL "
                    "     OR EXISTS (SELECT 1 FROM task_sources s WHERE s.task_id = t.id)) "
                    "AND NOT EXISTS (SELECT 1 FROM identity_releases r WHERE r.task_id = t.id) "
                    "AND NOT EXISTS (SELECT 1 FROM identity_merges m "
                    "                WHERE m.from_task_id = t.id AND m.undone_at IS NULL)"
                )
            )
            .scalars()
            .all()
        )
        if unaudited:
            found.append(f"tasks without their identity and without an audit row: {unaudited}")

        bad_audit = db.execute(
            text(
                "SELECT r.id, r.task_id, r.operator FROM identity_releases r "
                "LEFT JOIN tasks t ON t.id = r.task_id "
                "WHERE trim(r.operator) = '' OR trim(r.reason) = '' "
                "   OR (t.id IS NOT NULL AND t.external_id IS NOT NULL)"
            )
        ).all()
        if bad_audit:
            found.append(f"audit rows without operator/reason, or for a kept identity: {bad_audit}")

        stamped = (
            db.execute(
                text(
                    "SELECT id FROM tasks "
                    "WHERE external_id IS NULL AND external_id_settled_at IS NOT NULL"
                )
            )
            .scalars()
            .all()
        )
        if stamped:
            found.append(f"settled without an identity: {stamped}")

        unsettled = db.execute(
            text(
                "SELECT t.id, t.external_id, d.id FROM tasks t "
                "JOIN deliveries d ON d.id = t.created_by_delivery "
                "WHERE t.external_id IS NOT NULL AND t.external_id_settled_at IS NULL "
                "AND d.status = 'done'"
            )
        ).all()
        if unsettled:
            found.append(f"unsettled tasks whose creating delivery is done: {unsettled}")

        dangling = db.execute(
            text(
                "SELECT d.id, d.outcome, d.task_id FROM deliveries d "
                "WHERE d.status = 'done' AND (d.outcome IS NULL OR d.task_id IS NULL "
                "  OR NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = d.task_id))"
            )
        ).all()
        if dangling:
            found.append(f"done deliveries without an outcome or an existing task: {dangling[:5]}")

        tasks = db.execute(text("SELECT count(*) FROM tasks")).scalar_one()
        releases = db.execute(text("SELECT count(*) FROM identity_releases")).scalar_one()
    return Snapshot(dict(statuses), tasks, releases, found)


def assert_invariants(engine: Engine, *, dead_allowed: Iterable[str] = ()) -> Snapshot:
    snapshot = violations(engine, dead_allowed=dead_allowed)
    assert snapshot.violations == [], "\n".join(snapshot.violations)
    return snapshot
