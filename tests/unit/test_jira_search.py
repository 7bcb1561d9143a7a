"""The Jira search client (worker/catchup/jira_search.py), against
httpx.MockTransport: Cloud's and Data Center's requests and paging, the
relative window that sidesteps the user's time zone, the source's filter,
and errors that never hold the token."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from worker.catchup.api import BadCredentials, RateLimited, UnexpectedResponse
from worker.catchup.jira_search import JiraSearch, search_jql

TOKEN = "ATATT3xJiraApiT0kenThatMustNeverShow"
SITE = "https://acme.atlassian.net"
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def issue(number: int, created: datetime) -> dict:
    return {
        "id": str(10000 + number),
        "key": f"PROJ-{number}",
        "self": f"{SITE}/rest/api/3/issue/{10000 + number}",
        "fields": {
            "summary": f"Issue {number}",
            "created": created.strftime("%Y-%m-%dT%H:%M:%S.000%z"),
        },
    }


def search(handler, *, email: str | None = "ops@acme.example", **options) -> JiraSearch:
    return JiraSearch(
        site_url=SITE,
        token=TOKEN,
        email=email,
        transport=httpx.MockTransport(handler),
        clock=lambda: NOW.timestamp(),
        sleep=lambda seconds: None,
        **options,
    )


def test_the_window_is_relative_so_the_users_time_zone_cannot_shift_it():
    since = NOW - timedelta(minutes=90)
    assert search_jql(since, None, now=NOW) == "created >= -95m ORDER BY created DESC"
    assert (
        search_jql(since, "project = PROJ OR project = OPS", now=NOW)
        == "(project = PROJ OR project = OPS) AND created >= -95m ORDER BY created DESC"
    )


def test_cloud_pages_by_next_page_token_with_basic_auth():
    since = NOW - timedelta(hours=3)
    pages = {
        None: {"issues": [issue(3, NOW - timedelta(hours=1))], "nextPageToken": "tok-2"},
        "tok-2": {
            # Jira's window is a few minutes wider: an older issue is dropped here.
            "issues": [issue(2, NOW - timedelta(hours=2)), issue(1, since - timedelta(minutes=2))],
            "isLast": True,
        },
    }
    seen: list[httpx.Request] = []

    def cloud(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=pages[request.url.params.get("nextPageToken")])

    with search(cloud) as client:
        found = list(client.created_since(since=since, jql="project = PROJ"))
    assert [f.key for f in found] == ["PROJ-3", "PROJ-2"]
    assert [r.url.path for r in seen] == ["/rest/api/3/search/jql"] * 2
    params = dict(seen[0].url.params)
    assert params == {
        "jql": "(project = PROJ) AND created >= -185m ORDER BY created DESC",
        "fields": "summary,description,created,issuetype,project",
        "maxResults": "100",
    }
    basic = base64.b64encode(f"ops@acme.example:{TOKEN}".encode()).decode()
    assert seen[0].headers["authorization"] == f"Basic {basic}"


def test_data_center_pages_by_start_at_with_a_personal_access_token():
    since = NOW - timedelta(days=1)
    issues = [issue(n, NOW - timedelta(minutes=n)) for n in range(1, 251)]
    seen: list[httpx.Request] = []

    def data_center(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        start = int(request.url.params["startAt"])
        page = issues[start : start + 100]
        return httpx.Response(
            200, json={"startAt": start, "maxResults": 100, "total": 250, "issues": page}
        )

    with search(data_center, email=None) as client:
        found = list(client.created_since(since=since))
    assert [f.key for f in found] == [f"PROJ-{n}" for n in range(1, 251)]
    assert [r.url.params["startAt"] for r in seen] == ["0", "100", "200"]
    assert {r.url.path for r in seen} == {"/rest/api/2/search"}
    assert seen[0].headers["authorization"] == f"Bearer {TOKEN}"


def test_a_rate_limit_is_waited_out_within_the_budget_then_refused():
    answers = iter(
        [
            httpx.Response(429, headers={"Retry-After": "5"}),
            httpx.Response(200, json={"issues": [], "isLast": True}),
        ]
    )
    with search(lambda request: next(answers)) as client:
        assert list(client.created_since(since=NOW - timedelta(hours=1))) == []

    limited = search(
        lambda request: httpx.Response(429, headers={"Retry-After": "600"}), max_wait_seconds=60
    )
    with limited, pytest.raises(RateLimited, match="Jira's rate limit"):
        list(limited.created_since(since=NOW - timedelta(hours=1)))


@pytest.mark.parametrize(
    ("status", "kind", "words"),
    [
        (401, BadCredentials, "rejected the email and API token"),
        (403, BadCredentials, "may not browse"),
        (404, BadCredentials, "not a Jira Cloud site"),
        (400, UnexpectedResponse, "check the source's JQL filter"),
    ],
)
def test_a_refusal_is_one_clear_error_without_the_token(status, kind, words):
    body = {"errorMessages": [f"refused {TOKEN}"], "errors": {}}
    client = search(lambda request: httpx.Response(status, json=body))
    with client, pytest.raises(kind, match=words) as raised:
        list(client.created_since(since=NOW - timedelta(hours=1)))
    assert TOKEN not in str(raised.value)
    basic = base64.b64encode(f"ops@acme.example:{TOKEN}".encode()).decode()
    assert basic not in str(raised.value)


def test_an_issue_without_a_dated_creation_is_an_unexpected_response():
    row = issue(1, NOW)
    row["fields"]["created"] = "2026-12-02T12:00:00"  # no offset: which zone?
    client = search(lambda request: httpx.Response(200, json={"issues": [row], "isLast": True}))
    with client, pytest.raises(UnexpectedResponse, match="without an offset"):
        list(client.created_since(since=NOW - timedelta(hours=1)))
