"""Catch-up of a GitLab source: its hook's recorded events, then a scan of its
issues and merge requests created since a time -- each item a task once,
however often it runs and whichever entrance stored it first -- against the
fake GitLab (bench/fakes/gitlab_api.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import select

from bench.fakes.gitlab_api import FakeGitLab
from models.catchup import gitlab_settings, set_gitlab_access
from models.db import session_scope
from models.errors import InvalidSource
from models.intake import read_delivery
from models.providers import PROVIDERS
from models.sources import add_source
from models.tables import CatchUpRun, Delivery, Task, WebhookSource, utcnow
from tests.support.deliveries import fixture, gitlab_issue_opened
from tests.support.feeds import store_delivery
from tests.support.runs import run
from tests.support.scenarios import SECRET
from tests.support.stores import Store
from worker.catchup.api import BadCredentials
from worker.catchup.service import catch_up_gitlab

TOKEN = "glpat-catch-up-token-never-shown"
PROJECT = "gitlabhq/gitlab-test"
SLUG = "acme-gitlab"
HOOK_URL = f"https://taskhook.example.com/webhooks/gitlab/{SLUG}"
GITLAB = PROVIDERS["gitlab"]


@pytest.fixture
def gitlab():
    with FakeGitLab(token=TOKEN) as fake:
        fake.add_project(PROJECT)
        yield fake


def a_gitlab_source(
    store: Store,
    gitlab: FakeGitLab,
    *,
    owner: str = f"projects/{PROJECT}",
    hook_id: str | None = None,
    events=("Issue Hook.open", "Merge Request Hook.open"),
) -> int:
    workspace = store.workspace()
    with session_scope(store.sessions) as session:
        source = add_source(
            session=session,
            provider="gitlab",
            workspace_id=workspace.id,
            slug=SLUG,
            secret=SECRET,
            create_events=list(events),
        )
        set_gitlab_access(
            session=session,
            slug=SLUG,
            owner=owner,
            token=TOKEN,
            hook_id=hook_id,
            site_url=gitlab.base_url,
        )
        return source.id


def catch_up(store: Store, sent: list[int] | None = None, **options):
    sent = [] if sent is None else sent
    options.setdefault("since", utcnow() - timedelta(days=2))
    return catch_up_gitlab(sessions=store.sessions, slug=SLUG, send=sent.extend, **options)


def drain(store: Store, pks: list[int]) -> None:
    for pk in pks:
        assert run(store, pk).status.value == "done"


def tasks(store: Store) -> list[str]:
    with session_scope(store.sessions) as session:
        return sorted(session.scalars(select(Task.external_id)))


def an_issue(gitlab: FakeGitLab, iid: int, **fields):
    """Issue ``iid`` of PROJECT as gitlab_issue_opened(iid)'s webhook names it."""
    return gitlab.create_issue(
        PROJECT,
        iid=iid,
        id=300 + iid,
        web_url=f"http://example.com/{PROJECT}/-/issues/{iid}",
        **fields,
    )


def test_issues_and_merge_requests_created_since_become_tasks_once_however_often_it_runs(
    store: Store, gitlab: FakeGitLab
):
    a_gitlab_source(store, gitlab)
    now = utcnow()
    for iid in range(1, 31):  # 1..5 were created before the window
        an_issue(gitlab, iid, created_at=now - timedelta(hours=40 - iid))
    gitlab.create_merge_request(PROJECT, title="Fix checkout", created_at=now - timedelta(hours=1))
    sent: list[int] = []

    # Half an hour past issue 5, not on its very moment (see the Jira search's test).
    report = catch_up(store, sent, since=now - timedelta(hours=34, minutes=30))

    assert report.kind == "gitlab" and report.hook_id is None  # no hook posts to the source
    assert report.items_listed == 26
    assert report.missed[0] == f"scan:gl-issue/{PROJECT}#6"  # oldest first
    assert len(report.recovered) == len(sent) == 26
    drain(store, sent)
    assert tasks(store) == sorted(
        [f"gl-issue/{PROJECT}#{iid}" for iid in range(6, 31)] + [f"gl-mr/{PROJECT}!1"]
    )
    with session_scope(store.sessions) as session:
        assert session.get(CatchUpRun, report.run_id).covered_until == report.started_at
        origins = {(row.origin, row.event) for row in session.scalars(select(Delivery))}
    assert origins == {("scan", "Issue Hook.open"), ("scan", "Merge Request Hook.open")}
    listing = next(r for r in gitlab.requests if r.path.endswith("/issues"))
    assert listing.query["order_by"] == "created_at" and listing.query["sort"] == "desc"
    assert listing.path == "/api/v4/projects/gitlabhq%2Fgitlab-test/issues"

    again = catch_up(store, since=None)  # from the last run's end
    assert again.missed == [] and again.recovered == []
    assert len(tasks(store)) == 26


def test_the_hooks_events_are_stored_under_their_own_ids_and_the_scan_leaves_their_items_alone(
    store: Store, gitlab: FakeGitLab
):
    a_gitlab_source(store, gitlab)
    gitlab.add_hook(f"projects/{PROJECT}", "https://elsewhere.example.com/hook")
    hook = gitlab.add_hook(f"projects/{PROJECT}", HOOK_URL)  # found by its URL
    an_issue(gitlab, 7)
    an_issue(gitlab, 8)
    opened = json.loads(gitlab_issue_opened(7))
    # GitLab tried twice (one Idempotency-Key), got no answer, then gave up.
    for _ in range(2):
        gitlab.record_event(hook, event="Issue Hook", payload=opened, idempotency_key="key-7")
    gitlab.record_event(
        hook, event="Push Hook", payload=json.loads(fixture("gitlab", "push_hook__two_commits"))
    )
    gitlab.record_event(hook, event="Issue Hook", payload=None)  # too large to log
    sent: list[int] = []

    report = catch_up(store, sent)

    assert report.hook_id == str(hook)
    assert report.attempts_listed == 4 and report.deliveries_listed == 1 + 2
    assert report.missed == ["key-7", f"scan:gl-issue/{PROJECT}#8"]
    assert list(report.refused.values()) == [
        "GitLab kept no body (too large to log); the scan reads its item"
    ]
    drain(store, sent)
    assert tasks(store) == [f"gl-issue/{PROJECT}#7", f"gl-issue/{PROJECT}#8"]
    with session_scope(store.sessions) as session:
        row = session.scalars(select(Delivery).where(Delivery.delivery_id == "key-7")).one()
        assert row.origin == "catch-up" and row.event == "Issue Hook.open"
        assert "x-gitlab-token" not in {name.lower() for name in row.headers}

    again = catch_up(store)
    assert again.missed == [] and again.recovered == []


def test_a_webhook_stored_first_and_the_scan_make_one_task(store: Store, gitlab: FakeGitLab):
    source_id = a_gitlab_source(store, gitlab)
    body = gitlab_issue_opened(9)
    payload = json.loads(body)
    reading = read_delivery(GITLAB, "Issue Hook.open", payload, None)
    webhook = store_delivery(
        store.sessions, source_id, body=body, event="Issue Hook.open", reading=reading
    )
    an_issue(gitlab, 9)  # not yet worked: the scan stores its own delivery of it

    report = catch_up(store)

    assert report.missed == [f"scan:gl-issue/{PROJECT}#9"]
    drain(store, [webhook, *report.recovered])
    assert tasks(store) == [f"gl-issue/{PROJECT}#9"]


def test_a_configured_hook_and_a_gitlab_that_does_not_date_its_events(
    store: Store, gitlab: FakeGitLab
):
    hook = gitlab.add_hook(f"projects/{PROJECT}", "https://proxy.example.com/in")
    a_gitlab_source(store, gitlab, hook_id=str(hook))
    gitlab.with_created_at = False
    for iid in range(1, 26):  # two pages of events at most 20 each
        gitlab.record_event(hook, event="Issue Hook", payload=json.loads(gitlab_issue_opened(iid)))

    report = catch_up(store, dry_run=True)

    assert report.hook_id == str(hook) and report.attempts_listed == 25
    assert len(report.missed) == 25 and report.recovered == []
    assert {r.query.get("per_page") for r in gitlab.requests if r.path.endswith("/events")} == {
        "20"
    }
    with session_scope(store.sessions) as session:
        assert session.scalars(select(Delivery)).all() == []
        assert session.get(CatchUpRun, report.run_id).covered_until is None


def test_a_group_is_scanned_across_its_projects(store: Store, gitlab: FakeGitLab):
    gitlab.add_group("acme")
    gitlab.add_project("acme/widgets")
    gitlab.add_project("acme/tools/cli")
    gitlab.create_issue(
        "acme/widgets", web_url="https://gitlab.example.com/acme/widgets/-/issues/1"
    )
    gitlab.create_merge_request("acme/tools/cli")
    gitlab.create_issue(PROJECT)  # another group's
    a_gitlab_source(store, gitlab, owner="groups/acme")

    report = catch_up(store)

    drain(store, report.recovered)
    assert tasks(store) == ["gl-issue/acme/widgets#1", "gl-mr/acme/tools/cli!1"]


def test_a_token_gitlab_refuses_is_one_clear_error_recorded_on_the_run(
    store: Store, gitlab: FakeGitLab
):
    a_gitlab_source(store, gitlab)
    gitlab.token = "another"
    with pytest.raises(BadCredentials, match="rejected the token") as refused:
        catch_up(store)
    assert TOKEN not in str(refused.value)
    with session_scope(store.sessions) as session:
        run_row = session.scalars(select(CatchUpRun)).one()
        assert run_row.covered_until is None and "BadCredentials" in run_row.error


def test_gitlab_access_is_checked_and_a_github_source_is_told_so(store: Store, gitlab: FakeGitLab):
    source_id = a_gitlab_source(store, gitlab)
    with session_scope(store.sessions) as session:
        workspace_id = session.get(WebhookSource, source_id).workspace_id
        settings = gitlab_settings(session=session, slug=SLUG)
        assert settings.api_base_url == f"{gitlab.base_url}/api/v4"
        assert TOKEN not in repr(settings)
        with pytest.raises(InvalidSource, match="numeric id or its full path"):
            set_gitlab_access(session=session, slug=SLUG, owner="projects/a b", token=TOKEN)
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace_id,
            slug="acme-github",
            secret=SECRET,
            create_events=["issues.opened"],
        )
        with pytest.raises(InvalidSource, match="is a github source, not GitLab's"):
            gitlab_settings(session=session, slug="acme-github")


def test_a_gitlab_that_keeps_no_hook_events_is_scanned_all_the_same(
    store: Store, gitlab: FakeGitLab
):
    a_gitlab_source(store, gitlab, hook_id="999")  # no such hook: GitLab answers 404
    an_issue(gitlab, 3)
    gitlab.fail_next()  # and a 5xx on the way, retried
    report = catch_up(store)
    assert "GitLab answered 404" in report.hook_note and TOKEN not in report.hook_note
    assert report.missed == [f"scan:gl-issue/{PROJECT}#3"]
    with session_scope(store.sessions) as session:
        assert session.get(CatchUpRun, report.run_id).covered_until == report.started_at


def test_a_scan_stored_first_and_the_webhook_arriving_later_make_one_task(
    store: Store, gitlab: FakeGitLab
):
    source_id = a_gitlab_source(store, gitlab)
    an_issue(gitlab, 11)
    report = catch_up(store)
    drain(store, report.recovered)

    body = gitlab_issue_opened(11)  # the hook enabled again: GitLab's own delivery of it
    reading = read_delivery(GITLAB, "Issue Hook.open", json.loads(body), None)
    late = store_delivery(
        store.sessions, source_id, body=body, event="Issue Hook.open", reading=reading
    )
    drain(store, [late])

    assert tasks(store) == [f"gl-issue/{PROJECT}#11"]
