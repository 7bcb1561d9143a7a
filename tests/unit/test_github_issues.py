"""The scan's client of GitHub's Issues API (worker/catchup/github_issues.py),
against httpx.MockTransport: the query it sends, paging by the Link header's
page number, the stop at ``since``, pull requests, an App's installation
token, and errors that never hold the token."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from worker.catchup.api import BadCredentials, UnexpectedResponse
from worker.catchup.github_issues import AppInstallation, IssueListing

TOKEN = "ghp_ScanT0kenThatMustNeverShow0123456789"
API = "https://api.github.com"
REPO = "acme/widgets"
SINCE = datetime(2026, 11, 1, tzinfo=UTC)


def item(number: int, created: datetime, *, pull: bool = False) -> dict:
    row = {
        "number": number,
        "title": f"Item {number}",
        "html_url": f"https://github.com/{REPO}/{'pull' if pull else 'issues'}/{number}",
        "created_at": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if pull:
        row["pull_request"] = {"url": f"{API}/repos/{REPO}/pulls/{number}"}
    return row


def paged(pages: list[list[dict]], seen: list[httpx.Request]):
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        page = int(request.url.params.get("page", "1"))
        headers = {}
        if page < len(pages):
            headers["Link"] = (
                f'<{API}/repositories/1/issues?page={page + 1}>; rel="next", '
                f'<{API}/repositories/1/issues?page={len(pages)}>; rel="last"'
            )
        return httpx.Response(200, json=pages[page - 1], headers=headers)

    return answer


def listing(handler) -> IssueListing:
    return IssueListing(
        api_base_url=API, token=TOKEN, transport=httpx.MockTransport(handler), sleep=lambda s: None
    )


def test_it_pages_newest_first_and_stops_at_the_first_item_older_than_since():
    newest = SINCE + timedelta(hours=150)  # item n was created n hours before it
    pages = [
        [item(n, newest - timedelta(hours=n), pull=n % 3 == 0) for n in range(1, 101)],
        [item(n, newest - timedelta(hours=n)) for n in range(101, 201)],
        [item(999, newest)],  # never asked for: page 2 reached an item older than since
    ]
    seen: list[httpx.Request] = []
    with listing(paged(pages, seen)) as client:
        items = list(client.created_since(REPO, since=SINCE))
    assert [i.number for i in items] == list(range(1, 151))
    assert {i.number for i in items if i.pull_request} == set(range(3, 101, 3))
    assert len(seen) == 2
    first = seen[0].url
    assert first.path == f"/repos/{REPO}/issues"
    assert dict(first.params) == {
        "state": "all",
        "sort": "created",
        "direction": "desc",
        "since": "2026-11-01T00:00:00Z",
        "per_page": "100",
    }
    assert seen[1].url.params["page"] == "2"
    assert seen[0].headers["authorization"] == f"Bearer {TOKEN}"


def test_the_next_page_is_asked_of_the_same_host_whatever_the_link_names():
    pages = [[item(1, SINCE + timedelta(days=2))], [item(2, SINCE + timedelta(days=1))]]
    seen: list[httpx.Request] = []

    def elsewhere(request: httpx.Request) -> httpx.Response:
        answer = paged(pages, seen)(request)
        if "link" in answer.headers:
            answer.headers["Link"] = '<https://evil.example/steal?page=2>; rel="next"'
        return answer

    with listing(elsewhere) as client:
        assert [i.number for i in client.created_since(REPO, since=SINCE)] == [1, 2]
    assert {request.url.host for request in seen} == {"api.github.com"}


def test_a_listing_that_pages_in_a_circle_is_an_error_not_a_loop():
    def circle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            json=[item(1, SINCE + timedelta(days=1))],
            headers={"Link": f'<{API}/repositories/1/issues?page=2>; rel="next"'},
        )

    with listing(circle) as client, pytest.raises(UnexpectedResponse, match="same next page"):
        list(client.created_since(REPO, since=SINCE))


@pytest.mark.parametrize(
    "row",
    [{"title": "no number"}, {"number": 1, "created_at": "yesterday"}, "not an object"],
)
def test_an_item_not_as_documented_is_an_unexpected_response(row):
    client = listing(lambda request: httpx.Response(200, json=[row]))
    with client, pytest.raises(UnexpectedResponse):
        list(client.created_since(REPO, since=SINCE))


def test_a_hidden_repository_is_bad_credentials_and_the_token_never_shows():
    def hidden(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"message": f"Not Found {TOKEN}"})

    with listing(hidden) as client, pytest.raises(BadCredentials) as raised:
        list(client.created_since(REPO, since=SINCE))
    assert "acme/widgets" in str(raised.value) and TOKEN not in str(raised.value)


def test_a_token_without_the_issues_permission_says_which_it_needs():
    def forbidden(request: httpx.Request) -> httpx.Response:
        return httpx.Response(403, json={"message": "Resource not accessible by integration"})

    with listing(forbidden) as client, pytest.raises(BadCredentials, match="'Issues'"):
        list(client.created_since(REPO, since=SINCE))


def test_an_app_mints_an_installation_token_with_its_jwt():
    seen: list[httpx.Request] = []

    def github(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == f"/repos/{REPO}/installation":
            return httpx.Response(200, json={"id": 77, "app_id": 4200})
        assert request.method == "POST"
        assert request.url.path == "/app/installations/77/access_tokens"
        return httpx.Response(201, json={"token": "ghs_minted", "expires_at": "2026-12-02T01Z"})

    app = AppInstallation(
        api_base_url=API,
        authorization=lambda: "Bearer eyJ.app.jwt",
        transport=httpx.MockTransport(github),
    )
    with app:
        assert app.token_for(REPO) == "ghs_minted"
    assert [r.headers["authorization"] for r in seen] == ["Bearer eyJ.app.jwt"] * 2


def test_an_app_not_installed_on_the_repository_says_so():
    app = AppInstallation(
        api_base_url=API,
        authorization=lambda: "Bearer eyJ.app.jwt",
        transport=httpx.MockTransport(lambda request: httpx.Response(404, json={})),
    )
    with app, pytest.raises(BadCredentials, match="not installed on acme/widgets"):
        app.token_for(REPO)


# --- the repository's id ------------------------------------------------------


def test_the_repository_id_is_read_from_the_repository_itself():
    seen: list[httpx.Request] = []

    def repository(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"id": 1296269, "full_name": REPO})

    with listing(repository) as client:
        assert client.repository_id(REPO) == 1296269
    (request,) = seen
    assert (request.method, request.url.path) == ("GET", f"/repos/{REPO}")


@pytest.mark.parametrize("answer", [{}, {"id": "1296269"}, {"id": True}, {"id": 0}, [1296269]])
def test_a_repository_without_an_id_is_an_unexpected_response(answer):
    with (
        listing(lambda request: httpx.Response(200, json=answer)) as client,
        pytest.raises(UnexpectedResponse, match="names no repository id"),
    ):
        client.repository_id(REPO)


def test_a_hidden_repository_has_no_id_to_read_and_the_token_never_shows():
    def hidden(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"message": "Not Found"})

    with listing(hidden) as client, pytest.raises(BadCredentials) as raised:
        client.repository_id(REPO)
    assert "acme/widgets" in str(raised.value) and TOKEN not in str(raised.value)
