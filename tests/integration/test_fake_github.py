"""The fake GitHub API (bench/fakes/github_api.py), over a real socket.

The catch-up's tests trust this server to answer as GitHub does, so these check it
against GitHub's own examples (tests/fixtures/github_api/) and documented
behaviour: the delivery log's cursor pages newest first, 401s, rate limits, server
errors, 404s and redeliveries; the issue list's filters, sorts and numbered pages;
a GitHub App's way from its JWT to an installation token that reads issues.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.fakes.github_api import FakeGitHub

HOOK = "repos/acme/widgets/hooks/123"
ORG_HOOK = "orgs/acme/hooks/77"
APP_HOOK = "app/hook"
TOKEN = "ghp_test"
APP_JWT = "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiI0MiJ9.c2lnbmF0dXJl"  # the shape only
JWT = {"Authorization": f"Bearer {APP_JWT}"}
REPO = "acme/widgets"
ISSUES = f"/repos/{REPO}/issues"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "github_api"
# A day ago: inside the three days GitHub keeps, and before "now", whatever the clock says.
START = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(days=1)


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    yield from FakeGitHub(token=TOKEN).serve()


@pytest.fixture
def client(github: FakeGitHub) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=github.base_url, headers=headers, timeout=5) as client:
        yield client


def example(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.json").read_bytes())


def issue_opened(number: int, **extra: Any) -> dict[str, Any]:
    return {"action": "opened", "issue": {"number": number}, "repository": {"id": 456}, **extra}


def log_issues(github: FakeGitHub, count: int, hook: str = HOOK) -> list[int]:
    """``count`` attempts a minute apart, oldest first; their ids."""
    return [
        github.log_delivery(
            hook=hook,
            event="issues",
            payload=issue_opened(n),
            delivered_at=START + timedelta(minutes=n),
        )
        for n in range(count)
    ]


def walk(client: httpx.Client, url: str, key: str = "id") -> list[list[int]]:
    """Every page's ids (or ``key``s), following each answer's Link rel="next" as given."""
    pages: list[list[int]] = []
    next_url: str | None = url
    while next_url:
        answer = client.get(next_url)
        assert answer.status_code == 200, answer.text
        pages.append([item[key] for item in answer.json()])
        next_url = answer.links.get("next", {}).get("url")
    return pages


def open_issues(github: FakeGitHub, count: int, repo: str = REPO) -> list[int]:
    """``count`` issues opened a minute apart, oldest first; their numbers."""
    return [
        github.open_issue(repo, title=f"Issue {n}", created_at=START + timedelta(minutes=n))[
            "number"
        ]
        for n in range(count)
    ]


def numbers(answer: httpx.Response) -> list[int]:
    assert answer.status_code == 200, answer.text
    return [issue["number"] for issue in answer.json()]


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def shape(value: Any) -> Any:
    """Keys (in order) and value types, all the way down."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [shape(item) for item in value]
    return type(value).__name__


# -- the recorded examples ---------------------------------------------------------------


def test_the_recorded_examples_are_the_bytes_sources_md_names():
    # SOURCES.md lists each file's sha256: a reformatted fixture fails here.
    sources = (FIXTURES / "SOURCES.md").read_text()
    listed = dict(re.findall(r"\| `([\w-]+\.json)` \| `([0-9a-f]{64})` \|", sources))
    assert set(listed) == {
        "hook-delivery-items.json",
        "hook-delivery.json",
        "issue-items.json",
        "installation.json",
        "installation-token.json",
    }
    for name, digest in listed.items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest


def test_a_listed_attempt_has_the_shape_of_githubs_example(github, client):
    github.log_delivery(
        hook=HOOK,
        event="issues",
        payload={**issue_opened(1), "installation": {"id": 123}},
        status_code=200,
        throttled_at=START,
    )
    [listed] = client.get(f"/{HOOK}/deliveries").json()
    assert shape(listed) == shape(example("hook-delivery-items")[0])


def test_a_full_delivery_has_the_shape_of_githubs_example(github, client):
    body = {**issue_opened(1), "installation": {"id": 123}}
    attempt_id = github.log_delivery(
        hook=HOOK, event="issues", payload=body, status_code=200, throttled_at=START
    )
    delivery = client.get(f"/{HOOK}/deliveries/{attempt_id}").json()
    expected = example("hook-delivery")
    expected["request"]["payload"] = body  # the webhook's own body, not the example's
    assert shape(delivery) == shape(expected)
    assert delivery["request"]["payload"] == body


def test_a_full_delivery_carries_the_request_github_sent(github, client):
    guid = "0b989ba4-242f-11e5-81e1-c7b6966d2516"
    attempt_id = github.log_delivery(hook=HOOK, guid=guid, event="issues", payload=issue_opened(7))
    delivery = client.get(f"/{HOOK}/deliveries/{attempt_id}").json()
    headers = delivery["request"]["headers"]
    assert (delivery["id"], delivery["guid"], delivery["action"]) == (attempt_id, guid, "opened")
    assert (delivery["status_code"], delivery["status"]) == (502, "Invalid HTTP Response: 502")
    assert delivery["repository_id"] == 456
    assert delivery["installation_id"] is None
    assert headers["X-GitHub-Delivery"] == guid
    assert headers["X-GitHub-Event"] == "issues"
    assert headers["X-GitHub-Hook-ID"] == "123"
    assert headers["X-Hub-Signature-256"].startswith("sha256=")
    assert headers["User-Agent"].startswith("GitHub-Hookshot/")
    assert headers["content-type"] == "application/json"


def test_headers_given_to_the_log_are_the_ones_listed(github, client):
    sent = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": "abc"}
    attempt_id = github.log_delivery(hook=HOOK, event="issues", payload={}, headers=sent)
    assert client.get(f"/{HOOK}/deliveries/{attempt_id}").json()["request"]["headers"] == sent


# -- the log and its pages ---------------------------------------------------------------


def test_the_log_pages_newest_first_by_the_link_cursor(github, client):
    newest_first = log_issues(github, 7)[::-1]
    assert walk(client, f"/{HOOK}/deliveries?per_page=3") == [
        newest_first[0:3],
        newest_first[3:6],
        newest_first[6:],
    ]
    first, second, third = github.requests
    assert first.query == {"per_page": "3"}
    assert second.query.keys() == third.query.keys() == {"per_page", "cursor"}
    assert second.query["cursor"] != third.query["cursor"]


def test_the_link_is_absolute_and_keeps_the_query(github, client):
    log_issues(github, 3)
    answer = client.get(f"/{HOOK}/deliveries", params={"per_page": 1, "status": "failure"})
    link = answer.headers["Link"]
    assert re.fullmatch(
        rf"<{re.escape(github.base_url)}/{HOOK}/deliveries\?per_page=1&cursor=[^&>]+&status=failure>;"
        r' rel="next"',
        link,
    )


def test_the_last_page_has_no_link(github, client):
    log_issues(github, 3)
    assert "Link" not in client.get(f"/{HOOK}/deliveries", params={"per_page": 3}).headers


def test_an_empty_log_is_an_empty_list(github, client):
    github.add_hook(HOOK)
    answer = client.get(f"/{HOOK}/deliveries")
    assert (answer.status_code, answer.json(), answer.headers.get("Link")) == (200, [], None)


def test_attempts_are_listed_by_when_they_were_delivered_not_when_logged(github, client):
    late = github.log_delivery(hook=HOOK, event="issues", payload={}, delivered_at=START)
    early = github.log_delivery(
        hook=HOOK, event="issues", payload={}, delivered_at=START - timedelta(hours=1)
    )
    latest = github.log_delivery(hook=HOOK, event="issues", payload={})  # now
    assert walk(client, f"/{HOOK}/deliveries?per_page=2") == [[latest, late], [early]]


def test_attempts_logged_during_the_walk_do_not_shift_its_pages(github, client):
    newest_first = log_issues(github, 4)[::-1]
    first = client.get(f"/{HOOK}/deliveries", params={"per_page": 2})
    newer = github.log_delivery(hook=HOOK, event="issues", payload={})
    rest = walk(client, first.links["next"]["url"])
    assert [delivery["id"] for delivery in first.json()] == newest_first[:2]
    assert rest == [newest_first[2:]]
    assert newer not in rest[0]


def test_per_page_defaults_to_30_and_stops_at_100_or_the_cap(github, client):
    log_issues(github, 105)
    assert len(client.get(f"/{HOOK}/deliveries").json()) == 30
    assert len(client.get(f"/{HOOK}/deliveries", params={"per_page": 500}).json()) == 100
    github.page_size_cap = 2
    capped = client.get(f"/{HOOK}/deliveries", params={"per_page": 3})
    assert len(capped.json()) == 2
    assert "next" in capped.links


def test_the_status_filter_goes_by_the_documented_status_code_ranges(github, client):
    codes = {
        code: github.log_delivery(hook=HOOK, event="issues", payload={}, status_code=code)
        for code in (0, 202, 404, 502)
    }

    def listed(status: str) -> set[int]:
        return {d["id"] for d in client.get(f"/{HOOK}/deliveries?status={status}").json()}

    assert listed("success") == {codes[202]}
    assert listed("failure") == {codes[404], codes[502]}  # 0 (no answer) is in neither


@pytest.mark.parametrize("query", ["per_page=three", "cursor=nonsense", "cursor=v1_1", "status=x"])
def test_a_bad_query_is_a_400(github, client, query):
    log_issues(github, 1)
    assert client.get(f"/{HOOK}/deliveries?{query}").status_code == 400


def test_each_hook_has_its_own_log(github, client):
    [repo_attempt] = log_issues(github, 1)
    [org_attempt] = log_issues(github, 1, hook=ORG_HOOK)
    assert walk(client, f"/{HOOK}/deliveries") == [[repo_attempt]]
    token_client = httpx.Client(
        base_url=github.base_url, headers={"Authorization": f"token {TOKEN}"}
    )
    with token_client:
        assert walk(token_client, f"/{ORG_HOOK}/deliveries") == [[org_attempt]]


# -- credentials ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        ("Bearer ghp_wrong", "Bad credentials"),
        ("token ghp_wrong", "Bad credentials"),
        (f"Basic {TOKEN}", "Bad credentials"),
        (f"Bearer {APP_JWT}", "Bad credentials"),  # a JWT is for /app/hook only
        (None, "Requires authentication"),
    ],
)
def test_other_credentials_are_a_401(github, authorization, message):
    log_issues(github, 1)
    headers = {"Authorization": authorization} if authorization else {}
    answer = httpx.get(f"{github.base_url}/{HOOK}/deliveries", headers=headers)
    assert answer.status_code == 401
    assert answer.json() == {
        "message": message,
        "documentation_url": "https://docs.github.com/rest",
        "status": "401",
    }


def test_the_app_hook_takes_a_jwt_and_records_it(github):
    [attempt_id] = log_issues(github, 1, hook=APP_HOOK)
    jwt = {"Authorization": f"Bearer {APP_JWT}"}
    with httpx.Client(base_url=github.base_url, headers=jwt) as app:
        assert walk(app, "/app/hook/deliveries") == [[attempt_id]]
        delivery = app.get(f"/app/hook/deliveries/{attempt_id}").json()
    assert delivery["request"]["headers"]["X-GitHub-Hook-Installation-Target-Type"] == "integration"
    assert github.app_jwts == [APP_JWT, APP_JWT]


def test_the_app_hook_refuses_a_token(github, client):
    log_issues(github, 1, hook=APP_HOOK)
    answer = client.get("/app/hook/deliveries")
    assert answer.status_code == 401
    assert answer.json()["message"] == "A JSON web token could not be decoded"


# -- faults --------------------------------------------------------------------------------


def test_a_secondary_rate_limit_is_a_429_with_retry_after(github, client):
    log_issues(github, 1)
    github.rate_limit_next(2, retry_after=1)
    for _ in range(2):
        limited = client.get(f"/{HOOK}/deliveries")
        assert (limited.status_code, limited.headers["Retry-After"]) == (429, "1")
        assert "secondary rate limit" in limited.json()["message"]
    assert client.get(f"/{HOOK}/deliveries").status_code == 200


def test_a_spent_primary_rate_limit_is_a_403_until_the_reset(github, client):
    log_issues(github, 1)
    github.rate_limit_next(1, reset_in=1, status=403)
    limited = client.get(f"/{HOOK}/deliveries")
    assert limited.status_code == 403
    assert limited.headers["X-RateLimit-Remaining"] == "0"
    assert time.time() - 1 <= int(limited.headers["X-RateLimit-Reset"]) <= time.time() + 2
    assert "Retry-After" not in limited.headers
    assert limited.json()["message"].startswith("API rate limit exceeded")
    assert client.get(f"/{HOOK}/deliveries").status_code == 200


def test_fail_next_answers_server_errors_whatever_is_asked(github, client):
    [attempt_id] = log_issues(github, 1)
    github.fail_next(3, status=503)
    asked = [
        client.get(f"/{HOOK}/deliveries"),
        client.get(f"/{HOOK}/deliveries/{attempt_id}"),
        httpx.get(f"{github.base_url}/{HOOK}/deliveries"),  # no credentials: still a 503
    ]
    assert [answer.status_code for answer in asked] == [503, 503, 503]
    assert client.get(f"/{HOOK}/deliveries/{attempt_id}").status_code == 200
    assert len(github.requests) == 4


def test_a_5xx_is_a_502_by_default(github, client):
    log_issues(github, 1)
    github.fail_next(1)
    assert client.get(f"/{HOOK}/deliveries").status_code == 502


@pytest.mark.parametrize(
    "path",
    [
        f"/{HOOK}/deliveries/999",
        f"/{HOOK}/deliveries/not-a-number",
        "/repos/acme/other/hooks/123/deliveries",
        "/repos/acme/widgets/hooks/123",
        "/user",
    ],
)
def test_what_does_not_exist_is_a_404(github, client, path):
    log_issues(github, 1)
    answer = client.get(path)
    assert answer.status_code == 404
    assert answer.json()["message"] == "Not Found"
    assert answer.json()["documentation_url"].startswith("https://docs.github.com/rest")


def test_another_hooks_delivery_is_a_404_naming_the_operation(github, client):
    [org_attempt] = log_issues(github, 1, hook=ORG_HOOK)
    log_issues(github, 1)
    answer = client.get(f"/{HOOK}/deliveries/{org_attempt}")
    assert answer.status_code == 404
    assert answer.json()["documentation_url"] == (
        "https://docs.github.com/rest/repos/webhooks#get-a-delivery-for-a-repository-webhook"
    )


# -- redelivery ----------------------------------------------------------------------------


def test_a_redelivery_is_accepted_and_logged_as_a_new_attempt(github, client):
    [failed] = log_issues(github, 1)
    answer = client.post(f"/{HOOK}/deliveries/{failed}/attempts")
    assert (answer.status_code, answer.json()) == (202, {})
    assert github.redeliveries == [failed]
    newest, original = client.get(f"/{HOOK}/deliveries").json()
    assert original["id"] == failed
    assert newest["id"] != failed
    assert (newest["guid"], newest["redelivery"]) == (original["guid"], True)
    assert (newest["status_code"], newest["status"]) == (202, "OK")
    again = client.get(f"/{HOOK}/deliveries/{newest['id']}").json()["request"]
    assert again == client.get(f"/{HOOK}/deliveries/{failed}").json()["request"]


def test_a_redelivery_that_does_not_succeed_is_only_recorded():
    with FakeGitHub(token=TOKEN, redelivery_succeeds=False) as github:
        [failed] = log_issues(github, 1)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        answer = httpx.post(
            f"{github.base_url}/{HOOK}/deliveries/{failed}/attempts", headers=headers
        )
        assert answer.status_code == 202
        assert github.redeliveries == [failed]
        assert [attempt.id for attempt in github.attempts(HOOK)] == [failed]


def test_redelivering_what_is_not_there_is_a_404(github, client):
    [attempt_id] = log_issues(github, 1)
    assert client.post(f"/{HOOK}/deliveries/999/attempts").status_code == 404
    assert client.get(f"/{HOOK}/deliveries/{attempt_id}/attempts").status_code == 404
    assert github.redeliveries == []


# -- every answer, the record of requests, the server itself -------------------------------


def test_every_answer_carries_githubs_rate_limit_and_request_id_headers(github, client):
    [attempt_id] = log_issues(github, 1)
    github.fail_next(1)
    answers = [
        client.get(f"/{HOOK}/deliveries"),  # 502
        client.get(f"/{HOOK}/deliveries"),
        client.get(f"/{HOOK}/deliveries/{attempt_id}"),
        client.post(f"/{HOOK}/deliveries/{attempt_id}/attempts"),
        client.get("/nowhere"),
        httpx.get(f"{github.base_url}/{HOOK}/deliveries"),
    ]
    assert [answer.status_code for answer in answers] == [502, 200, 200, 202, 404, 401]
    for answer in answers:
        assert answer.headers["X-RateLimit-Limit"] == "5000"
        assert 0 <= int(answer.headers["X-RateLimit-Remaining"]) <= 5000
        assert int(answer.headers["X-RateLimit-Reset"]) > time.time()
        assert re.fullmatch(
            r"[0-9A-F]{4}:[0-9A-F]{4}:[0-9A-F]+:[0-9A-F]+:[0-9A-F]{8}",
            answer.headers["X-GitHub-Request-Id"],
        )
        assert answer.headers["Content-Type"] == "application/json; charset=utf-8"
    request_ids = {answer.headers["X-GitHub-Request-Id"] for answer in answers}
    assert len(request_ids) == len(answers)


def test_the_remaining_rate_limit_counts_down(github, client):
    log_issues(github, 1)
    remaining = [
        int(client.get(f"/{HOOK}/deliveries").headers["X-RateLimit-Remaining"]) for _ in range(3)
    ]
    assert remaining == [4999, 4998, 4997]


def test_every_request_is_recorded(github, client):
    [attempt_id] = log_issues(github, 1)
    client.get(f"/{HOOK}/deliveries", params={"per_page": 5})
    client.post(
        f"/{HOOK}/deliveries/{attempt_id}/attempts", headers={"X-GitHub-Api-Version": "2022-11-28"}
    )
    listed, redelivered = github.requests
    assert (listed.method, listed.path, listed.query) == (
        "GET",
        f"/{HOOK}/deliveries",
        {"per_page": "5"},
    )
    assert listed.headers["authorization"] == f"Bearer {TOKEN}"
    assert (redelivered.method, redelivered.path) == (
        "POST",
        f"/{HOOK}/deliveries/{attempt_id}/attempts",
    )
    assert redelivered.headers["x-github-api-version"] == "2022-11-28"


def test_it_starts_fast_and_stops_with_a_connection_still_open():
    threads_before = set(threading.enumerate())
    began = time.perf_counter()
    github = FakeGitHub(token=TOKEN).start()
    try:
        assert time.perf_counter() - began < 1
        kept_alive = httpx.Client(base_url=github.base_url)
        assert kept_alive.get("/user").status_code == 404  # the connection stays in the pool
    finally:
        stopping = time.perf_counter()
        github.stop()
    assert time.perf_counter() - stopping < 1
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(github.base_url.rsplit(":", 1)[1])), 1)
    assert set(threading.enumerate()) <= threads_before  # no server or handler thread left
    kept_alive.close()


def test_log_delivery_refuses_what_github_could_not_have_logged(github):
    with pytest.raises(ValueError, match="not a hook"):
        github.log_delivery(hook="repos/acme/hooks/1", event="issues", payload={})
    with pytest.raises(ValueError, match="aware"):
        github.log_delivery(
            hook=HOOK, event="issues", payload={}, delivered_at=datetime(2026, 1, 1)
        )


# -- issues: the recorded example ----------------------------------------------------------

# What the fake does not model is empty in its answers: the example's values edited likewise.
UNMODELLED_ISSUE_FIELDS = {
    "labels": [],
    "assignee": None,
    "assignees": [],
    "milestone": None,
    "active_lock_reason": None,
}


def test_a_listed_pull_request_has_the_shape_of_githubs_example(github, client):
    github.open_issue(REPO, title="Fix it", body="Fixes #1", pull_request=True, created_at=START)
    github.close_issue(REPO, 1, at=START + timedelta(hours=1))
    [listed] = client.get(ISSUES, params={"state": "closed"}).json()
    # The example is an open issue closed by someone: a closed one has a closed_at too.
    expected = {
        **example("issue-items")[0],
        **UNMODELLED_ISSUE_FIELDS,
        "closed_at": "2011-04-22T13:33:48Z",
    }
    assert shape(listed) == shape(expected)


def test_a_listed_issue_has_the_shape_of_githubs_example_without_pull_request(github, client):
    github.open_issue(REPO, title="Found a bug", body="It breaks.", created_at=START)
    [listed] = client.get(ISSUES).json()
    expected = {
        **{key: value for key, value in example("issue-items")[0].items() if key != "pull_request"},
        **UNMODELLED_ISSUE_FIELDS,
        "closed_by": None,  # open, never closed
        "state_reason": None,
    }
    assert shape(listed) == shape(expected)


def test_a_listed_issue_carries_what_was_opened(github, client):
    opened = github.open_issue(REPO, title="Found a bug", body="It breaks.", created_at=START)
    pull = github.open_issue(REPO, title="Fix it", pull_request=True, created_at=START)
    listed = client.get(ISSUES, params={"direction": "asc"}).json()
    assert listed == [opened, pull] == github.issues(REPO)
    assert (opened["number"], opened["title"], opened["body"]) == (1, "Found a bug", "It breaks.")
    assert (opened["state"], opened["closed_at"], opened["closed_by"]) == ("open", None, None)
    assert opened["created_at"] == opened["updated_at"] == iso(START)
    assert opened["html_url"] == "https://github.com/acme/widgets/issues/1"
    assert opened["url"] == "https://api.github.com/repos/acme/widgets/issues/1"
    assert opened["repository_url"] == "https://api.github.com/repos/acme/widgets"
    assert opened["user"]["login"] == "octocat"
    assert "pull_request" not in opened
    assert pull["number"] == 2  # issues and pull requests share the numbers
    assert pull["html_url"] == "https://github.com/acme/widgets/pull/2"
    assert pull["pull_request"]["url"] == "https://api.github.com/repos/acme/widgets/pulls/2"
    assert opened["id"] != pull["id"]


def test_numbers_count_per_repository_and_go_on_past_a_given_one(github):
    assert open_issues(github, 2) == [1, 2]
    assert github.open_issue(REPO, title="imported", number=40)["number"] == 40
    assert github.open_issue(REPO, title="next")["number"] == 41
    assert open_issues(github, 1, repo="acme/gadgets") == [1]
    with pytest.raises(ValueError, match="already has #40"):
        github.open_issue(REPO, title="again", number=40)


def test_closing_and_editing_move_updated_at(github):
    [number] = open_issues(github, 1)
    edited = github.edit_issue(REPO, number, title="Renamed", at=START + timedelta(hours=1))
    assert (edited["title"], edited["updated_at"]) == ("Renamed", iso(START + timedelta(hours=1)))
    assert edited["created_at"] == iso(START)
    closed = github.close_issue(REPO, number, at=START + timedelta(hours=2))
    assert (closed["state"], closed["state_reason"]) == ("closed", "completed")
    assert closed["closed_at"] == closed["updated_at"] == iso(START + timedelta(hours=2))
    assert closed["closed_by"]["login"] == "octocat"
    assert github.issues(REPO) == [closed]


def test_the_issue_state_refuses_what_github_could_not_hold(github):
    [number] = open_issues(github, 1)
    with pytest.raises(ValueError, match="before"):
        github.close_issue(REPO, number, at=START - timedelta(days=1))
    with pytest.raises(KeyError):
        github.edit_issue(REPO, 99, title="nothing there")
    with pytest.raises(ValueError, match="aware"):
        github.open_issue(REPO, title="naive", created_at=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="not a repository"):
        github.open_issue("widgets", title="no owner")
    github.close_issue(REPO, number)
    with pytest.raises(ValueError, match="closed already"):
        github.close_issue(REPO, number)


# -- issues: the list and its pages --------------------------------------------------------


def test_the_issue_list_pages_by_number_with_githubs_link(github, client):
    open_issues(github, 250)
    first = client.get(ISSUES, params={"per_page": 100})
    assert first.headers["Link"] == (
        f'<{github.base_url}{ISSUES}?per_page=100&page=2>; rel="next", '
        f'<{github.base_url}{ISSUES}?per_page=100&page=3>; rel="last"'
    )
    second = client.get(first.links["next"]["url"])
    assert {rel: link["url"].rsplit("page=", 1)[1] for rel, link in second.links.items()} == {
        "prev": "1",
        "next": "3",
        "last": "3",
        "first": "1",
    }
    third = client.get(second.links["next"]["url"])
    assert {rel: link["url"].rsplit("page=", 1)[1] for rel, link in third.links.items()} == {
        "prev": "2",
        "first": "1",
    }
    pages = [numbers(first), numbers(second), numbers(third)]
    assert [len(page) for page in pages] == [100, 100, 50]
    assert [n for page in pages for n in page] == list(range(250, 0, -1))  # each once
    assert walk(client, f"{ISSUES}?per_page=100", key="number") == pages


def test_the_page_links_keep_the_query_and_replace_the_page(github, client):
    open_issues(github, 5)
    given = {"state": "all", "page": 2, "per_page": 2, "labels": "bug", "sort": "updated"}
    answer = client.get(ISSUES, params=given)
    query = "state=all&page={}&per_page=2&labels=bug&sort=updated"
    expected = [("prev", 1), ("next", 3), ("last", 3), ("first", 1)]
    assert answer.headers["Link"] == ", ".join(
        f'<{github.base_url}{ISSUES}?{query.format(page)}>; rel="{rel}"' for rel, page in expected
    )


def test_per_page_defaults_to_30_and_stops_at_100_or_the_cap_for_issues(github, client):
    open_issues(github, 105)
    assert len(numbers(client.get(ISSUES))) == 30
    assert len(numbers(client.get(ISSUES, params={"per_page": 500}))) == 100
    github.page_size_cap = 2
    capped = client.get(ISSUES, params={"per_page": 3})
    assert numbers(capped) == [105, 104]
    assert capped.links["last"]["url"].endswith("page=53")


def test_a_page_past_the_last_is_empty_and_one_page_has_no_link(github, client):
    open_issues(github, 3)
    past = client.get(ISSUES, params={"page": 5})
    assert (numbers(past), set(past.links)) == ([], {"prev", "first"})
    assert "Link" not in client.get(ISSUES).headers
    github.add_repo("acme/empty")
    empty = client.get("/repos/acme/empty/issues")
    assert (numbers(empty), empty.headers.get("Link")) == ([], None)


def test_the_state_filter_defaults_to_open(github, client):
    open_issues(github, 4)
    github.close_issue(REPO, 2)
    github.close_issue(REPO, 3)
    assert numbers(client.get(ISSUES)) == [4, 1]
    assert numbers(client.get(ISSUES, params={"state": "open"})) == [4, 1]
    assert numbers(client.get(ISSUES, params={"state": "closed"})) == [3, 2]
    assert numbers(client.get(ISSUES, params={"state": "all"})) == [4, 3, 2, 1]


def test_since_keeps_what_was_updated_at_or_after_it(github, client):
    open_issues(github, 5)  # created (and updated) at START + 0..4 minutes
    github.edit_issue(REPO, 1, at=START + timedelta(hours=1))
    github.close_issue(REPO, 2, at=START + timedelta(hours=2))
    since = {"since": iso(START + timedelta(minutes=3)), "state": "all"}
    assert numbers(client.get(ISSUES, params=since)) == [5, 4, 2, 1]
    assert numbers(client.get(ISSUES, params={**since, "state": "open"})) == [5, 4, 1]
    later = START + timedelta(minutes=90)
    offset = later.astimezone(timezone(timedelta(hours=2))).isoformat()  # +02:00, not Z
    assert numbers(client.get(ISSUES, params={"since": offset, "state": "all"})) == [2]
    assert numbers(client.get(ISSUES, params={"since": iso(datetime.now(UTC))})) == []


def test_the_sort_and_its_direction(github, client):
    for minutes, title in [(0, "oldest"), (10, "newest"), (5, "middle")]:
        github.open_issue(REPO, title=title, created_at=START + timedelta(minutes=minutes))
    github.edit_issue(REPO, 1, at=START + timedelta(hours=1))  # the oldest, updated last

    def titles(**params: str) -> list[str]:
        return [issue["title"] for issue in client.get(ISSUES, params=params).json()]

    newest_first = ["newest", "middle", "oldest"]
    assert titles() == titles(sort="created", direction="desc") == newest_first
    assert titles(sort="created", direction="asc") == newest_first[::-1]
    assert titles(sort="updated") == ["oldest", "newest", "middle"]
    assert titles(sort="updated", direction="asc") == ["middle", "newest", "oldest"]
    assert titles(sort="comments", direction="asc") == newest_first[::-1]  # none has comments


def test_pull_requests_are_listed_with_issues_and_carry_pull_request(github, client):
    github.open_issue(REPO, title="bug", created_at=START)
    github.open_issue(REPO, title="fix", created_at=START + timedelta(minutes=1), pull_request=True)
    fix, bug = client.get(ISSUES).json()
    assert (fix["title"], bug["title"]) == ("fix", "bug")
    assert set(fix["pull_request"]) == {"url", "html_url", "diff_url", "patch_url"}
    assert fix["pull_request"]["html_url"] == fix["html_url"]
    assert "pull_request" not in bug


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("state=opened", "state"),
        ("sort=newest", "sort"),
        ("direction=down", "direction"),
        ("since=yesterday", "since"),
        ("per_page=three", "per_page"),
    ],
)
def test_a_bad_issue_query_is_a_422_naming_the_field(github, client, query, field):
    open_issues(github, 1)
    answer = client.get(f"{ISSUES}?{query}")
    assert answer.status_code == 422
    assert answer.json() == {
        "message": "Validation Failed",
        "errors": [{"resource": "Issue", "field": field, "code": "invalid"}],
        "documentation_url": "https://docs.github.com/rest/issues/issues#list-repository-issues",
        "status": "422",
    }


def test_an_unknown_repository_is_a_404_and_names_ignore_case(github, client):
    open_issues(github, 1)
    answer = client.get("/repos/acme/unknown/issues")
    assert answer.status_code == 404
    assert answer.json() == {
        "message": "Not Found",
        "documentation_url": "https://docs.github.com/rest/issues/issues#list-repository-issues",
        "status": "404",
    }
    listed = client.get("/repos/Acme/Widgets/issues").json()
    assert [issue["html_url"] for issue in listed] == ["https://github.com/acme/widgets/issues/1"]
    assert client.post(ISSUES).status_code == 404  # creating issues is not modelled


def test_a_repository_answers_its_id_and_keeps_it_when_renamed(github, client):
    open_issues(github, 2)
    repository = client.get("/repos/Acme/Widgets").json()
    assert (repository["id"], repository["full_name"]) == (github.repository_id(REPO), REPO)
    assert client.get("/repos/acme/unknown").status_code == 404
    assert client.post(f"/repos/{REPO}").status_code == 404

    github.rename_repo(REPO, "acme/gadgets")

    renamed = client.get("/repos/acme/gadgets").json()
    assert (renamed["id"], renamed["full_name"]) == (repository["id"], "acme/gadgets")
    assert github.repository_id("acme/gadgets") == repository["id"]
    assert client.get(f"/repos/{REPO}").status_code == 404  # GitHub would redirect
    listed = client.get("/repos/acme/gadgets/issues").json()
    assert sorted(issue["html_url"] for issue in listed) == [
        "https://github.com/acme/gadgets/issues/1",
        "https://github.com/acme/gadgets/issues/2",
    ]
    github.add_repo("acme/other")
    with pytest.raises(ValueError, match="exists already"):
        github.rename_repo("acme/gadgets", "acme/other")


def test_repositories_have_ids_of_their_own(github):
    github.add_repo(REPO)
    github.add_repo("acme/other")

    assert github.repository_id(REPO) != github.repository_id("acme/other")


@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        ("Bearer ghp_wrong", "Bad credentials"),
        (f"Bearer {APP_JWT}", "Bad credentials"),  # the App lists nothing: its tokens do
        (f"token {TOKEN}x", "Bad credentials"),
        (None, "Requires authentication"),
    ],
)
def test_other_credentials_are_a_401_for_the_issue_list(github, authorization, message):
    open_issues(github, 1)
    headers = {"Authorization": authorization} if authorization else {}
    answer = httpx.get(f"{github.base_url}{ISSUES}", headers=headers)
    assert (answer.status_code, answer.json()["message"]) == (401, message)
    assert answer.headers["X-RateLimit-Limit"] == "5000"


def test_faults_rate_limits_and_the_record_apply_to_the_issue_list(github, client):
    open_issues(github, 1)
    github.fail_next(1)
    github.rate_limit_next(1, retry_after=2)
    failed, limited = client.get(ISSUES), client.get(ISSUES)
    assert failed.status_code == 502
    assert (limited.status_code, limited.headers["Retry-After"]) == (429, "2")
    remaining = [int(client.get(ISSUES).headers["X-RateLimit-Remaining"]) for _ in range(2)]
    assert remaining == [4999, 4998]
    github.rate_limit_next(1, reset_in=1, status=403)
    assert client.get(ISSUES).headers["X-RateLimit-Remaining"] == "0"
    assert [(r.method, r.path) for r in github.requests] == [("GET", ISSUES)] * 5
    assert github.requests[0].headers["authorization"] == f"Bearer {TOKEN}"


# -- the App: installation and installation tokens -----------------------------------------


def test_the_app_reads_issues_with_an_installation_token(github, client):
    open_issues(github, 3)
    installation_id = github.install_app(REPO)
    installation = client.get(f"/repos/{REPO}/installation", headers=JWT)
    assert installation.status_code == 200
    assert installation.json()["id"] == installation_id
    assert installation.json()["app_id"] == 4200
    minted = client.post(f"/app/installations/{installation_id}/access_tokens", headers=JWT)
    assert minted.status_code == 201
    token = minted.json()["token"]
    assert [(m.token, m.installation_id) for m in github.minted_tokens] == [
        (token, installation_id)
    ]
    assert github.app_jwts == [APP_JWT, APP_JWT]
    with httpx.Client(
        base_url=github.base_url, headers={"Authorization": f"token {token}"}
    ) as installed:
        assert walk(installed, f"{ISSUES}?per_page=2", key="number") == [[3, 2], [1]]
        assert installed.get(f"/repos/{REPO}/installation").status_code == 401  # not a JWT


def test_an_installation_has_the_shape_of_githubs_example(github, client):
    github.install_app(REPO)
    installation = client.get(f"/repos/{REPO}/installation", headers=JWT).json()
    # An App without the single-file permission has no single file; the permissions are
    # another App's than the example's: a map of names to levels all the same.
    expected = {
        **example("installation"),
        "permissions": as_permissions(installation["permissions"]),
        "single_file_name": None,
        "single_file_paths": [],
    }
    assert shape(installation) == shape(expected)
    assert installation["account"]["login"] == "acme"
    assert installation["account"]["type"] == installation["target_type"] == "Organization"
    assert installation["target_id"] == installation["account"]["id"]
    assert installation["repository_selection"] == "selected"
    assert installation["access_tokens_url"].endswith(
        f"/app/installations/{installation['id']}/access_tokens"
    )


def test_an_installation_token_has_the_shape_of_githubs_example(github, client):
    installation_id = github.install_app("acme")
    began = datetime.now(UTC).replace(microsecond=0)
    minted = client.post(f"/app/installations/{installation_id}/access_tokens", headers=JWT)
    body = minted.json()
    # GitHub lists `repositories` for a token the request limited; the fake reads no body.
    expected = {**example("installation-token"), "permissions": as_permissions(body["permissions"])}
    del expected["repositories"]
    assert shape(body) == shape(expected)
    assert re.fullmatch(r"ghs_[A-Za-z0-9]{36}", body["token"])
    expires_at = datetime.fromisoformat(body["expires_at"])
    assert body["expires_at"].endswith("Z")
    assert began + timedelta(hours=1) <= expires_at <= began + timedelta(hours=1, seconds=2)
    assert github.minted_tokens[0].expires_at == expires_at
    assert body["repository_selection"] == "all"
    assert body["permissions"]["issues"] == "read"


def test_an_installation_token_reads_only_its_installations_repositories(github, client):
    open_issues(github, 1)
    open_issues(github, 1, repo="acme/gadgets")
    open_issues(github, 1, repo="other/thing")
    token = mint(client, github.install_app(REPO))
    assert read_issues(github, token, REPO) == 200
    assert read_issues(github, token, "acme/gadgets") == 404  # not selected
    assert read_issues(github, token, "other/thing") == 404  # another account
    assert github.install_app("acme/gadgets") == github.install_app(REPO)  # one per account
    assert read_issues(github, token, "acme/gadgets") == 200
    everything = mint(client, github.install_app("acme"))
    assert read_issues(github, everything, "acme/gadgets") == 200
    assert read_issues(github, everything, "other/thing") == 404


def test_an_expired_installation_token_is_a_401(github, client):
    open_issues(github, 1)
    token = mint(client, github.install_app(REPO))
    github.expire_minted_tokens()
    answer = httpx.get(f"{github.base_url}{ISSUES}", headers={"Authorization": f"token {token}"})
    assert (answer.status_code, answer.json()["message"]) == (401, "Bad credentials")


def test_an_installation_token_may_not_read_the_delivery_log(github, client):
    log_issues(github, 1)
    token = mint(client, github.install_app(REPO))
    answer = httpx.get(
        f"{github.base_url}/{HOOK}/deliveries", headers={"Authorization": f"Bearer {token}"}
    )
    assert (answer.status_code, answer.json()["message"]) == (
        403,
        "Resource not accessible by integration",
    )


@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        (f"Bearer {TOKEN}", "A JSON web token could not be decoded"),
        (f"token {APP_JWT}", "A JSON web token could not be decoded"),
        ("Bearer not-a-jwt", "A JSON web token could not be decoded"),
        (None, "Requires authentication"),
    ],
)
@pytest.mark.parametrize("route", ["installation", "access_tokens"])
def test_the_app_routes_take_only_a_jwt(github, authorization, message, route):
    installation_id = github.install_app(REPO)
    headers = {"Authorization": authorization} if authorization else {}
    if route == "installation":
        answer = httpx.get(f"{github.base_url}/repos/{REPO}/installation", headers=headers)
    else:
        answer = httpx.post(
            f"{github.base_url}/app/installations/{installation_id}/access_tokens",
            headers=headers,
        )
    assert (answer.status_code, answer.json()["message"]) == (401, message)
    assert github.minted_tokens == []


def test_where_the_app_is_not_installed_is_a_404(github, client):
    open_issues(github, 1)
    open_issues(github, 1, repo="other/thing")
    installation_id = github.install_app(REPO)
    assert github.install_app("acme") == installation_id  # now on all of acme's
    not_installed = client.get("/repos/other/thing/installation", headers=JWT)
    assert not_installed.status_code == 404
    assert not_installed.json()["documentation_url"] == (
        "https://docs.github.com/rest/apps/apps"
        "#get-a-repository-installation-for-the-authenticated-app"
    )
    assert client.get("/repos/acme/nowhere/installation", headers=JWT).status_code == 404
    assert client.get(f"/repos/{REPO}/installation", headers=JWT).status_code == 200
    unknown = client.post("/app/installations/999/access_tokens", headers=JWT)
    assert unknown.status_code == 404
    assert unknown.json()["documentation_url"].endswith(
        "#create-an-installation-access-token-for-an-app"
    )
    tokens_url = f"/app/installations/{installation_id}/access_tokens"
    assert client.get(tokens_url, headers=JWT).status_code == 404  # it takes a POST
    assert github.minted_tokens == []


def test_faults_apply_to_the_app_routes(github, client):
    installation_id = github.install_app(REPO)
    tokens_url = f"/app/installations/{installation_id}/access_tokens"
    github.fail_next(1, status=503)
    github.rate_limit_next(1)
    assert client.get(f"/repos/{REPO}/installation", headers=JWT).status_code == 503
    assert client.post(tokens_url, headers=JWT).status_code == 429
    assert github.minted_tokens == []
    minted = client.post(tokens_url, headers=JWT)
    assert minted.status_code == 201
    assert minted.headers["X-RateLimit-Remaining"] == "4999"
    assert [(r.method, r.path) for r in github.requests] == [
        ("GET", f"/repos/{REPO}/installation"),
        ("POST", tokens_url),
        ("POST", tokens_url),
    ]


def as_permissions(permissions: dict[str, Any]) -> dict[str, str]:
    """The same names, each at a level GitHub has."""
    assert set(permissions.values()) <= {"read", "write", "admin"}
    return dict.fromkeys(permissions, "read")


def mint(client: httpx.Client, installation_id: int) -> str:
    answer = client.post(f"/app/installations/{installation_id}/access_tokens", headers=JWT)
    assert answer.status_code == 201, answer.text
    return answer.json()["token"]


def read_issues(github: FakeGitHub, token: str, repo: str) -> int:
    headers = {"Authorization": f"token {token}"}
    return httpx.get(f"{github.base_url}/repos/{repo}/issues", headers=headers).status_code
