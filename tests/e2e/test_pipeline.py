"""The whole pipeline with real processes: uvicorn takes signed fixture bodies,
the relay hands them to Redis, a Celery worker turns them into tasks in
PostgreSQL. Nothing here is mocked."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from models.db import session_scope
from models.sources import add_source
from models.tables import Delivery, Task, TaskSource
from models.workspaces import create_workspace
from tests.support.deliveries import fixture, github_headers, jira_headers
from tests.support.processes import Ingress, StartWorker, finished, wait_until

pytestmark = pytest.mark.e2e
#: Runs once on Redis and once on RabbitMQ, and on Redis again with the
#: processes behind a PgBouncer in transaction mode (tests/e2e/conftest.py).
ON_EVERY_BROKER = True
THROUGH_PGBOUNCER_TOO = True

GITHUB_SECRET, JIRA_SECRET = "e2e-github-secret", "e2e-jira-secret"


@dataclass
class Pipeline:
    ingress: Ingress
    sessions: sessionmaker[Session]
    workspace_id: int
    logs: list

    def post_github(self, name: str, delivery: str | None = None) -> httpx.Response:
        body = fixture("github", name)
        headers = github_headers(name, body, GITHUB_SECRET, delivery=delivery)
        return httpx.post(
            f"{self.ingress.url}/webhooks/github/e2e-github",
            content=body,
            headers=headers,
            timeout=10,
        )

    def post_jira(self, name: str, delivery: str | None = None) -> httpx.Response:
        body = fixture("jira", name)
        headers = jira_headers(body, JIRA_SECRET, delivery=delivery)
        return httpx.post(
            f"{self.ingress.url}/webhooks/jira/e2e-jira", content=body, headers=headers, timeout=10
        )

    def wait_done(self, *pks: int) -> None:
        wait_until(
            finished(self.sessions, *pks), timeout=60, what=f"deliveries {pks}", logs=self.logs
        )

    def task_with(self, external_id: str) -> tuple[Task, TaskSource] | None:
        with self.sessions() as session:
            row = session.execute(
                select(Task, TaskSource)
                .join(TaskSource, TaskSource.task_id == Task.id)
                .where(Task.workspace_id == self.workspace_id, Task.external_id == external_id)
            ).one_or_none()
            return None if row is None else (row[0], row[1])


@pytest.fixture(scope="module")
def pipeline(
    sessions, start_worker: StartWorker, start_ingress: Callable[..., Ingress]
) -> Pipeline:
    with session_scope(sessions) as session:
        workspace = create_workspace(session=session, slug="e2e", name="E2E", task_prefix="E2E")
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug="e2e-github",
            secret=GITHUB_SECRET,
            create_events=["issues.opened", "pull_request.opened"],
        )
        add_source(
            session=session,
            provider="jira",
            workspace_id=workspace.id,
            slug="e2e-jira",
            secret=JIRA_SECRET,
            create_events=["jira:issue_created"],
            site_url="https://e2e.atlassian.net",
        )
        workspace_id = workspace.id
    worker = start_worker("pipeline", beat=True)
    ingress = start_ingress()
    return Pipeline(ingress, sessions, workspace_id, [worker, ingress.process])


@pytest.mark.parametrize(
    ("provider", "name", "external_id", "url"),
    [
        (
            "github",
            "issues__opened",
            "gh-issue/Codertocat/Hello-World#1",
            "https://github.com/Codertocat/Hello-World/issues/1",
        ),
        (
            "github",
            "pull_request__opened",
            "gh-pr/Codertocat/Hello-World#2",
            "https://github.com/Codertocat/Hello-World/pull/2",
        ),
        (
            "jira",
            "jira_issue_created__cloud",
            "jira:TES-41",
            "https://e2e.atlassian.net/browse/TES-41",
        ),
    ],
)
def test_a_posted_fixture_becomes_its_task(pipeline: Pipeline, provider, name, external_id, url):
    post = pipeline.post_github if provider == "github" else pipeline.post_jira
    response = post(name)
    assert response.status_code == 202, response.text
    pipeline.wait_done(response.json()["delivery"])

    task, source = pipeline.task_with(external_id)
    assert task.external_id_settled_at is not None
    assert (source.provider, source.url) == (provider, url)


def test_the_same_delivery_posted_five_times_makes_one_task(pipeline: Pipeline):
    answers = [
        pipeline.post_jira("jira_issue_created__cloud_many_fields", delivery="77001")
        for _ in range(5)
    ]

    assert [a.json()["status"] for a in answers] == ["queued"] + ["duplicate"] * 4
    pipeline.wait_done(answers[0].json()["delivery"])
    with pipeline.sessions() as session:
        rows = session.scalars(select(Delivery).where(Delivery.delivery_id == "77001")).all()
        external_id = rows[0].task_id and session.get(Task, rows[0].task_id).external_id
        same = session.scalars(select(Task).where(Task.external_id == external_id)).all()
    assert len(rows) == 1 and len(same) == 1


def test_a_burst_shares_messages_and_every_delivery_becomes_its_task(pipeline: Pipeline):
    # Posted all at once, the keys reach the relay together and go out several
    # to a message (TASKHOOK_RELAY_KEYS_PER_MESSAGE, 16 by default).
    payload = json.loads(fixture("jira", "jira_issue_created__cloud"))

    def post(number: int) -> httpx.Response:
        issue = {**payload["issue"], "key": f"BURST-{number}", "id": str(50000 + number)}
        payload_n = {**payload, "issue": issue}
        body = json.dumps(payload_n).encode()
        return httpx.post(
            f"{pipeline.ingress.url}/webhooks/jira/e2e-jira",
            content=body,
            headers=jira_headers(body, JIRA_SECRET),
            timeout=10,
        )

    with ThreadPoolExecutor(max_workers=40) as pool:
        answers = list(pool.map(post, range(40)))

    assert [a.json()["status"] for a in answers] == ["queued"] * 40
    pipeline.wait_done(*(a.json()["delivery"] for a in answers))
    with pipeline.sessions() as session:
        created = session.scalars(
            select(Task.external_id).where(Task.external_id.like("jira:BURST-%"))
        ).all()
        outcomes = session.scalars(
            select(Delivery.outcome).where(Delivery.id.in_([a.json()["delivery"] for a in answers]))
        ).all()
    assert sorted(created) == sorted(f"jira:BURST-{n}" for n in range(40))
    assert outcomes == ["created"] * 40
    worker_log = pipeline.logs[0].text()
    assert "Task taskhook.process_deliveries[" in worker_log, "no message held several keys"


def peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])


def test_a_chunked_body_over_the_limit_is_refused_without_buffering_it(pipeline: Pipeline):
    server = pipeline.ingress.process.pid
    peak_before = peak_rss_kib(server)

    def endless():
        for _ in range(200 * 1024):  # 200 MiB, chunked: no Content-Length to trust
            yield b"x" * 1024

    with contextlib.suppress(httpx.HTTPError):  # the server may hang up after its 413
        response = httpx.post(
            f"{pipeline.ingress.url}/webhooks/jira/e2e-jira",
            content=endless(),
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        assert response.status_code == 413

    # Had the server buffered the body, its peak RSS would have grown by ~200 MiB.
    assert peak_rss_kib(server) - peak_before < 40 * 1024
    assert httpx.get(f"{pipeline.ingress.url}/healthz").status_code == 200
