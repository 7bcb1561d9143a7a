"""Deliveries that share a delivery id, through the real ingress and the worker,
on SQLite and PostgreSQL, with the fast path on and off (docs/contract.md,
15.6): no create is lost to an id another body holds, nothing is created
twice, and a catch-up copy of a delivery is that delivery, whatever its bytes.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from bench.fakes.github_api import FakeGitHub
from models.tables import Delivery, Task
from tests.support.deliveries import (
    FIXTURES,
    fixture,
    github_headers,
    gitlab_headers,
    gitlab_issue_opened,
)
from tests.support.ingress import GITHUB_SECRET, GITLAB_TOKEN, Ingress, open_ingress, wait_until
from tests.support.runs import run
from tests.support.scenarios import reading_the_github_log
from tests.support.stores import Store
from worker.catchup.github_log import DeliveryLog
from worker.catchup.service import catch_up_github

EVENT_UUID = "5b7a3e0c-2f4d-4d5e-9c1a-7e0f3a1b2c3d"
GUID = "00000000-0000-4000-8000-000000000042"
TOKEN = "ghp_catchup_token_never_shown"
HOOK = "repos/acme/widgets/hooks/123"


@pytest.fixture
def ingress(store: Store) -> Iterator[Ingress]:
    yield from open_ingress(store)


def executor(store: Store) -> str:
    return "fast" if store.takes_fast_path else "general"


def processed(ingress: Ingress) -> list:
    """Every delivery stored queued, run by the worker once, in the order the
    ingress (or the catch-up) handed them on -- once each was handed on: the
    relay publishes on a thread of its own."""
    queued = [row.id for row in deliveries(ingress.store) if row.status == "queued"]
    wait_until(lambda: sorted(ingress.published) == queued)
    return [run(ingress.store, pk) for pk in ingress.published]


def external_ids(store: Store) -> list[str]:
    with store.sessions() as session:
        return sorted(session.scalars(select(Task.external_id)))


def deliveries(store: Store) -> list[Delivery]:
    with store.sessions() as session:
        return list(session.scalars(select(Delivery).order_by(Delivery.id)))


# --- GitLab without Idempotency-Key -----------------------------------------------------


def post_gitlab(ingress: Ingress, body: bytes, event: str = "issue_hook__open"):
    """``body`` as an older GitLab sends it: no Idempotency-Key, so the
    X-Gitlab-Event-UUID of the request that caused it is its delivery id."""
    headers = gitlab_headers(event, GITLAB_TOKEN, **{"X-Gitlab-Event-UUID": EVENT_UUID})
    del headers["Idempotency-Key"]
    return ingress.client.post("/webhooks/gitlab/acme-gitlab", content=body, headers=headers)


def test_two_gitlab_creates_sharing_one_event_uuid_become_two_tasks(ingress: Ingress):
    store = ingress.store
    first, second = gitlab_issue_opened(23), gitlab_issue_opened(24)

    answers = [post_gitlab(ingress, body) for body in (first, second, first, second)]

    assert [answer.json()["status"] for answer in answers] == [
        "queued",
        "queued",
        "duplicate",
        "duplicate",
    ]
    runs = processed(ingress)
    assert [(one.status.value, one.outcome, one.path) for one in runs] == [
        ("done", "created", executor(store))
    ] * 2
    assert external_ids(store) == [
        "gl-issue/gitlabhq/gitlab-test#23",
        "gl-issue/gitlabhq/gitlab-test#24",
    ]
    stored, apart = deliveries(store)
    assert stored.delivery_id == EVENT_UUID
    assert apart.delivery_id.startswith(f"{EVENT_UUID}#")
    assert (stored.payload_mismatches, apart.status, apart.task_id) == (2, "done", runs[1].task_id)


def test_the_same_gitlab_create_twice_under_its_event_uuid_is_one_task(ingress: Ingress):
    body = gitlab_issue_opened(23)

    answers = [post_gitlab(ingress, body) for _ in range(2)]

    assert [answer.json()["status"] for answer in answers] == ["queued", "duplicate"]
    assert [one.outcome for one in processed(ingress)] == ["created"]
    assert external_ids(ingress.store) == ["gl-issue/gitlabhq/gitlab-test#23"]
    (row,) = deliveries(ingress.store)
    assert row.payload_mismatches == 0


def test_a_create_sharing_the_event_uuid_of_the_same_issue_is_found_not_made_again(
    ingress: Ingress,
):
    """Another body of the same issue under the id (a create is kept apart
    whatever the stored row made): the worker finds the task by its identity."""
    store = ingress.store
    body = gitlab_issue_opened(23)
    edited = json.loads(body)
    edited["object_attributes"]["title"] = "Issue 23, retitled"

    post_gitlab(ingress, body)
    post_gitlab(ingress, json.dumps(edited).encode())

    runs = processed(ingress)
    assert [one.outcome for one in runs] == ["created", "found_settled"]
    assert runs[0].task_id == runs[1].task_id
    assert external_ids(store) == ["gl-issue/gitlabhq/gitlab-test#23"]


def test_another_event_under_the_event_uuid_that_is_no_create_stays_a_counted_mismatch(
    ingress: Ingress,
):
    create = gitlab_issue_opened(23)
    post_gitlab(ingress, create)

    comment = post_gitlab(
        ingress, fixture("gitlab", "note_hook__issue_create"), event="note_hook__issue_create"
    )

    assert comment.json() == {"status": "duplicate"}
    assert [one.outcome for one in processed(ingress)] == ["created"]
    stored, apart = deliveries(ingress.store)
    assert (stored.payload_mismatches, apart.status) == (1, "mismatch")


# --- a catch-up copy racing the genuine delivery ----------------------------------------

OPENED = json.loads((FIXTURES / "github" / "issues__opened.json").read_text())


@pytest.fixture
def github(ingress: Ingress) -> Iterator[FakeGitHub]:
    with FakeGitHub(token=TOKEN) as fake:
        reading_the_github_log(ingress.store.sessions, fake.base_url, TOKEN)
        fake.log_delivery(
            hook=HOOK, guid=GUID, event="issues", action="opened", payload=OPENED, status_code=502
        )
        yield fake


def genuine(content_type: str, payload: dict = OPENED) -> tuple[bytes, dict[str, str]]:
    """The delivery as GitHub signed and sent it: its own bytes (spaced,
    escaped), as JSON or in GitHub's form encoding."""
    body = json.dumps(payload, indent=2).encode()
    if content_type == "form":
        body = b"payload=" + urllib.parse.quote_plus(body).encode()
    headers = github_headers("issues__opened", body, GITHUB_SECRET, delivery=GUID)
    if content_type == "form":
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    return body, headers


def post_genuine(ingress: Ingress, content_type: str, payload: dict = OPENED):
    body, headers = genuine(content_type, payload)
    return ingress.client.post("/webhooks/github/acme-github", content=body, headers=headers)


def catch_up(ingress: Ingress, *, before_each_fetch=lambda: None):
    """A catch-up of ``acme-github`` from the fake's log; ``before_each_fetch``
    runs between the listing (which found the guid missing) and the fetch."""

    class RacedLog(DeliveryLog):
        def request_of(self, attempt_id):
            before_each_fetch()
            return super().request_of(attempt_id)

    def open_log(settings):
        return RacedLog(
            hook_path=settings.hook_path, api_base_url=settings.api_base_url, token=TOKEN
        )

    return catch_up_github(
        sessions=ingress.store.sessions,
        slug="acme-github",
        send=ingress.published.extend,
        open_log=open_log,
    )


def mismatches_counted(ingress: Ingress) -> list[str]:
    metrics = ingress.client.get("/metrics").text
    return [line for line in metrics.splitlines() if line.startswith("taskhook_payload_mismatches")]


@pytest.mark.parametrize("content_type", ["json", "form"])
def test_a_catch_up_copy_of_a_delivery_the_ingress_took_meanwhile_is_a_duplicate(
    ingress: Ingress, github: FakeGitHub, content_type: str
):
    answers = []
    report = catch_up(
        ingress, before_each_fetch=lambda: answers.append(post_genuine(ingress, content_type))
    )

    assert [answer.json()["status"] for answer in answers] == ["queued"]
    assert (report.missed, report.recovered) == ([GUID], [])  # the copy was a duplicate
    (row,) = deliveries(ingress.store)
    assert (row.origin, row.payload_mismatches) == ("webhook", 0)
    assert [one.outcome for one in processed(ingress)] == ["created"]
    assert external_ids(ingress.store) == ["gh-issue/Codertocat/Hello-World#1"]
    assert mismatches_counted(ingress) == []


@pytest.mark.parametrize("content_type", ["json", "form"])
def test_the_genuine_delivery_after_its_catch_up_copy_is_a_duplicate(
    ingress: Ingress, github: FakeGitHub, content_type: str
):
    report = catch_up(ingress)
    answer = post_genuine(ingress, content_type)

    assert len(report.recovered) == 1
    assert answer.json() == {"status": "duplicate"}
    (row,) = deliveries(ingress.store)
    assert (row.origin, row.payload_mismatches) == ("catch-up", 0)
    assert [one.outcome for one in processed(ingress)] == ["created"]
    assert external_ids(ingress.store) == ["gh-issue/Codertocat/Hello-World#1"]
    assert mismatches_counted(ingress) == []


@pytest.mark.parametrize("genuine_first", [True, False])
def test_another_payload_under_the_guid_is_still_a_counted_mismatch(
    ingress: Ingress, github: FakeGitHub, genuine_first: bool
):
    """What the comparison is for: a payload that differs (another issue)
    under the guid is counted, and as a create is kept apart and processed."""
    other = json.loads(json.dumps(OPENED))
    other["issue"]["number"] = 2
    other["issue"]["html_url"] = "https://github.com/Codertocat/Hello-World/issues/2"
    if genuine_first:
        catch_up(ingress, before_each_fetch=lambda: post_genuine(ingress, "json", other))
    else:
        catch_up(ingress)
        post_genuine(ingress, "json", other)

    stored, apart = deliveries(ingress.store)
    assert (stored.payload_mismatches, apart.status) == (1, "queued")
    assert [one.outcome for one in processed(ingress)] == ["created", "created"]
    assert external_ids(ingress.store) == [
        "gh-issue/Codertocat/Hello-World#1",
        "gh-issue/Codertocat/Hello-World#2",
    ]
