"""Catch-up end to end: 50 issues opened while the ingress was down, in the
fake GitHub's log as failed deliveries; the real CLI recovers them, a real
worker makes 50 tasks, once each, and nothing is made twice -- not by a second
run, not by GitHub's own redelivery arriving late. The same with the state
scan (items older than the log), with Jira's search, and with GitLab's hook
events and scan. Real processes on PostgreSQL and Redis; GitHub, Jira and
GitLab are bench/fakes/."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import func, select

from bench.fakes.github_api import FakeGitHub
from bench.fakes.gitlab_api import FakeGitLab
from bench.fakes.jira_api import FakeJira
from models.catchup import set_gitlab_access, set_jira_access, set_log_access
from models.db import session_scope
from models.providers import PROVIDERS
from models.sources import add_source
from models.tables import Delivery, Task, WebhookSource, utcnow
from models.workspaces import create_workspace
from tests.support.deliveries import FIXTURES, github_headers, gitlab_issue_opened
from tests.support.processes import ROOT, finished, wait_until, worker_environment

pytestmark = pytest.mark.e2e
#: Runs once on Redis and once on RabbitMQ (tests/e2e/conftest.py).
ON_EVERY_BROKER = True

SECRET, TOKEN = "e2e-catch-up-secret", "ghp_e2e_catch_up"
HOOK = "repos/acme/widgets/hooks/4242"
ISSUES = 50


def issue(number: int) -> dict:
    payload = json.loads((FIXTURES / "github" / "issues__opened.json").read_text())
    payload["issue"]["number"] = number
    payload["issue"]["title"] = f"Opened during the outage, #{number}"
    return payload


def taskhook(postgres_url: str, broker_url: str, *args: str, secret: str = TOKEN) -> dict:
    """The real CLI in a process of its own, as an operator runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", *args, "--json"],
        cwd=ROOT,
        env=worker_environment(postgres_url, broker_url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert secret not in done.stdout + done.stderr
    return json.loads(done.stdout)


def test_fifty_issues_missed_during_an_outage_become_fifty_tasks_once(
    postgres_url, broker_url, sessions, start_worker, start_ingress
):
    with session_scope(sessions) as session:
        workspace = create_workspace(
            session=session, slug="outage", name="Outage", task_prefix="OUT"
        )
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug="outage-github",
            secret=SECRET,
            create_events=["issues.opened"],
        )
        workspace_id = workspace.id

    with FakeGitHub(token=TOKEN) as github:
        # The ingress is down: GitHub logs every delivery as failed.
        guids = [str(uuid.uuid4()) for _ in range(ISSUES)]
        for number, guid in enumerate(guids, start=1):
            github.log_delivery(
                hook=HOOK,
                guid=guid,
                event="issues",
                action="opened",
                payload=issue(number),
                status_code=0,  # GitHub got no answer at all
            )
        with session_scope(sessions) as session:
            set_log_access(
                session=session,
                slug="outage-github",
                target="repos/acme/widgets",
                hook_id="4242",
                token=TOKEN,
                api_base_url=github.base_url,
            )
        github.page_size_cap = 20  # three pages
        worker = start_worker("catch-up")
        ingress = start_ingress()

        run = ("catch-up", "github", "--source", "outage-github")
        first = taskhook(postgres_url, broker_url, *run)
        assert sorted(first["missed"]) == sorted(guids)
        wait_until(
            finished(sessions, *first["recovered"]),
            timeout=60,
            what="the recovered deliveries",
            logs=[worker, ingress.process],
        )

        again = taskhook(postgres_url, broker_url, *run, "--since", "1d")
        assert again["missed"] == [] and again["recovered"] == []

        # GitHub's own redelivery of one of them, arriving after all: the same
        # guid, the bytes GitHub signed. A duplicate, never a second task.
        body = json.dumps(issue(7)).encode()
        headers = github_headers("issues__opened", body, SECRET, delivery=guids[6])
        answer = httpx.post(
            f"{ingress.url}/webhooks/github/outage-github", content=body, headers=headers
        )
        assert answer.status_code == 202 and answer.json() == {"status": "duplicate"}

    with session_scope(sessions) as session:
        titles = session.scalars(select(Task.title).where(Task.workspace_id == workspace_id))
        assert sorted(titles) == sorted(issue(n)["issue"]["title"] for n in range(1, ISSUES + 1))
        # The module's tests share the database: this source's deliveries only.
        origins = session.execute(
            select(Delivery.origin, func.count())
            .join(WebhookSource, WebhookSource.id == Delivery.source_id)
            .where(WebhookSource.slug == "outage-github")
            .group_by(Delivery.origin)
        ).all()
        assert dict(origins) == {"catch-up": ISSUES}


def a_workspace_with(sessions, provider: str, slug: str, **source) -> int:
    with session_scope(sessions) as session:
        workspace = create_workspace(
            session=session, slug=f"{slug}-ws", name=slug, task_prefix=slug[:3].upper()
        )
        add_source(
            session=session,
            provider=provider,
            workspace_id=workspace.id,
            slug=slug,
            secret=SECRET,
            **source,
        )
        return workspace.id


def tasks_in(sessions, workspace_id: int) -> list[str]:
    with session_scope(sessions) as session:
        held = select(Task.external_id).where(Task.workspace_id == workspace_id)
        return sorted(session.scalars(held))


def test_fifty_items_older_than_the_log_become_fifty_tasks_once_by_a_scan(
    postgres_url, broker_url, sessions, start_worker
):
    workspace_id = a_workspace_with(
        sessions, "github", "scan-github", create_events=["issues.opened", "pull_request.opened"]
    )
    with FakeGitHub(token=TOKEN) as github:
        github.page_size_cap = 20  # three pages
        for number in range(1, ISSUES + 1):
            github.open_issue(
                "acme/widgets",
                title=f"Opened before the log's three days, #{number}",
                created_at=utcnow() - timedelta(days=10, minutes=number),
                pull_request=number % 10 == 0,
            )
        with session_scope(sessions) as session:
            set_log_access(
                session=session,
                slug="scan-github",
                target="repos/acme/widgets",
                hook_id="4242",
                token=TOKEN,
                api_base_url=github.base_url,
            )
        worker = start_worker("scan")
        scan = ("catch-up", "github", "--source", "scan-github", "--scan", "--since", "14d")
        first = taskhook(postgres_url, broker_url, *scan)
        assert len(first["recovered"]) == ISSUES
        wait_until(
            finished(sessions, *first["recovered"]), timeout=60, what="the scan", logs=[worker]
        )
        again = taskhook(postgres_url, broker_url, *scan)
        assert again["missed"] == [] and again["recovered"] == []

    expected = sorted(
        f"gh-{'pr' if n % 10 == 0 else 'issue'}/acme/widgets#{n}" for n in range(1, ISSUES + 1)
    )
    assert tasks_in(sessions, workspace_id) == expected


def test_fifty_jira_issues_missed_become_fifty_tasks_once_by_a_search(
    postgres_url, broker_url, sessions, start_worker
):
    token = "ATATT3x-e2e-jira-token"
    with FakeJira(email="ops@acme.example", api_token=token) as jira:
        workspace_id = a_workspace_with(
            sessions,
            "jira",
            "search-jira",
            create_events=["jira:issue_created"],
            site_url=jira.base_url,
        )
        jira.add_project("OPS")
        for number in range(1, ISSUES + 1):
            jira.create_issue(project="PROJ" if number % 2 else "OPS", summary=f"Missed, #{number}")
        with session_scope(sessions) as session:
            set_jira_access(
                session=session,
                slug="search-jira",
                token=token,
                email="ops@acme.example",
                jql="project = PROJ OR project = OPS",
            )
        worker = start_worker("search")
        run = ("catch-up", "jira", "--source", "search-jira")
        first = taskhook(postgres_url, broker_url, *run, secret=token)
        assert len(first["recovered"]) == ISSUES
        wait_until(
            finished(sessions, *first["recovered"]), timeout=60, what="the search", logs=[worker]
        )
        again = taskhook(postgres_url, broker_url, *run, secret=token)
        assert again["missed"] == [] and again["recovered"] == []

    assert len(tasks_in(sessions, workspace_id)) == ISSUES


def test_fifty_gitlab_issues_missed_become_fifty_tasks_once_from_events_and_a_scan(
    postgres_url, broker_url, sessions, start_worker, start_ingress
):
    token, project = "glpat-e2e-catch-up", "gitlabhq/gitlab-test"
    with FakeGitLab(token=token) as gitlab:
        workspace_id = a_workspace_with(
            sessions, "gitlab", "outage-gitlab", create_events=["Issue Hook.open"]
        )
        gitlab.add_project(project)
        hook = gitlab.add_hook(
            f"projects/{project}", "https://in.example.com/webhooks/gitlab/outage-gitlab"
        )
        keys = {}
        for iid in range(1, ISSUES + 1):
            gitlab.create_issue(
                project,
                iid=iid,
                id=300 + iid,
                web_url=f"http://example.com/{project}/-/issues/{iid}",
                title=f"Issue {iid}",
            )
            if iid <= ISSUES // 2:  # GitLab tried these, then disabled the hook
                keys[iid] = str(uuid.uuid4())
                payload = json.loads(gitlab_issue_opened(iid))
                gitlab.record_event(
                    hook, event="Issue Hook", payload=payload, idempotency_key=keys[iid]
                )
        with session_scope(sessions) as session:
            set_gitlab_access(
                session=session,
                slug="outage-gitlab",
                owner=f"projects/{project}",
                token=token,
                site_url=gitlab.base_url,
            )
        worker = start_worker("gitlab")
        ingress = start_ingress()
        run = ("catch-up", "gitlab", "--source", "outage-gitlab")
        first = taskhook(postgres_url, broker_url, *run, secret=token)
        assert len(first["recovered"]) == ISSUES
        assert sorted(first["missed"][: ISSUES // 2]) == sorted(keys.values())
        wait_until(
            finished(sessions, *first["recovered"]),
            timeout=60,
            what="the GitLab catch-up",
            logs=[worker, ingress.process],
        )
        again = taskhook(postgres_url, broker_url, *run, "--since", "1d", secret=token)
        assert again["missed"] == [] and again["recovered"] == []

        # GitLab's own retry of one of them, once the hook is enabled again:
        # the same Idempotency-Key. A duplicate, never a second task.
        body = gitlab_issue_opened(7)
        headers = PROVIDERS["gitlab"].sample_headers(
            body, SECRET, event="Issue Hook", delivery_id=keys[7]
        )
        answer = httpx.post(
            f"{ingress.url}/webhooks/gitlab/outage-gitlab", content=body, headers=headers
        )
        assert answer.status_code == 202 and answer.json() == {"status": "duplicate"}

    expected = sorted(f"gl-issue/{project}#{iid}" for iid in range(1, ISSUES + 1))
    assert tasks_in(sessions, workspace_id) == expected
