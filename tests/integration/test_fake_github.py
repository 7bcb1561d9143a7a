"""The fake GitHub delivery-log API (bench/fakes/github_api.py), over a real socket.

The catch-up's tests trust this server to answer as GitHub does, so these check it
against GitHub's own examples (tests/fixtures/github_api/) and documented
behaviour: cursor pages newest first, 401s, rate limits, server errors, 404s and
redeliveries.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
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


def walk(client: httpx.Client, url: str) -> list[list[int]]:
    """Every page's attempt ids, following each answer's Link rel="next" as given."""
    pages: list[list[int]] = []
    next_url: str | None = url
    while next_url:
        answer = client.get(next_url)
        assert answer.status_code == 200, answer.text
        pages.append([delivery["id"] for delivery in answer.json()])
        next_url = answer.links.get("next", {}).get("url")
    return pages


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
    assert set(listed) == {"hook-delivery-items.json", "hook-delivery.json"}
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
