"""The fake GitLab (bench/fakes/gitlab_api.py), over a real socket: its answers
carry every key of GitLab's published examples (tests/fixtures/gitlab_api/), and
it pages, filters and refuses as GitLab documents. The GitLab catch-up's tests
trust it to."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.fakes.gitlab_api import FakeGitLab

TOKEN = "glpat-fake-token"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
FIXTURES = Path(__file__).parents[1] / "fixtures" / "gitlab_api"


@pytest.fixture
def gitlab() -> Iterator[FakeGitLab]:
    fake = FakeGitLab(token=TOKEN, clock=lambda: NOW)
    fake.add_project("acme/widgets")
    yield from fake.serve()


@pytest.fixture
def client(gitlab: FakeGitLab) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=f"{gitlab.base_url}/api/v4", headers=headers, timeout=5) as c:
        yield c


def example(name: str) -> Any:
    return json.loads((FIXTURES / name).read_bytes())


def test_the_recorded_examples_are_the_bytes_sources_md_names():
    sources = (FIXTURES / "SOURCES.md").read_text()
    listed = dict(re.findall(r"\| `([\w-]+\.json)` \|.*\| `([0-9a-f]{64})` \|", sources))
    assert set(listed) == {"project-hook-events.json", "issue.json", "merge-requests.json"}
    for name, digest in listed.items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest


def test_items_and_events_carry_every_key_of_gitlabs_examples(gitlab, client):
    issue = gitlab.create_issue("acme/widgets")
    gitlab.create_merge_request("acme/widgets")
    hook = gitlab.add_hook("projects/acme/widgets", "https://taskhook.example.com/x")
    gitlab.record_event(hook, event="Issue Hook", payload={"object_kind": "issue"})

    (listed,) = client.get("/projects/acme%2Fwidgets/issues").json()
    (merge_request,) = client.get(f"/projects/{issue['project_id']}/merge_requests").json()
    (event,) = client.get(f"/projects/acme%2Fwidgets/hooks/{hook}/events").json()

    assert set(example("issue.json")) <= set(listed)
    assert set(example("merge-requests.json")[0]) <= set(merge_request)
    assert set(example("project-hook-events.json")[0]) | {"created_at"} == set(event)
    assert listed["references"]["full"] == "acme/widgets#1"
    assert merge_request["references"]["full"] == "acme/widgets!1"
    assert event["request_headers"]["X-Gitlab-Token"] == "[REDACTED]"


def test_listings_page_by_offset_and_filter_by_creation(gitlab, client):
    for minutes in range(5, 0, -1):
        gitlab.create_issue("acme/widgets", created_at=NOW - timedelta(minutes=minutes))
    since = (NOW - timedelta(minutes=3)).isoformat()
    first = client.get(
        "/projects/acme%2Fwidgets/issues", params={"created_after": since, "per_page": 2}
    )
    assert [row["iid"] for row in first.json()] == [5, 4]
    assert first.headers["x-next-page"] == "2" and first.headers["x-total"] == "3"
    last = client.get(
        "/projects/acme%2Fwidgets/issues", params={"created_after": since, "per_page": 2, "page": 2}
    )
    assert [row["iid"] for row in last.json()] == [3] and last.headers["x-next-page"] == ""


def test_events_are_the_last_seven_days_newest_first_twenty_a_page_at_most(gitlab, client):
    hook = gitlab.add_hook("projects/acme/widgets", "https://taskhook.example.com/x")
    old = gitlab.record_event(
        hook, event="Issue Hook", payload={}, created_at=NOW - timedelta(days=9)
    )
    new = [gitlab.record_event(hook, event="Issue Hook", payload={}) for _ in range(2)]
    path = f"/projects/acme%2Fwidgets/hooks/{hook}/events"
    assert [row["id"] for row in client.get(path).json()] == [new[1]["id"], new[0]["id"]]
    assert old["id"] not in {row["id"] for row in client.get(path).json()}
    assert client.get(path, params={"per_page": 21}).status_code == 400


def test_refusals_are_gitlabs(gitlab, client):
    assert httpx.get(f"{gitlab.base_url}/api/v4/projects/1/issues").status_code == 401
    missing = client.get("/projects/nobody%2Fnothing/issues")
    assert missing.status_code == 404 and missing.json() == {"message": "404 Project Not Found"}
    assert client.get("/projects/acme%2Fwidgets/hooks/99/events").status_code == 404
    gitlab.rate_limit_next(retry_after=3)
    limited = client.get("/projects/acme%2Fwidgets/issues")
    assert limited.status_code == 429 and limited.headers["retry-after"] == "3"
