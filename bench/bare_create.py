"""The bare create in a Celery task: ``bench messages``' ceiling for a drain
with one message per delivery. ``celery -A bench.bare_create worker``.

The task runs what ``bench/pgbench_create.sql`` runs (look the external id
up, take the workspace's next identifier, insert the task, commit; then
settle it, commit), on taskhook's schema and with psycopg, as the least a
worker can do per message and still create a task: no inbox, no lease, no
source link, no event. Its app has taskhook's own Celery settings, as
``bench.noop``'s has, so a drain of it against the no-op drain says how near
0.7x the no-op any worker that creates a task per message can get on this
machine. Each worker thread keeps one autocommit connection, as taskhook's
fast path does. The database is ``TASKHOOK_DATABASE_URL``'s.
"""

from __future__ import annotations

import threading

import psycopg
from celery import Celery

from bench.processes import libpq_url
from models.settings import get_settings
from worker.celery_app import celery_config

BARE_CREATE = "bench.bare_create"

app = Celery("bench-bare-create", set_as_current=False)
app.add_defaults(lambda: celery_config(get_settings()))

_LOOKUP = (
    "SELECT id FROM tasks WHERE workspace_id = %(workspace)s AND external_id = %(external_id)s"
)
_IDENTIFIER = (
    "UPDATE workspaces SET task_sequence = task_sequence + 1 WHERE id = %(workspace)s"
    " RETURNING task_prefix || '-' || task_sequence"
)
_INSERT = (
    "INSERT INTO tasks (workspace_id, identifier, title, step_id, external_id, created_at,"
    " updated_at) VALUES (%(workspace)s, %(identifier)s, 'bare create task',"
    " (SELECT id FROM workflow_steps WHERE workspace_id = %(workspace)s ORDER BY position"
    " LIMIT 1), %(external_id)s, now(), now()) RETURNING id"
)
_SETTLE = (
    "UPDATE tasks SET external_id_settled_at = now() WHERE id = %(task)s"
    " AND external_id = %(external_id)s AND external_id_settled_at IS NULL"
)

_connections = threading.local()


def _connection() -> psycopg.Connection:
    connection = getattr(_connections, "connection", None)
    if connection is None or connection.closed:
        url = libpq_url(get_settings().database_url)
        connection = _connections.connection = psycopg.connect(url, autocommit=True)
    return connection


@app.task(name=BARE_CREATE)
def bare_create(workspace_id: int, external_id: str) -> None:
    """Create the task for ``external_id`` unless it exists, and settle it."""
    connection = _connection()
    values = {"workspace": workspace_id, "external_id": external_id}
    with connection.transaction():
        if connection.execute(_LOOKUP, values).fetchone() is not None:
            return
        (identifier,) = connection.execute(_IDENTIFIER, values).fetchone()
        (task,) = connection.execute(_INSERT, {**values, "identifier": identifier}).fetchone()
    connection.execute(_SETTLE, {**values, "task": task})
