"""A delivery whose body holds a value no database stores ends dead, and makes no task.

The worker validates everything a create would write -- title, description,
the source link's url and remote key -- before the task row is inserted
(docs/contract.md, "Validation and normalization"). Before it did, the task
row committed and the source link's write then failed on the url: the task
was never settled, and every later delivery for the same issue parked behind
it. Each test runs on SQLite and on PostgreSQL with the fast path on and off.
"""

from __future__ import annotations

import json

import pytest

from models.db import session_scope
from models.inbox import DeliveryStatus
from models.intake import read_delivery
from models.providers import PROVIDERS
from models.sources import add_source
from tests.support.deliveries import fixture
from tests.support.feeds import (
    delivery,
    link_of,
    make_feed,
    store_delivery,
    store_fixture,
    tasks_of,
)
from tests.support.runs import replay_delivery, run
from tests.support.stores import Store

#: Values GitHub's ``issue.html_url`` could carry that pass as an http(s) URL
#: but no database stores: PostgreSQL text has no NUL, UTF-8 no lone surrogate.
UNSTORABLE_URLS = {
    "nul": "https://github.com/Codertocat/Hello-World/issues/1\u0000",
    "lone-surrogate": "https://github.com/Codertocat/Hello-World/issues/\ud8001",
}

#: ``issue.self`` values a Jira source without a configured site derives its
#: links from: a NUL in the host, a host urlsplit cannot parse, and a host
#: with a fullwidth solidus (U+FF0F), which NFKC turns into a "/".
MALFORMED_JIRA_SELF = {
    "nul-in-host": "https://a\u0000b/rest/api/2/issue/10040",
    "bracket": "https://[/rest/api/2/issue/10040",
    "fullwidth-solidus": "https://acme.atlassian.net\uff0fevil/rest/api/2/issue/10040",
}


def store_body(store: Store, source_id: int, provider: str, event: str, payload: dict) -> int:
    """Store ``payload`` as the ingress does: with whatever it read from the body."""
    body = json.dumps(payload).encode()  # ensure_ascii: "\\u0000", "\\ud800" escapes
    site = None  # the sources here have none (the GitHub adapter never uses it)
    reading = read_delivery(PROVIDERS[provider], event, json.loads(body), site)
    return store_delivery(store.sessions, source_id, body=body, event=event, reading=reading)


def assert_dead_without_a_task(store: Store, pk: int, workspace_id: int) -> None:
    row = delivery(store.sessions, pk)
    assert row.status == "dead"
    assert row.status_reason.startswith("unsupported payload"), row.status_reason
    assert row.created_task_id is None
    assert tasks_of(store.sessions, workspace_id) == []
    assert store.scalar("SELECT task_sequence FROM workspaces") == 0  # no number spent


@pytest.mark.parametrize("url", UNSTORABLE_URLS.values(), ids=UNSTORABLE_URLS.keys())
def test_a_github_issue_whose_url_no_database_stores_is_dead_and_blocks_nothing(
    store: Store, url: str
):
    feed = make_feed(store.sessions)
    payload = json.loads(fixture("github", "issues__opened"))
    payload["issue"]["html_url"] = url
    bad = store_body(store, feed.github_source_id, "github", "issues.opened", payload)

    processed = run(store, bad)

    assert (processed.status, processed.retry_in) == (DeliveryStatus.DEAD, None)
    assert processed.reason.startswith("unsupported payload: source url holds text no database")
    assert_dead_without_a_task(store, bad, feed.workspace_id)

    # A clean delivery for the same issue is not held by anything.
    clean = store_fixture(store.sessions, feed, "github", "issues__opened")
    created = run(store, clean)

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (created.status, created.outcome) == (DeliveryStatus.DONE, "created")
    assert task.external_id == "gh-issue/Codertocat/Hello-World#1"
    assert task.external_id_settled_at is not None


@pytest.mark.parametrize("api_url", MALFORMED_JIRA_SELF.values(), ids=MALFORMED_JIRA_SELF.keys())
def test_a_jira_issue_without_a_site_and_a_malformed_self_url_is_dead_and_blocks_nothing(
    store: Store, api_url: str
):
    feed = make_feed(store.sessions)
    with session_scope(store.sessions) as session:
        siteless = add_source(
            session=session,
            provider="jira",
            workspace_id=feed.workspace_id,
            slug="acme-jira-siteless",
            secret="jira-secret",
            create_events=("jira:issue_created",),
        ).id
    payload = json.loads(fixture("jira", "jira_issue_created__cloud"))
    payload["issue"]["self"] = api_url
    bad = store_body(store, siteless, "jira", "jira:issue_created", payload)

    processed = run(store, bad)

    assert (processed.status, processed.retry_in) == (DeliveryStatus.DEAD, None)
    assert_dead_without_a_task(store, bad, feed.workspace_id)

    clean_payload = json.loads(fixture("jira", "jira_issue_created__cloud"))
    clean = store_body(store, siteless, "jira", "jira:issue_created", clean_payload)
    created = run(store, clean)

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (created.status, created.outcome) == (DeliveryStatus.DONE, "created")
    assert task.external_id == "jira:TES-41"
    assert link_of(store.sessions, task.id).url == (
        "https://some-instance-test.atlassian.net/browse/TES-41"
    )


@pytest.mark.parametrize("url", UNSTORABLE_URLS.values(), ids=UNSTORABLE_URLS.keys())
def test_replaying_such_a_dead_delivery_stays_dead_without_a_task(store: Store, url: str):
    feed = make_feed(store.sessions)
    payload = json.loads(fixture("github", "issues__opened"))
    payload["issue"]["html_url"] = url
    pk = store_body(store, feed.github_source_id, "github", "issues.opened", payload)
    run(store, pk)

    replay_delivery(store, pk)
    again = run(store, pk)

    assert again.status is DeliveryStatus.DEAD
    assert_dead_without_a_task(store, pk, feed.workspace_id)
