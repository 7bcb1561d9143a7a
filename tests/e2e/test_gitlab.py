"""GitLab from fixture to task with real processes, as tests/e2e/test_pipeline.py
does for GitHub and Jira: uvicorn takes the documented bodies with GitLab's
headers, the relay hands them to the broker (Redis, then RabbitMQ), a Celery
worker makes the tasks in PostgreSQL. Nothing here is mocked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from models.db import session_scope
from models.sources import add_source
from models.tables import Delivery, Task, TaskSource
from models.workspaces import create_workspace
from tests.support.deliveries import fixture, gitlab_headers
from tests.support.processes import Ingress, StartWorker, finished, wait_until

pytestmark = pytest.mark.e2e
#: Runs once on Redis and once on RabbitMQ (tests/e2e/conftest.py).
ON_EVERY_BROKER = True

TOKEN = "e2e-gitlab-token"


@dataclass
class GitLabPipeline:
    ingress: Ingress
    sessions: sessionmaker[Session]
    workspace_id: int
    logs: list

    def post(self, name: str, delivery: str | None = None) -> httpx.Response:
        return httpx.post(
            f"{self.ingress.url}/webhooks/gitlab/e2e-gitlab",
            content=fixture("gitlab", name),
            headers=gitlab_headers(name, TOKEN, delivery=delivery),
            timeout=10,
        )

    def wait_done(self, *pks: int) -> None:
        wait_until(
            finished(self.sessions, *pks), timeout=60, what=f"deliveries {pks}", logs=self.logs
        )

    def tasks_with(self, external_id: str) -> list[tuple[Task, TaskSource]]:
        with self.sessions() as session:
            rows = session.execute(
                select(Task, TaskSource)
                .join(TaskSource, TaskSource.task_id == Task.id)
                .where(Task.workspace_id == self.workspace_id, Task.external_id == external_id)
            ).all()
            return [(task, source) for task, source in rows]


@pytest.fixture(scope="module")
def pipeline(
    sessions, start_worker: StartWorker, start_ingress: Callable[..., Ingress]
) -> GitLabPipeline:
    with session_scope(sessions) as session:
        workspace = create_workspace(session=session, slug="e2e-gl", name="GL", task_prefix="GL")
        add_source(
            session=session,
            provider="gitlab",
            workspace_id=workspace.id,
            slug="e2e-gitlab",
            secret=TOKEN,
            create_events=["Issue Hook.open", "Merge Request Hook.open"],
        )
        workspace_id = workspace.id
    worker = start_worker("gitlab")
    ingress = start_ingress()
    return GitLabPipeline(ingress, sessions, workspace_id, [worker, ingress.process])


@pytest.mark.parametrize(
    ("name", "external_id", "url"),
    [
        (
            "issue_hook__open",
            "gl-issue/gitlabhq/gitlab-test#23",
            "http://example.com/diaspora/issues/23",
        ),
        (
            "merge_request_hook__open",
            "gl-mr/gitlabhq/gitlab-test!1",
            "http://example.com/diaspora/merge_requests/1",
        ),
    ],
)
def test_a_posted_gitlab_fixture_becomes_its_task(pipeline: GitLabPipeline, name, external_id, url):
    # The same event delivered three times (GitLab's retries keep the key): one task.
    key = f"e2e-{name}"
    answers = [pipeline.post(name, delivery=key) for _ in range(3)]

    assert [a.status_code for a in answers] == [202] * 3, answers[0].text
    assert [a.json()["status"] for a in answers] == ["queued", "duplicate", "duplicate"]
    pipeline.wait_done(answers[0].json()["delivery"])
    ((task, source),) = pipeline.tasks_with(external_id)
    assert task.external_id_settled_at is not None
    assert (source.provider, source.url) == ("gitlab", url)
    with pipeline.sessions() as session:
        row = session.scalars(select(Delivery).where(Delivery.delivery_id == key)).one()
    assert (row.status, row.task_id) == ("done", task.id)


def test_a_comment_is_stored_ignored_and_makes_no_task(pipeline: GitLabPipeline):
    response = pipeline.post("note_hook__issue_create")

    assert (response.status_code, response.json()) == (202, {"status": "ignored"})
