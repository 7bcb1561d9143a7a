"""The webhook ingress through HTTP, on SQLite and PostgreSQL: one test per
fixture and per status code."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from ingest.app import create_app
from ingest.webhooks import Refusal, _receive_body
from models.db import session_scope
from models.providers import PROVIDERS
from models.providers.signing import HmacSha256Stream
from models.sources import add_secret, add_source, set_source_enabled
from models.tables import Delivery
from tests.support.deliveries import fixture, fixture_names, github_headers, jira_headers, sign
from tests.support.ingress import (
    GITHUB_SECRET,
    JIRA_SECRET,
    JIRA_SITE,
    Ingress,
    settings_for,
    wait_until,
)
from tests.support.stores import Store

GITHUB_CREATES = [
    "issues__opened",
    "issues__opened_via_transfer",
    "issues__opened_with_organization",
    "pull_request__opened",
]
JIRA_CREATES = [
    "jira_issue_created__cloud",
    "jira_issue_created__cloud_many_fields",
    "jira_issue_created__server_trigger_plugin",
]
#: Fixtures that announce a move: stored for the worker though they create nothing.
#: (repository__renamed names the name it has now: no move, ignored.)
GITHUB_MOVES = ["issues__transferred", "repository__transferred"]
JIRA_MOVES = ["jira_issue_updated__cloud_issue_moved"]


@pytest.mark.parametrize("name", GITHUB_CREATES)
def test_a_github_create_event_is_stored_queued_and_enqueued(ingress: Ingress, name):
    response = ingress.github(name)

    assert response.status_code == 202
    (row,) = ingress.deliveries()
    assert response.json() == {"delivery": row.id, "status": "queued"}
    event = f"{name.split('__')[0]}.opened"  # issues__opened_... -> issues.opened
    assert (row.status, row.body, row.event) == ("queued", fixture("github", name), event)
    assert row.action == "opened"
    # The identity the body names, kept for the worker's claim (models.fastpath).
    kind = "gh-pr" if row.event == "pull_request.opened" else "gh-issue"
    assert row.external_id.startswith(f"{kind}/")
    if "changes" in json.loads(row.body):
        # A create that names where the item was before (a transfer): the
        # worker reads it whole, to join the item's names; no draft is kept.
        assert (row.draft_title, row.draft_url) == (None, None)
    else:
        assert_keeps_the_draft(row, site=None)
    wait_until(lambda: ingress.published == [row.id])


@pytest.mark.parametrize("name", JIRA_CREATES)
def test_a_jira_create_event_is_stored_queued_and_enqueued(ingress: Ingress, name):
    response = ingress.jira(name)

    assert response.status_code == 202
    (row,) = ingress.deliveries()
    assert response.json() == {"delivery": row.id, "status": "queued"}
    assert (row.status, row.event, row.body) == (
        "queued",
        "jira:issue_created",
        fixture("jira", name),
    )
    assert row.external_id == f"jira:{json.loads(row.body)['issue']['key']}"
    assert_keeps_the_draft(row, site=JIRA_SITE)
    wait_until(lambda: ingress.published == [row.id])


def assert_keeps_the_draft(row: Delivery, *, site: str | None) -> None:
    """The row keeps the task its body describes, as the worker would read it."""
    adapter = PROVIDERS["jira" if row.event.startswith("jira:") else "github"]
    draft = adapter.to_draft(row.event, json.loads(row.body), site=site)
    kept = (row.draft_title, row.draft_description, row.draft_url, row.draft_remote_key)
    assert kept == (draft.title.strip(), draft.description, draft.url, draft.remote_key)
    assert row.external_id == draft.external_id


@pytest.mark.parametrize(
    ("provider", "name"),
    [("github", name) for name in GITHUB_MOVES] + [("jira", name) for name in JIRA_MOVES],
)
def test_a_delivery_that_announces_a_move_is_stored_queued_and_enqueued(
    ingress: Ingress, provider, name
):
    response = ingress.send(provider, name)

    assert response.status_code == 202
    (row,) = ingress.deliveries()
    assert response.json() == {"delivery": row.id, "status": "queued"}
    assert (row.status, row.status_reason) == ("queued", "announces a move")
    assert row.body == fixture(provider, name)
    # It creates nothing: no identity or draft for the worker's claim.
    assert (row.external_id, row.draft_title, row.draft_url) == (None, None, None)
    wait_until(lambda: ingress.published == [row.id])


def test_a_move_event_that_announces_none_is_stored_as_ignored(ingress: Ingress):
    # octokit's recorded rename names the name the repository has now.
    response = ingress.github("repository__renamed")

    assert (response.status_code, response.json()) == (202, {"status": "ignored"})
    (row,) = ingress.deliveries()
    assert (row.event, row.status) == ("repository.renamed", "ignored")
    assert row.status_reason == "repository.renamed does not create tasks for this source"
    assert ingress.published == []


def test_a_move_that_cannot_be_read_is_stored_as_ignored_saying_why(ingress: Ingress):
    body = json.loads(fixture("github", "issues__transferred"))
    del body["changes"]["new_repository"]

    response = ingress.github("issues__transferred", body=json.dumps(body).encode())

    assert (response.status_code, response.json()) == (202, {"status": "ignored"})
    (row,) = ingress.deliveries()
    assert row.status == "ignored"
    assert row.status_reason.startswith("issues.transferred does not create tasks")
    assert "the move it names cannot be read" in row.status_reason
    assert "changes.new_repository" in row.status_reason
    assert ingress.published == []


@pytest.mark.parametrize(
    "name", sorted(set(fixture_names("github")) - set(GITHUB_CREATES) - set(GITHUB_MOVES))
)
def test_other_github_events_are_stored_as_ignored(ingress: Ingress, name):
    response = ingress.github(name)
    assert (response.status_code, response.json()) == (202, {"status": "ignored"})
    (row,) = ingress.deliveries()
    assert row.status == "ignored"
    assert "does not create tasks" in row.status_reason
    assert row.external_id is None  # only a delivery for the worker names one
    assert (row.draft_title, row.draft_url) == (None, None)
    assert ingress.published == []


@pytest.mark.parametrize(
    "name", sorted(set(fixture_names("jira")) - set(JIRA_CREATES) - set(JIRA_MOVES))
)
def test_other_jira_events_are_stored_as_ignored(ingress: Ingress, name):
    response = ingress.jira(name)
    assert (response.status_code, response.json()) == (202, {"status": "ignored"})
    assert [row.status for row in ingress.deliveries()] == ["ignored"]


def test_github_ping_is_answered_2xx_and_recorded(ingress: Ingress):
    response = ingress.github("ping__basic")
    assert response.status_code == 202
    (row,) = ingress.deliveries()
    assert (row.event, row.status) == ("ping", "ignored")


def test_stored_headers_are_an_allowlist_without_signatures(ingress: Ingress):
    ingress.github("issues__opened", Authorization="Bearer nope", Cookie="a=b")
    (row,) = ingress.deliveries()
    assert set(row.headers) == {
        "content-type",
        "user-agent",
        "x-github-event",
        "x-github-delivery",
        "x-github-hook-id",
    }
    assert row.hook_id == "123456"


def test_a_form_encoded_github_delivery_is_accepted_and_kept_byte_exact(ingress: Ingress):
    body = "payload=" + urllib.parse.quote_plus(fixture("github", "issues__opened").decode())
    body = body.encode()
    response = ingress.github(
        "issues__opened", body=body, **{"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert response.json()["status"] == "queued"
    assert ingress.deliveries()[0].body == body


def test_a_nul_in_a_signed_body_is_stored_byte_exact(ingress: Ingress):
    # PostgreSQL text and jsonb reject \u0000; the inbox keeps bytes.
    payload = json.loads(fixture("jira", "jira_issue_created__cloud"))
    payload["issue"]["fields"]["summary"] = "nul \u0000 inside"
    body = json.dumps(payload).encode()
    assert b"\\u0000" in body

    assert ingress.jira("jira_issue_created__cloud", body=body).status_code == 202
    assert ingress.deliveries()[0].body == body


# --- duplicates ------------------------------------------------------------------


def test_the_same_delivery_twice_is_stored_and_enqueued_once(ingress: Ingress):
    body = fixture("jira", "jira_issue_created__cloud")
    headers = jira_headers(body, JIRA_SECRET, delivery="4242")
    first = ingress.client.post("/webhooks/jira/acme-jira", content=body, headers=headers)
    again = ingress.client.post("/webhooks/jira/acme-jira", content=body, headers=headers)

    assert first.json()["status"] == "queued"
    assert (again.status_code, again.json()) == (202, {"status": "duplicate"})
    assert len(ingress.deliveries()) == 1
    # The relay publishes in order: once a later delivery is out, a second
    # publish of the first would have come before it. No sleeping on a maybe.
    later = ingress.github("issues__opened").json()["delivery"]
    wait_until(lambda: later in ingress.published)
    assert ingress.published == [first.json()["delivery"], later]


def test_a_jira_retry_without_an_identifier_deduplicates_on_the_body(ingress: Ingress):
    body = fixture("jira", "jira_issue_created__server_trigger_plugin")
    headers = {"Content-Type": "application/json", "X-Hub-Signature": sign(body, JIRA_SECRET)}
    for _ in range(3):
        ingress.client.post("/webhooks/jira/acme-jira", content=body, headers=headers)
    (row,) = ingress.deliveries()
    assert row.delivery_id.startswith("sha256:")


def test_another_body_under_a_stored_id_is_a_counted_duplicate_kept_apart(ingress: Ingress):
    first_body = fixture("github", "issues__opened")
    other_body = fixture("github", "issues__closed")
    ingress.github("issues__opened", body=first_body, **{"X-GitHub-Delivery": "d-1"})

    again = ingress.github("issues__closed", body=other_body, **{"X-GitHub-Delivery": "d-1"})

    assert (again.status_code, again.json()) == (202, {"status": "duplicate"})
    row, apart = ingress.deliveries()
    assert (row.body, row.payload_mismatches) == (first_body, 1)
    # Kept for an operator, never processed: it is no create.
    assert (apart.body, apart.status) == (other_body, "mismatch")
    metrics = ingress.client.get("/metrics").text
    assert 'taskhook_payload_mismatches_total{provider="github"} 1.0' in metrics


def test_another_create_under_a_stored_id_is_counted_and_queued_on_its_own(ingress: Ingress):
    first_body = fixture("github", "issues__opened")
    other_body = fixture("github", "issues__opened_with_organization")
    first = ingress.github("issues__opened", body=first_body, **{"X-GitHub-Delivery": "d-1"})

    again = ingress.github("issues__opened", body=other_body, **{"X-GitHub-Delivery": "d-1"})

    row, apart = ingress.deliveries()
    assert again.status_code == 202
    assert again.json() == {"delivery": apart.id, "status": "queued"}
    assert (row.body, row.payload_mismatches) == (first_body, 1)
    assert (apart.body, apart.status) == (other_body, "queued")
    wait_until(lambda: ingress.published == [first.json()["delivery"], apart.id])
    metrics = ingress.client.get("/metrics").text
    assert 'taskhook_payload_mismatches_total{provider="github"} 1.0' in metrics


# --- refusals: nothing stored ----------------------------------------------------------


def test_a_missing_signature_is_401(ingress: Ingress):
    response = ingress.github("issues__opened", **{"X-Hub-Signature-256": ""})
    assert response.status_code == 401
    assert ingress.deliveries() == []


def test_a_wrong_signature_is_401(ingress: Ingress):
    assert ingress.jira("jira_issue_created__cloud", secret="not-the-secret").status_code == 401
    assert ingress.deliveries() == []
    assert (
        'taskhook_rejected_signatures_total{provider="jira"} 1.0'
        in ingress.client.get("/metrics").text
    )


def test_a_sha1_signature_alone_is_not_enough_for_github(ingress: Ingress):
    body = fixture("github", "issues__opened")
    headers = github_headers("issues__opened", body, GITHUB_SECRET)
    del headers["X-Hub-Signature-256"]
    headers["X-Hub-Signature"] = "sha1=0123456789abcdef0123456789abcdef01234567"
    response = ingress.client.post("/webhooks/github/acme-github", content=body, headers=headers)
    assert response.status_code == 401


def test_header_names_match_whatever_their_case(ingress: Ingress):
    body = fixture("github", "issues__opened")
    headers = {
        name.swapcase(): value
        for name, value in github_headers("issues__opened", body, GITHUB_SECRET).items()
    }
    response = ingress.client.post("/webhooks/github/acme-github", content=body, headers=headers)
    assert response.status_code == 202


def test_any_active_secret_verifies_during_a_rotation(ingress: Ingress):
    with session_scope(ingress.store.sessions) as session:
        add_secret(session=session, slug="acme-github", new_secret="gh-secret-2")
    assert ingress.github("issues__opened", secret=GITHUB_SECRET).status_code == 202
    assert ingress.github("issues__opened", secret="gh-secret-2").status_code == 202
    assert ingress.github("issues__opened", secret="gh-secret-3").status_code == 401


@pytest.mark.parametrize("source", ["nope", "acme-jira"])
def test_an_unknown_source_is_404(ingress: Ingress, source):
    # acme-jira exists, but not as a GitHub source: the same answer.
    assert ingress.github("issues__opened", source=source).status_code == 404
    assert ingress.deliveries() == []


def test_a_disabled_source_is_404(ingress: Ingress):
    with session_scope(ingress.store.sessions) as session:
        set_source_enabled(session=session, slug="acme-github", enabled=False)
    assert ingress.github("issues__opened").status_code == 404


def test_a_missing_delivery_header_is_400(ingress: Ingress):
    response = ingress.github("issues__opened", **{"X-GitHub-Delivery": ""})
    assert response.status_code == 400
    assert "X-GitHub-Delivery" in response.json()["error"]
    assert ingress.deliveries() == []


def test_a_missing_event_is_400(ingress: Ingress):
    assert ingress.github("issues__opened", **{"X-GitHub-Event": ""}).status_code == 400
    body = json.dumps({"issue": {"key": "PROJ-1"}}).encode()
    assert ingress.jira("jira_issue_created__cloud", body=body).status_code == 400
    assert ingress.deliveries() == []


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_a_signed_body_that_is_not_a_json_object_is_400(ingress: Ingress, body):
    assert ingress.jira("jira_issue_created__cloud", body=body).status_code == 400
    assert ingress.deliveries() == []


def test_an_unsupported_content_type_is_415(ingress: Ingress):
    response = ingress.jira("jira_issue_created__cloud", **{"Content-Type": "text/plain"})
    assert response.status_code == 415
    assert ingress.deliveries() == []


def test_a_declared_oversized_body_is_413_before_it_is_read(store: Store):
    store.workspace()
    app = create_app(settings_for(store.url, max_body_bytes=1000), publish=lambda keys, lane: None)
    with TestClient(app) as client:
        with session_scope(store.sessions) as session:
            add_source(
                session=session,
                provider="jira",
                workspace_id=1,
                slug="j",
                secret="s",
                create_events=["jira:issue_created"],
            )
        body = fixture("jira", "jira_issue_created__cloud")
        response = client.post("/webhooks/jira/j", content=body, headers=jira_headers(body, "s"))
        assert response.status_code == 413


def test_a_streamed_oversized_body_is_refused_without_buffering_it_all():
    # The test client buffers request bodies, so the stream is driven directly.
    chunks_read = []

    async def receive():
        chunks_read.append(1)
        return {"type": "http.request", "body": b"x" * 1024, "more_body": True}

    with pytest.raises(Refusal) as refused:
        asyncio.run(_receive_body(receive, None, 64 * 1024, HmacSha256Stream(["s"])))
    assert refused.value.status == 413
    assert len(chunks_read) == 65


# --- a sick database or broker -------------------------------------------------------


def test_an_unreachable_database_is_503_with_retry_after():
    url = "postgresql+psycopg://postgres@127.0.0.1:1/nowhere?connect_timeout=1"
    with TestClient(create_app(settings_for(url), publish=lambda keys, lane: None)) as client:
        body = fixture("jira", "jira_issue_created__cloud")
        response = client.post("/webhooks/jira/j", content=body, headers=jira_headers(body, "s"))
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "5"
        assert client.get("/readyz").status_code == 503


def test_a_down_broker_still_gets_202_and_leaves_the_row_queued(store: Store):
    workspace = store.workspace()
    with session_scope(store.sessions) as session:
        add_source(
            session=session,
            provider="jira",
            workspace_id=workspace.id,
            slug="j",
            secret="s",
            create_events=["jira:issue_created"],
        )
    settings = settings_for(
        store.url, broker_url="redis://127.0.0.1:1/0", enqueue_timeout_seconds=0.5
    )
    with TestClient(create_app(settings)) as client:
        body = fixture("jira", "jira_issue_created__cloud")
        started = time.monotonic()
        response = client.post("/webhooks/jira/j", content=body, headers=jira_headers(body, "s"))
        answered_in = time.monotonic() - started
        assert response.status_code == 202
        assert response.json()["status"] == "queued"
        wait_until(
            lambda: "taskhook_relay_dropped_total 1.0" in client.get("/metrics").text, timeout=15
        )
    assert answered_in < 2.0
    with store.sessions() as session:
        assert session.scalars(select(Delivery.status)).all() == ["queued"]


# --- operations ----------------------------------------------------------------------


def test_health_readiness_and_metrics(ingress: Ingress):
    assert ingress.client.get("/healthz").json() == {"status": "ok"}
    ready = ingress.client.get("/readyz")
    assert ready.status_code == 200, ready.json()
    ingress.github("issues__opened")
    metrics = ingress.client.get("/metrics").text
    # No source names unless asked for (TASKHOOK_METRICS_SOURCE_LABELS).
    assert 'taskhook_deliveries_total{provider="github",result="queued",source="-"} 1.0' in metrics
    assert "acme-github" not in metrics
    assert "taskhook_ingress_seconds_bucket" in metrics


# --- never a 500 -------------------------------------------------------------------------

any_header_value = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    provider=st.sampled_from(["github", "jira"]),
    body=st.one_of(st.binary(max_size=300), st.just(fixture("jira", "jira_issue_created__cloud"))),
    content_type=st.sampled_from(
        ["application/json", "application/x-www-form-urlencoded", "text/plain", "", "a/b; c=d"]
    ),
    sign_it=st.booleans(),
    delivery=st.one_of(st.none(), any_header_value),
    event=st.one_of(st.none(), any_header_value, st.sampled_from(["issues", "ping", "push"])),
)
def test_no_input_gets_a_500(
    ingress: Ingress, provider, body, content_type, sign_it, delivery, event
):
    secret = GITHUB_SECRET if provider == "github" else JIRA_SECRET
    headers = {"Content-Type": content_type}
    if sign_it:
        headers["X-Hub-Signature-256" if provider == "github" else "X-Hub-Signature"] = sign(
            body, secret
        )
    if delivery is not None:
        headers[
            "X-GitHub-Delivery" if provider == "github" else "X-Atlassian-Webhook-Identifier"
        ] = delivery
    if event is not None:
        headers["X-GitHub-Event"] = event
    response = ingress.client.post(
        f"/webhooks/{provider}/acme-{provider}", content=body, headers=headers
    )
    assert response.status_code in (202, 400, 401, 415), response.text
    if response.status_code != 202:
        assert "error" in response.json()
