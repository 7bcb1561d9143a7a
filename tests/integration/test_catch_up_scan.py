"""The GitHub state scan: a repository's issues and pull requests created
since a time become tasks, once each, however often it runs -- against the
fake GitHub (bench/fakes/github_api.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import select

from bench.fakes.github_api import FakeGitHub
from models.access import Caller
from models.catchup import set_app_access, set_log_access
from models.db import session_scope
from models.errors import InvalidSource
from models.providers.github import GITHUB
from models.sources import add_source
from models.tables import CatchUpRun, Delivery, Task, Workspace, utcnow
from models.tasks import delete_task, release_external_id
from tests.support.runs import run
from tests.support.scenarios import SECRET
from tests.support.stores import Store
from worker.catchup.api import ApiUnavailable, BadCredentials
from worker.catchup.service import scan_github

TOKEN = "ghp_scan_token_never_shown"
REPO = "acme/widgets"


@pytest.fixture
def github():
    with FakeGitHub(token=TOKEN) as fake:
        fake.add_repo(REPO)
        yield fake


def a_github_source(store: Store, *, events=("issues.opened", "pull_request.opened")) -> int:
    workspace = store.workspace()
    with session_scope(store.sessions) as session:
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug="acme-github",
            secret=SECRET,
            create_events=list(events),
        )
    return workspace.id


def with_token(store: Store, github: FakeGitHub, target: str = f"repos/{REPO}") -> None:
    with session_scope(store.sessions) as session:
        set_log_access(
            session=session,
            slug="acme-github",
            target=target,
            hook_id="123",
            token=TOKEN,
            api_base_url=github.base_url,
        )


def scan(store: Store, sent: list[int] | None = None, **options):
    sent = [] if sent is None else sent
    options.setdefault("since", utcnow() - timedelta(days=30))
    return scan_github(sessions=store.sessions, slug="acme-github", send=sent.extend, **options)


def drain(store: Store, pks: list[int]) -> None:
    for pk in pks:
        assert run(store, pk).status.value == "done"


def titles(store: Store) -> list[str]:
    with session_scope(store.sessions) as session:
        return sorted(session.scalars(select(Task.title)))


def test_items_created_since_become_tasks_once_however_often_it_runs(
    store: Store, github: FakeGitHub
):
    a_github_source(store)
    with_token(store, github)
    now = utcnow()
    github.page_size_cap = 10  # several pages
    for number in range(1, 26):
        github.open_issue(
            REPO,
            title=f"Issue {number}",
            created_at=now - timedelta(days=40 - number),  # 1..10 before the window
            pull_request=number % 5 == 0,
        )
    github.close_issue(REPO, 24)  # closed since: a create all the same (state=all)
    sent: list[int] = []

    report = scan(store, sent)

    created_since = [n for n in range(1, 26) if 40 - n < 30]
    assert len(report.missed) == len(report.recovered) == len(sent) == len(created_since)
    assert report.missed[0] == f"scan:gh-issue/{REPO}#{created_since[0]}"  # oldest first
    drain(store, sent)
    expected = sorted(f"Issue {n}" for n in created_since)
    assert titles(store) == expected
    with session_scope(store.sessions) as session:
        rows = session.scalars(select(Delivery)).all()
        assert {row.origin for row in rows} == {"scan"}
        assert {row.event for row in rows} == {"issues.opened", "pull_request.opened"}
        assert {row.catchup_run_id for row in rows} == {report.run_id}
        pulls = {row.external_id for row in rows if row.event == "pull_request.opened"}
        assert pulls == {f"gh-pr/{REPO}#{n}" for n in created_since if n % 5 == 0}
        run_row = session.get(CatchUpRun, report.run_id)
        assert run_row.kind == "scan" and run_row.covered_until == report.started_at

    again = scan(store)
    assert again.missed == [] and again.recovered == []
    assert titles(store) == expected


def test_an_item_the_workspace_had_a_task_for_is_left_alone_even_once_released(
    store: Store, github: FakeGitHub
):
    workspace_id = a_github_source(store, events=["issues.opened"])
    with_token(store, github)
    for number in (1, 2, 3):
        github.open_issue(REPO, title=f"Issue {number}")
    github.open_issue(REPO, title="A pull request", pull_request=True)  # no task for these
    first = scan(store)
    drain(store, first.recovered)
    assert len(first.recovered) == 3  # the pull request is not a create of this source
    with session_scope(store.sessions) as session:
        release_external_id(
            session=session,
            workspace_id=workspace_id,
            external_id=f"gh-issue/{REPO}#2",
            operator="ops",
            reason="made by mistake",
        )
        # and a delivery row of the scan removed: the identity alone still says "had it"
        session.execute(
            Delivery.__table__.delete().where(Delivery.delivery_id == f"scan:gh-issue/{REPO}#2")
        )
    github.open_issue(REPO, title="Issue 5")

    again = scan(store)

    assert again.missed == [f"scan:gh-issue/{REPO}#5"]
    drain(store, again.recovered)
    assert titles(store) == ["Issue 1", "Issue 2", "Issue 3", "Issue 5"]


def test_a_deleted_task_never_comes_back_however_often_the_scan_runs(
    store: Store, github: FakeGitHub
):
    workspace_id = a_github_source(store, events=["issues.opened"])
    with_token(store, github)
    for number in (1, 2):
        github.open_issue(REPO, title=f"Issue {number}")
    drain(store, scan(store).recovered)
    with session_scope(store.sessions) as session:
        (first,) = session.scalars(
            select(Task).where(
                Task.workspace_id == workspace_id, Task.external_id == f"gh-issue/{REPO}#1"
            )
        )
        delete_task(session=session, caller=Caller.trusted("ops"), task_id=first.id)
        # the scan's delivery row pruned too: the ledger alone remembers
        session.execute(
            Delivery.__table__.delete().where(Delivery.delivery_id == f"scan:gh-issue/{REPO}#1")
        )

    again = scan(store)

    assert again.missed == [] and again.recovered == []
    assert titles(store) == ["Issue 2"]


def test_a_scan_cut_off_halfway_then_run_again_stores_nothing_twice_and_misses_nothing(
    store: Store, github: FakeGitHub
):
    a_github_source(store)
    with_token(store, github)
    for number in range(1, 11):
        github.open_issue(REPO, title=f"Issue {number}")
    github.fail_next(4, status=502)  # GitHub is down on every try: nothing listed or stored
    with pytest.raises(ApiUnavailable):
        scan(store, since=utcnow() - timedelta(days=1))

    def broker_is_down(pks: list[int]) -> None:
        raise ConnectionError("the broker went away")

    with pytest.raises(ConnectionError):
        scan_github(
            sessions=store.sessions,
            slug="acme-github",
            send=broker_is_down,
            since=utcnow() - timedelta(days=1),
        )
    with session_scope(store.sessions) as session:
        runs = session.scalars(select(CatchUpRun).order_by(CatchUpRun.id)).all()
        assert [run.error.split(":")[0] for run in runs] == ["ApiUnavailable", "ConnectionError"]
        assert {run.covered_until for run in runs} == {None}
        # Stored before any was sent: the unsent wait queued, for the sweeper.
        assert session.query(Delivery).count() == 10

    rest = scan(store, since=utcnow() - timedelta(days=1))

    assert rest.missed == [] and rest.recovered == []
    with session_scope(store.sessions) as session:
        drain(store, list(session.scalars(select(Delivery.id))))
    assert titles(store) == sorted(f"Issue {n}" for n in range(1, 11))


def test_a_dry_run_says_what_is_missing_and_stores_nothing(store: Store, github: FakeGitHub):
    a_github_source(store)
    with_token(store, github)
    github.open_issue(REPO, title="Issue 1")
    report = scan(store, dry_run=True)
    assert report.missed == [f"scan:gh-issue/{REPO}#1"] and report.recovered == []
    with session_scope(store.sessions) as session:
        assert session.query(Delivery).count() == 0
        assert session.get(CatchUpRun, report.run_id).covered_until is None


def test_an_organization_hook_is_scanned_one_named_repository_at_a_time(
    store: Store, github: FakeGitHub
):
    a_github_source(store)
    with_token(store, github, target="orgs/acme")
    github.open_issue(REPO, title="Issue 1")
    with pytest.raises(InvalidSource, match="--repo OWNER/REPO"):
        scan(store)
    with session_scope(store.sessions) as session:
        assert session.query(CatchUpRun).count() == 0  # refused before any run began
    report = scan(store, repo=REPO)
    assert len(report.recovered) == 1
    # One repository of the organization's: the source is not covered by it.
    assert report.covered_until is None


def test_a_github_app_scans_with_an_installation_token_its_jwt_mints(
    store: Store, github: FakeGitHub
):
    a_github_source(store)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()
    with session_scope(store.sessions) as session:
        set_app_access(
            session=session,
            slug="acme-github",
            app_id="4200",
            private_key=pem,
            api_base_url=github.base_url,
        )
    github.install_app(REPO)
    github.open_issue(REPO, title="Issue 1")

    report = scan(store, repo=REPO)

    assert len(report.recovered) == 1 and len(github.minted_tokens) == 1
    with pytest.raises(BadCredentials, match="not installed on acme/gadgets"):
        scan(store, repo="acme/gadgets")


def test_a_token_github_refuses_is_one_clear_error_recorded_on_the_run(
    store: Store, github: FakeGitHub
):
    a_github_source(store)
    with session_scope(store.sessions) as session:
        set_log_access(
            session=session,
            slug="acme-github",
            target=f"repos/{REPO}",
            hook_id="123",
            token="ghp_wrong_token",
            api_base_url=github.base_url,
        )
    with pytest.raises(BadCredentials) as raised:
        scan(store)
    assert "ghp_wrong_token" not in str(raised.value)
    with session_scope(store.sessions) as session:
        error = session.scalars(select(CatchUpRun.error)).one()
        assert "401" in error and "ghp_wrong_token" not in error


def test_a_body_the_scan_synthesizes_is_what_the_worker_reads(store: Store, github: FakeGitHub):
    a_github_source(store)
    with_token(store, github)
    github.open_issue(REPO, title="Widgets <b>break</b>", body="Steps: …")
    (pk,) = scan(store).recovered
    drain(store, [pk])
    with session_scope(store.sessions) as session:
        row = session.get(Delivery, pk)
        payload = json.loads(row.body)
        assert payload["action"] == "opened" and payload["repository"]["full_name"] == REPO
        assert payload["repository"]["id"] == github.repository_id(REPO)
        task = session.scalars(select(Task)).one()
        assert task.title == "Widgets <b>break</b>" and task.description == "Steps: …"
        assert session.scalar(select(Workspace.id)) == task.workspace_id


def stable_keys(store: Store, pks: list[int]) -> dict[str, str | None]:
    """The external id and the stable key each stored delivery's draft names."""
    with session_scope(store.sessions) as session:
        rows = [session.get(Delivery, pk) for pk in pks]
        drafts = [GITHUB.to_draft(row.event, json.loads(row.body)) for row in rows]
    return {draft.external_id: draft.stable_key for draft in drafts}


def test_a_scan_after_a_rename_names_each_item_by_the_stable_key_its_webhook_did(
    store: Store, github: FakeGitHub
):
    a_github_source(store)
    with_token(store, github)
    issue = github.open_issue(REPO, title="Issue 1")
    github.open_issue(REPO, title="Pull 2", pull_request=True)
    repository_id = github.repository_id(REPO)
    # What GitHub sent when the issue was opened, before the rename.
    webhook = {
        "action": "opened",
        "issue": issue,
        "repository": {"id": repository_id, "full_name": REPO},
    }
    sent_before = GITHUB.to_draft("issues.opened", webhook)

    before = stable_keys(store, scan(store).recovered)
    github.rename_repo(REPO, "acme/gadgets")
    after = stable_keys(store, scan(store, repo="acme/gadgets").recovered)

    assert before == {
        f"gh-issue/{REPO}#1": sent_before.stable_key,
        f"gh-pr/{REPO}#2": f"gh-pr-in-repo:{repository_id}#2",
    }
    assert sent_before.stable_key == f"gh-issue-in-repo:{repository_id}#1"
    # New external ids (the ledger's to recognise), the very same stable keys.
    assert after == {
        "gh-issue/acme/gadgets#1": sent_before.stable_key,
        "gh-pr/acme/gadgets#2": f"gh-pr-in-repo:{repository_id}#2",
    }
