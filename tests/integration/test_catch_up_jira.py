"""Catch-up of a Jira source by a search of its site: the issues created
since a time become tasks, once each, however often it runs -- against the
fake Jira (bench/fakes/jira_api.py), Cloud and Data Center, on SQLite and
PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select

from bench.fakes.jira_api import FakeJira
from models.catchup import jira_settings, set_jira_access, set_log_access
from models.db import session_scope
from models.errors import InvalidSource
from models.providers.jira import JIRA
from models.sources import add_source
from models.tables import CatchUpRun, CatchUpSource, Delivery, Task, utcnow
from tests.support.runs import run
from tests.support.scenarios import SECRET
from tests.support.stores import Store
from worker.catchup.api import ApiUnavailable, BadCredentials, UnexpectedResponse
from worker.catchup.jira_search import JiraSearch
from worker.catchup.service import catch_up_jira

EMAIL, API_TOKEN, PAT = "ops@acme.example", "ATATT3x-jira-token-never-shown", "jira-pat-never-shown"


@pytest.fixture
def jira():
    with FakeJira(email=EMAIL, api_token=API_TOKEN, pat=PAT) as fake:
        fake.add_project("OPS")
        yield fake


def a_jira_source(store: Store, jira: FakeJira, *, cloud: bool = True, jql: str | None = None):
    workspace = store.workspace()
    with session_scope(store.sessions) as session:
        add_source(
            session=session,
            provider="jira",
            workspace_id=workspace.id,
            slug="acme-jira",
            secret=SECRET,
            create_events=["jira:issue_created"],
            site_url=jira.base_url,
        )
        set_jira_access(
            session=session,
            slug="acme-jira",
            token=API_TOKEN if cloud else PAT,
            email=EMAIL if cloud else None,
            jql=jql,
        )
    return workspace.id


def search(store: Store, sent: list[int] | None = None, **options):
    sent = [] if sent is None else sent
    return catch_up_jira(sessions=store.sessions, slug="acme-jira", send=sent.extend, **options)


def drain(store: Store, pks: list[int]) -> None:
    for pk in pks:
        assert run(store, pk).status.value == "done"


def tasks(store: Store) -> list[tuple[str, str]]:
    with session_scope(store.sessions) as session:
        return sorted(tuple(row) for row in session.execute(select(Task.external_id, Task.title)))


@pytest.mark.parametrize("cloud", [True, False], ids=["cloud", "data center"])
def test_issues_created_since_become_tasks_once_however_often_it_runs(
    store: Store, jira: FakeJira, cloud: bool
):
    a_jira_source(store, jira, cloud=cloud)
    jira.page_size_cap = 20  # several Cloud pages
    now = utcnow()
    for number in range(1, 61):
        # 1..10 were created before the window
        jira.create_issue(summary=f"Issue {number}", created_at=now - timedelta(hours=70 - number))
    sent: list[int] = []

    # Half an hour past issue 10, not on it: the fake keeps milliseconds, so
    # a window starting at its very moment held it one run in a thousand.
    report = search(store, sent, since=now - timedelta(hours=59, minutes=30))

    assert report.kind == "search"
    assert len(report.recovered) == len(sent) == 50
    assert report.missed[0] == "scan:jira:PROJ-11"  # oldest first
    drain(store, sent)
    assert tasks(store) == sorted((f"jira:PROJ-{n}", f"Issue {n}") for n in range(11, 61))
    with session_scope(store.sessions) as session:
        rows = session.scalars(select(Delivery)).all()
        assert {(row.origin, row.event) for row in rows} == {("scan", "jira:issue_created")}
        assert session.get(CatchUpRun, report.run_id).covered_until == report.started_at
    jql = jira.requests[0].query["jql"]
    assert jql.startswith("created >= -") and jql.endswith("ORDER BY created DESC")

    again = search(store)  # from the last run's end
    assert again.missed == [] and again.recovered == []
    assert len(tasks(store)) == 50


def test_the_sources_filter_narrows_the_search(store: Store, jira: FakeJira):
    a_jira_source(store, jira, jql="project = OPS")
    jira.create_issue(project="PROJ", summary="Not ours")
    jira.create_issue(project="OPS", summary="Ours")
    report = search(store, since=utcnow() - timedelta(hours=1))
    drain(store, report.recovered)
    assert tasks(store) == [("jira:OPS-1", "Ours")]
    assert jira.requests[0].query["jql"].startswith("(project = OPS) AND created >= -")


def test_a_filter_jira_cannot_run_is_one_clear_error(store: Store, jira: FakeJira):
    a_jira_source(store, jira, jql="project = NOPE")
    with pytest.raises(UnexpectedResponse, match="check the source's JQL filter"):
        search(store, since=utcnow() - timedelta(hours=1))


@pytest.mark.parametrize("cloud", [True, False], ids=["cloud", "data center"])
def test_a_credential_jira_refuses_is_one_clear_error_recorded_on_the_run(
    store: Store, jira: FakeJira, cloud: bool
):
    a_jira_source(store, jira, cloud=cloud)
    with session_scope(store.sessions) as session:
        session.get(CatchUpSource, 1).token = "wrong-token"
    with pytest.raises(BadCredentials, match="401") as raised:
        search(store, since=utcnow() - timedelta(hours=1))
    assert "wrong-token" not in str(raised.value)
    with session_scope(store.sessions) as session:
        error = session.scalars(select(CatchUpRun.error)).one()
        assert "401" in error and "wrong-token" not in error and API_TOKEN not in error


def test_a_rate_limit_and_a_5xx_are_waited_out(store: Store, jira: FakeJira):
    a_jira_source(store, jira)
    jira.create_issue(summary="Issue 1")
    jira.rate_limit_next(1, retry_after=1)
    jira.fail_next(1, status=503)
    report = search(store, since=utcnow() - timedelta(hours=1))
    assert len(report.recovered) == 1


def test_a_search_cut_off_halfway_then_run_again_stores_nothing_twice(store: Store, jira: FakeJira):
    a_jira_source(store, jira)
    jira.page_size_cap = 3
    for number in range(1, 9):
        jira.create_issue(summary=f"Issue {number}")

    class GoneAfterOnePage(JiraSearch):
        pages = 0

        def _page(self, path, params):
            if GoneAfterOnePage.pages == 1:
                raise ApiUnavailable("Jira answered 503 on each of 4 tries")
            GoneAfterOnePage.pages += 1
            return super()._page(path, params)

    def cut_off(settings):
        return GoneAfterOnePage(
            site_url=settings.site_url, token=settings.token, email=settings.email
        )

    # The second page never comes: nothing is stored from a search read in part.
    with pytest.raises(ApiUnavailable):
        search(store, since=utcnow() - timedelta(hours=1), open_search=cut_off)
    assert GoneAfterOnePage.pages == 1
    with session_scope(store.sessions) as session:
        assert session.query(Delivery).count() == 0

    first = search(store)  # no complete run yet: from three days back
    again = search(store)
    assert len(first.recovered) == 8 and again.missed == []
    drain(store, first.recovered)
    assert len(tasks(store)) == 8


def test_jira_access_is_checked_and_its_token_never_shown(store: Store, jira: FakeJira):
    a_jira_source(store, jira)
    with session_scope(store.sessions) as session:
        settings = jira_settings(session=session, slug="acme-jira")
        assert settings.site_url == jira.base_url and settings.email == EMAIL
        assert API_TOKEN not in repr(settings)
        for bad in (
            {"email": "not-an-email"},
            {"jql": "project = OPS ORDER BY key"},
            {"jql": "two\nlines"},
        ):
            with pytest.raises(InvalidSource):
                set_jira_access(session=session, slug="acme-jira", token=API_TOKEN, **bad)
        with pytest.raises(InvalidSource, match="this access is for GitHub"):
            set_log_access(session=session, slug="acme-jira", target="orgs/acme", token="t")


def test_a_search_names_each_issue_by_the_stable_key_its_webhook_does(store: Store, jira: FakeJira):
    # issue.id stays when an issue moves to another project (docs/contract.md
    # §15, "Stable keys"): a search after a move names the issue as before.
    a_jira_source(store, jira)
    created = jira.create_issue(summary="Issue 1")
    webhook = {"webhookEvent": "jira:issue_created", "issue": created}
    sent_by_jira = JIRA.to_draft("jira:issue_created", webhook, site=jira.base_url)

    (pk,) = search(store, since=utcnow() - timedelta(hours=1)).recovered

    with session_scope(store.sessions) as session:
        row = session.get(Delivery, pk)
        draft = JIRA.to_draft(row.event, json.loads(row.body), site=jira.base_url)
    host = urlsplit(jira.base_url).netloc
    assert draft.stable_key == sent_by_jira.stable_key == f"jira-issue:{host}/{created['id']}"
