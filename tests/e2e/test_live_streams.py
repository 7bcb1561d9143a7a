"""A live event stream with real processes: uvicorn holds an SSE stream open
on PostgreSQL, a webhook comes in, a Celery worker creates its task, and the
stream carries the task's ``task.created`` -- woken by the ingress's
LISTEN/NOTIFY listener, not by a poll. Nothing here is mocked."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable

import httpx
import psutil
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from ingest.notifications import LISTENER_APPLICATION_NAME
from models.db import session_scope
from models.sources import add_source
from models.tokens import issue_token
from models.workspaces import create_workspace
from tests.support.deliveries import fixture, github_headers
from tests.support.processes import Ingress, StartWorker
from tests.support.stores import POSTGRES_ADMIN_URL

pytestmark = pytest.mark.e2e
#: Again with the processes behind a PgBouncer in transaction mode, the
#: listener straight to PostgreSQL (tests/e2e/conftest.py).
THROUGH_PGBOUNCER_TOO = True

SECRET = "live-github-secret"
POSTGRES_PORT = make_url(POSTGRES_ADMIN_URL).port or 5432


def read_stream(url: str, headers: dict[str, str], into: queue.Queue, opened: threading.Event):
    with (
        httpx.Client(timeout=httpx.Timeout(10, read=120)) as client,
        client.stream("GET", url, params={"timeout": 60}, headers=headers) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            opened.set()
            if line.startswith("data: "):
                into.put(json.loads(line.removeprefix("data: ")))
                return  # one event is all this test needs


def test_a_webhook_reaches_an_open_sse_stream_as_task_created(
    sessions,
    start_worker: StartWorker,
    start_ingress: Callable[..., Ingress],
    database_route: str,
    request: pytest.FixtureRequest,
):
    with session_scope(sessions) as session:
        workspace = create_workspace(session=session, slug="live", name="Live", task_prefix="LV")
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug="live-github",
            secret=SECRET,
            create_events=["issues.opened"],
        )
        token = issue_token(
            session=session, name="watcher", role="member", workspace_ids=[workspace.id]
        ).token
        workspace_id = workspace.id
    # A stream here would poll only after the test gave up: only the
    # listener's notification can bring the event in time.
    ingress = start_ingress(TASKHOOK_STREAM_POLL_SECONDS="300")
    start_worker("live-streams")
    events: queue.Queue[dict] = queue.Queue()
    opened = threading.Event()
    reader = threading.Thread(
        target=read_stream,
        args=(
            f"{ingress.url}/api/v1/workspaces/{workspace_id}/events",
            {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"},
            events,
            opened,
        ),
        daemon=True,
    )
    reader.start()
    assert opened.wait(10), "the stream did not open"

    body = fixture("github", "issues__opened")
    answer = httpx.post(
        f"{ingress.url}/webhooks/github/live-github",
        content=body,
        headers=github_headers("issues__opened", body, SECRET),
        timeout=10,
    )
    assert answer.status_code in (200, 202), answer.text
    event = events.get(timeout=30)
    assert event["type"] == "task.created"
    assert event["workspace_id"] == workspace_id
    assert event["external_id"] == "gh-issue/Codertocat/Hello-World#1"
    reader.join(10)

    # The listener's session is the ingress's own connection to PostgreSQL;
    # behind a PgBouncer it is the only one, the rest go through the pooler.
    listener_port = listener_client_port(sessions)
    to_postgres, to_pgbouncer = ingress_connections(ingress, request, database_route)
    assert listener_port in to_postgres
    if database_route == "pgbouncer":
        assert to_postgres == {listener_port}
        assert to_pgbouncer, "the ingress's inbox and sessions should go through PgBouncer"
        assert listener_port not in request.getfixturevalue("pgbouncer").server_ports()


def listener_client_port(sessions) -> int:
    """The client port of the backend whose application is the ingress's listener."""
    with sessions() as session:
        ports = session.scalars(
            text(
                "SELECT client_port FROM pg_stat_activity "
                "WHERE application_name = :name AND datname = current_database()"
            ),
            {"name": LISTENER_APPLICATION_NAME},
        ).all()
    assert len(ports) == 1, f"one listener session expected, found {ports}"
    return ports[0]


def ingress_connections(
    ingress: Ingress, request: pytest.FixtureRequest, route: str
) -> tuple[set[int], set[int]]:
    """The local ports of the ingress's connections to PostgreSQL (5432) and
    to the PgBouncer (when the route has one)."""
    bouncer_port = request.getfixturevalue("pgbouncer").port if route == "pgbouncer" else None
    to_postgres, to_pgbouncer = set(), set()
    for connection in psutil.Process(ingress.process.pid).net_connections(kind="tcp"):
        if connection.raddr and connection.status == psutil.CONN_ESTABLISHED:
            if connection.raddr.port == POSTGRES_PORT:
                to_postgres.add(connection.laddr.port)
            elif connection.raddr.port == bouncer_port:
                to_pgbouncer.add(connection.laddr.port)
    return to_postgres, to_pgbouncer
