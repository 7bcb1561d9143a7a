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
import pytest

from models.db import session_scope
from models.sources import add_source
from models.tokens import issue_token
from models.workspaces import create_workspace
from tests.support.deliveries import fixture, github_headers
from tests.support.processes import Ingress, StartWorker

pytestmark = pytest.mark.e2e

SECRET = "live-github-secret"


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
    sessions, start_worker: StartWorker, start_ingress: Callable[..., Ingress]
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
