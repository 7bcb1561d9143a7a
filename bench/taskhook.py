"""Setting taskhook up for a benchmark: a workspace and its two webhook sources,
the environment of its processes, and the counts a benchmark checks."""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from typing import Any

import httpx
import psycopg

from bench.processes import clean_environment, libpq_url, wait_until
from models.db import make_engine, make_session_factory, session_scope
from models.sources import add_source
from models.workspaces import create_workspace

SECRET = "bench-secret"
SOURCES = {"github": "bench-github", "jira": "bench-jira"}
FINISHED = ("done", "ignored", "needs_operator", "dead")


def prepare(database_url: str) -> None:
    """The workspace and the GitHub and Jira sources every benchmark posts to."""
    engine = make_engine(database_url)
    try:
        with session_scope(make_session_factory(engine)) as session:
            workspace = create_workspace(
                session=session, slug="bench", name="Bench", task_prefix="BENCH"
            )
            add_source(
                session=session,
                provider="github",
                workspace_id=workspace.id,
                slug=SOURCES["github"],
                secret=SECRET,
                create_events=["issues.opened", "pull_request.opened"],
            )
            add_source(
                session=session,
                provider="jira",
                workspace_id=workspace.id,
                slug=SOURCES["jira"],
                secret=SECRET,
                create_events=["jira:issue_created"],
            )
    finally:
        engine.dispose()


def environment(database_url: str, broker_url: str, **extra: str) -> dict[str, str]:
    return clean_environment(
        TASKHOOK_DATABASE_URL=database_url, TASKHOOK_BROKER_URL=broker_url, **extra
    )


def reset(database_url: str) -> None:
    """Empty the inbox, the tasks and the identity ledger (sources and
    workspace stay): a ledger left behind would know every name of the next
    run, and send its creates down the general path."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        connection.execute(
            "TRUNCATE deliveries, task_sources, identity_releases, tasks, identities, "
            "identity_deliveries, identity_prefixes, identity_merges RESTART IDENTITY"
        )
        connection.execute("UPDATE workspaces SET task_sequence = 0")
        for table in ("bench_inbox",):
            exists = connection.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]
            if exists:
                connection.execute(f"TRUNCATE {table} RESTART IDENTITY")


def timed_drain(
    procs: Any, name: str, env: dict[str, str], watcher: psycopg.Connection, n: int, *, what: str
) -> float:
    """Start one worker process (as the Procfile does), and the seconds from
    its ready to ``n`` deliveries finished in the inbox; the worker stopped."""
    worker = procs.celery_worker(name, "worker", env, wait=False)
    try:
        procs.wait_ready(worker)
        ready = time.monotonic()
        wait_until(lambda: finished_count(watcher) >= n, timeout=1800, what=what, every=0.1)
        return time.monotonic() - ready
    finally:
        with contextlib.suppress(Exception):
            procs.stop(worker)


def finished_count(connection: psycopg.Connection) -> int:
    return connection.execute(
        "SELECT count(*) FROM deliveries WHERE status = ANY(%s)", (list(FINISHED),)
    ).fetchone()[0]


def outcome_counts(database_url: str) -> dict[str, object]:
    """What a run left behind: deliveries by status and outcome, tasks, attempts."""
    with psycopg.connect(libpq_url(database_url)) as connection:
        statuses = dict(
            connection.execute("SELECT status, count(*) FROM deliveries GROUP BY status").fetchall()
        )
        outcomes = dict(
            connection.execute(
                "SELECT coalesce(outcome, '-'), count(*) FROM deliveries GROUP BY 1"
            ).fetchall()
        )
        tasks, settled = connection.execute(
            "SELECT count(*), count(external_id_settled_at) FROM tasks"
        ).fetchone()
        attempts, most = connection.execute(
            "SELECT coalesce(sum(attempts), 0), coalesce(max(attempts), 0) FROM deliveries"
        ).fetchone()
        distinct = connection.execute("SELECT count(DISTINCT external_id) FROM tasks").fetchone()[0]
    return {
        "deliveries_by_status": statuses,
        "deliveries_by_outcome": outcomes,
        "tasks": tasks,
        "tasks_settled": settled,
        "distinct_external_ids": distinct,
        "claims_total": int(attempts),
        "claims_max_per_delivery": int(most),
    }


def tag(name: str) -> str:
    """A tag for one load's requests, unique to the run, readable by ``name``."""
    return f"{re.sub('[^a-z0-9]+', '-', name.lower())}-{uuid.uuid4().hex[:8]}"


def relay_published(url: str) -> float:
    """The keys the ingress at ``url`` has published to the broker, from its metrics."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    match = re.search(r"^taskhook_relay_published_total (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


_BULK_TASKS = """
INSERT INTO tasks (workspace_id, identifier, title, step_id, created_at, updated_at,
                   external_id, external_id_settled_at, created_by_delivery)
SELECT %(workspace)s, 'BULK-' || g, 'bulk-loaded task ' || g, %(step)s, now(), now(),
       'gh-issue/bulk/load#' || g, now(), NULL
FROM generate_series(%(first)s::int, %(last)s::int) AS g
"""


_BULK_DELIVERIES = """
INSERT INTO deliveries (source_id, delivery_id, hook_id, body, body_sha256, content_type,
                        event, action, headers, received_at, updated_at, status, attempts,
                        outcome, payload_mismatches)
SELECT %(source)s, 'bulk-' || g, '123456', %(body)s, md5(g::text) || md5(g::text),
       'application/json', 'issues.opened', 'opened', '{}', now(), now(), 'done', 1,
       'created', 0
FROM generate_series(%(first)s::int, %(last)s::int) AS g
"""


def bulk_load(database: str, rows: int) -> float:
    """``rows`` settled tasks and their finished deliveries, loaded in bulk; the seconds it took."""
    started = time.monotonic()
    with psycopg.connect(libpq_url(database), autocommit=True) as connection:
        workspace, step = connection.execute(
            "SELECT w.id, s.id FROM workspaces w JOIN workflow_steps s ON s.workspace_id = w.id "
            "ORDER BY s.position LIMIT 1"
        ).fetchone()
        source = connection.execute(
            "SELECT id FROM webhook_sources WHERE provider = 'github'"
        ).fetchone()[0]
        body = b'{"bulk": true, "padding": "' + b"x" * 300 + b'"}'
        for first in range(1, rows + 1, 100_000):
            last = min(rows, first + 99_999)
            connection.execute(
                _BULK_TASKS, {"workspace": workspace, "step": step, "first": first, "last": last}
            )
            connection.execute(
                _BULK_DELIVERIES, {"source": source, "body": body, "first": first, "last": last}
            )
        connection.execute("VACUUM ANALYZE tasks")
        connection.execute("VACUUM ANALYZE deliveries")
    return time.monotonic() - started
