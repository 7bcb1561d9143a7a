"""The GitLab API client (worker/catchup/gitlab_api.py), against
httpx.MockTransport: the hook found by its URL, events read back to a time
(or all, when GitLab does not date them), items of a project path named as
one segment, pages by X-Next-Page, and errors that never hold the token."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from worker.catchup.api import BadCredentials, UnexpectedResponse
from worker.catchup.gitlab_api import GitLabApi

TOKEN = "glpat-NeverShowThisToken"
API = "https://gitlab.example.com/api/v4"
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def client(handler) -> GitLabApi:
    return GitLabApi(
        api_base_url=API,
        token=TOKEN,
        transport=httpx.MockTransport(handler),
        sleep=lambda seconds: None,
    )


def event(number: int, created: datetime | None) -> dict:
    row = {
        "id": number,
        "request_headers": {"X-Gitlab-Event": "Issue Hook", "Idempotency-Key": f"k-{number}"},
        "request_data": {"object_kind": "issue"},
        "response_status": "internal error",
    }
    return row | ({} if created is None else {"created_at": created.isoformat()})


def test_the_sources_hook_is_the_one_whose_url_ends_with_its_route():
    hooks = [
        {"id": 1, "url": "https://in.example.com/webhooks/gitlab/acme-gitlab-2"},
        {"id": 2, "url": "https://in.example.com/base/webhooks/gitlab/acme-gitlab/"},
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.raw_path == b"/api/v4/projects/acme%2Fwidgets/hooks?per_page=100"
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        return httpx.Response(200, json=hooks)

    assert client(handler).hook_of("projects/acme/widgets", "acme-gitlab") == "2"
    assert client(handler).hook_of("projects/acme/widgets", "nobody") is None


def test_events_stop_at_the_first_one_older_than_the_window_and_all_are_read_undated():
    pages = {
        None: [event(3, NOW), event(2, NOW - timedelta(hours=1))],
        "2": [event(1, NOW - timedelta(hours=3))],
    }

    def handler(request: httpx.Request) -> httpx.Response:
        page = request.url.params.get("page")
        assert request.url.params["per_page"] == "20"
        more = {"x-next-page": "2"} if page is None else {"x-next-page": ""}
        return httpx.Response(200, json=pages[page], headers=more)

    read = client(handler).hook_events("groups/7", "5", since=NOW - timedelta(hours=2))
    assert [e.id for e in read] == [3, 2]

    undated = {None: [event(2, None)], "2": [event(1, None)]}

    def old_gitlab(request: httpx.Request) -> httpx.Response:
        page = request.url.params.get("page")
        more = {"x-next-page": "2"} if page is None else {"x-next-page": ""}
        return httpx.Response(200, json=undated[page], headers=more)

    assert [e.id for e in client(old_gitlab).hook_events("groups/7", "5", since=NOW)] == [2, 1]


def test_an_oversize_body_is_no_payload():
    row = event(1, NOW) | {"request_data": {"oversize": True}}
    api = client(lambda request: httpx.Response(200, json=[row]))
    (found,) = api.hook_events("projects/1", "5", since=NOW - timedelta(hours=1))
    assert found.payload is None and found.headers["Idempotency-Key"] == "k-1"


def test_items_name_their_project_by_their_full_reference():
    issue = {
        "id": 41,
        "iid": 1,
        "created_at": "2026-12-06T11:00:00.000Z",
        "confidential": True,
        "references": {"full": "acme/sub/widgets#1"},
    }
    mr = {"id": 9, "iid": 4, "created_at": "2026-12-06T11:30:00Z", "references": {"full": "a/b!4"}}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["created_after"] == "2026-12-06T10:00:00Z"
        assert request.url.params["scope"] == "all" and request.url.params["state"] == "all"
        return httpx.Response(200, json=[mr] if request.url.path.endswith("requests") else [issue])

    found = list(client(handler).created_since("projects/1", since=NOW - timedelta(hours=2)))
    assert [(f.hook, f.project_path, f.iid) for f in found] == [
        ("Confidential Issue Hook", "acme/sub/widgets", 1),
        ("Merge Request Hook", "a/b", 4),
    ]


def test_an_item_without_a_reference_or_a_page_that_repeats_is_an_unexpected_response():
    bare = client(lambda request: httpx.Response(200, json=[{"iid": 1, "created_at": "x"}]))
    with pytest.raises(UnexpectedResponse, match="full reference"):
        list(bare.created_since("projects/1", since=NOW))
    looping = client(lambda request: httpx.Response(200, json=[], headers={"x-next-page": "2"}))
    with pytest.raises(UnexpectedResponse, match="no new next page"):
        list(looping.created_since("projects/1", since=NOW))


def test_refusals_are_one_line_without_the_token():
    def handler(request: httpx.Request) -> httpx.Response:
        if "hooks" in request.url.path:
            return httpx.Response(403, json={"message": f"403 Forbidden for {TOKEN}"})
        return httpx.Response(404, json={"message": "404 Project Not Found"})

    api = client(handler)
    with pytest.raises(BadCredentials, match="Maintainer") as forbidden:
        list(api.hook_events("projects/1", "5", since=NOW))
    with pytest.raises(BadCredentials, match="no project 1, or the token may not") as hidden:
        list(api.created_since("projects/1", since=NOW))
    for error in (forbidden.value, hidden.value):
        assert TOKEN not in str(error) and "\n" not in str(error)
