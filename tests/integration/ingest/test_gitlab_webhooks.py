"""GitLab deliveries through HTTP, on SQLite and PostgreSQL: one test per
fixture and per status code, as tests/integration/ingest/test_webhooks.py
has for GitHub and Jira."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from ingest.app import create_app
from models.db import session_scope
from models.providers import PROVIDERS, UNKNOWN_EVENT
from models.reports import inbox_stats
from models.sources import add_secret, add_source, set_source_enabled
from tests.support.deliveries import fixture, fixture_names, gitlab_headers
from tests.support.ingress import GITLAB_TOKEN, Ingress, settings_for, wait_until
from tests.support.stores import Store

GITLAB = PROVIDERS["gitlab"]
CREATES = {
    "issue_hook__open": "gl-issue/gitlabhq/gitlab-test#23",
    "merge_request_hook__open": "gl-mr/gitlabhq/gitlab-test!1",
}


@pytest.mark.parametrize("name", sorted(CREATES))
def test_a_gitlab_create_event_is_stored_queued_and_enqueued(ingress: Ingress, name):
    response = ingress.gitlab(name)

    assert response.status_code == 202
    (row,) = ingress.deliveries()
    assert response.json() == {"delivery": row.id, "status": "queued"}
    assert (row.status, row.body, row.action) == ("queued", fixture("gitlab", name), "open")
    assert row.event in ("Issue Hook.open", "Merge Request Hook.open")
    # The identity and the draft the body names, kept for the worker's claim.
    draft = GITLAB.to_draft(row.event, json.loads(row.body))
    assert row.external_id == CREATES[name] == draft.external_id
    kept = (row.draft_title, row.draft_description, row.draft_url, row.draft_remote_key)
    assert kept == (draft.title, draft.description, draft.url, draft.remote_key)
    wait_until(lambda: ingress.published == [row.id])


#: Fixtures that announce a move: stored for the worker though they create nothing.
MOVES = ["issue_hook__close_moved"]


@pytest.mark.parametrize("name", MOVES)
def test_a_gitlab_move_is_stored_queued_and_enqueued(ingress: Ingress, name):
    response = ingress.gitlab(name)

    assert response.status_code == 202
    (row,) = ingress.deliveries()
    assert response.json() == {"delivery": row.id, "status": "queued"}
    assert (row.event, row.status, row.status_reason) == (
        "Issue Hook.close",
        "queued",
        "announces a move",
    )
    assert (row.external_id, row.draft_title) == (None, None)
    wait_until(lambda: ingress.published == [row.id])


@pytest.mark.parametrize("name", sorted(set(fixture_names("gitlab")) - set(CREATES) - set(MOVES)))
def test_other_gitlab_events_are_stored_as_ignored(ingress: Ingress, name):
    response = ingress.gitlab(name)

    assert (response.status_code, response.json()) == (202, {"status": "ignored"})
    (row,) = ingress.deliveries()
    assert row.status == "ignored"
    assert row.status_reason == f"{row.event} does not create tasks for this source"
    assert (row.external_id, row.draft_title) == (None, None)
    assert ingress.published == []


def test_an_unknown_event_is_stored_ignored_and_counted_apart(ingress: Ingress):
    response = ingress.gitlab("push_hook__two_commits", **{"X-Gitlab-Event": "Made Up Hook"})

    assert (response.status_code, response.json()) == (202, {"status": "ignored"})
    (row,) = ingress.deliveries()
    assert (row.event, row.status) == ("Made Up Hook", "ignored")
    assert row.status_reason.startswith(UNKNOWN_EVENT)
    metrics = ingress.client.get("/metrics").text
    assert (
        'taskhook_deliveries_total{provider="gitlab",result="unknown_event",source="-"} 1.0'
        in metrics
    )
    ingress.gitlab("note_hook__issue_create")  # a known ignored event: not counted as unknown
    with ingress.store.sessions() as session:
        stats = inbox_stats(session=session)
    assert (stats.counts["ignored"], stats.unknown_events) == (2, 1)


def test_stored_headers_are_an_allowlist_without_the_token(ingress: Ingress):
    ingress.gitlab("issue_hook__open", Authorization="Bearer nope")
    (row,) = ingress.deliveries()

    assert set(row.headers) == {
        "content-type",
        "user-agent",
        "x-gitlab-event",
        "x-gitlab-event-uuid",
        "x-gitlab-webhook-uuid",
        "x-gitlab-instance",
        "idempotency-key",
    }
    assert row.headers["user-agent"].startswith("GitLab/")
    assert row.delivery_id == row.headers["idempotency-key"]
    assert row.hook_id is None  # GitLab sends no id of the hook


# --- duplicates and replays ------------------------------------------------------------


def test_the_same_delivery_twice_is_stored_and_enqueued_once(ingress: Ingress):
    headers = {"Idempotency-Key": "908a6d9e-45fd-46c8-97e6-c4f350f219dd"}
    first = ingress.gitlab("issue_hook__open", **headers)
    # A retry: the same key, a new X-Gitlab-Webhook-UUID (gitlab_headers makes one).
    again = ingress.gitlab("issue_hook__open", **headers)

    assert first.json()["status"] == "queued"
    assert (again.status_code, again.json()) == (202, {"status": "duplicate"})
    assert len(ingress.deliveries()) == 1
    wait_until(lambda: len(ingress.published) == 1)


def test_without_an_idempotency_key_the_event_uuid_deduplicates(ingress: Ingress):
    body = fixture("gitlab", "issue_hook__open")
    headers = gitlab_headers("issue_hook__open", GITLAB_TOKEN)
    del headers["Idempotency-Key"]
    for _ in range(2):
        ingress.client.post("/webhooks/gitlab/acme-gitlab", content=body, headers=headers)

    (row,) = ingress.deliveries()
    assert row.delivery_id == headers["X-Gitlab-Event-UUID"]


def test_the_same_body_under_another_key_is_a_replay(ingress: Ingress):
    ingress.gitlab("issue_hook__open")
    response = ingress.gitlab("issue_hook__open")

    _, replay = ingress.deliveries()
    assert (response.status_code, response.json()) == (
        202,
        {"delivery": replay.id, "status": "replay"},
    )
    assert replay.status == "replay"


# --- refusals: nothing stored ----------------------------------------------------------


@pytest.mark.parametrize("token", ["", "not-the-token", GITLAB_TOKEN + "x"])
def test_a_missing_or_wrong_token_is_401(ingress: Ingress, token):
    assert ingress.gitlab("issue_hook__open", token=token).status_code == 401
    assert ingress.deliveries() == []
    assert (
        'taskhook_rejected_signatures_total{provider="gitlab"} 1.0'
        in ingress.client.get("/metrics").text
    )


def test_any_active_token_verifies_during_a_rotation(ingress: Ingress):
    with session_scope(ingress.store.sessions) as session:
        add_secret(session=session, slug="acme-gitlab", new_secret="gl-token-2")
    assert ingress.gitlab("issue_hook__open", token=GITLAB_TOKEN).status_code == 202
    assert ingress.gitlab("issue_hook__open", token="gl-token-2").status_code == 202
    assert ingress.gitlab("issue_hook__open", token="gl-token-3").status_code == 401


@pytest.mark.parametrize("source", ["nope", "acme-github"])
def test_an_unknown_source_is_404(ingress: Ingress, source):
    # acme-github exists, but not as a GitLab source: the same answer.
    assert ingress.gitlab("issue_hook__open", source=source).status_code == 404
    assert ingress.deliveries() == []


def test_a_disabled_source_is_404(ingress: Ingress):
    with session_scope(ingress.store.sessions) as session:
        set_source_enabled(session=session, slug="acme-gitlab", enabled=False)
    assert ingress.gitlab("issue_hook__open").status_code == 404


def test_a_missing_delivery_id_is_400(ingress: Ingress):
    response = ingress.gitlab(
        "issue_hook__open", **{"Idempotency-Key": "", "X-Gitlab-Event-UUID": ""}
    )
    assert response.status_code == 400
    assert "Idempotency-Key or X-Gitlab-Event-UUID" in response.json()["error"]
    assert ingress.deliveries() == []


def test_an_invalid_delivery_id_is_400(ingress: Ingress):
    response = ingress.gitlab("issue_hook__open", **{"Idempotency-Key": "x" * 201})
    assert response.status_code == 400
    assert ingress.deliveries() == []


def test_a_missing_event_is_400(ingress: Ingress):
    assert ingress.gitlab("issue_hook__open", **{"X-Gitlab-Event": ""}).status_code == 400
    assert ingress.deliveries() == []


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_a_body_that_is_not_a_json_object_is_400(ingress: Ingress, body):
    assert ingress.gitlab("issue_hook__open", body=body).status_code == 400
    assert ingress.deliveries() == []


def test_an_unsupported_content_type_is_415(ingress: Ingress):
    response = ingress.gitlab("issue_hook__open", **{"Content-Type": "text/plain"})
    assert response.status_code == 415
    assert ingress.deliveries() == []


def test_an_oversized_body_is_413(store: Store):
    workspace = store.workspace()
    with session_scope(store.sessions) as session:
        add_source(
            session=session,
            provider="gitlab",
            workspace_id=workspace.id,
            slug="g",
            secret="t",
            create_events=["Issue Hook.open"],
        )
    app = create_app(settings_for(store.url, max_body_bytes=1000), publish=lambda keys, lane: None)
    with TestClient(app) as client:
        body = fixture("gitlab", "issue_hook__open")
        headers = gitlab_headers("issue_hook__open", "t")
        assert client.post("/webhooks/gitlab/g", content=body, headers=headers).status_code == 413


def test_an_unreachable_database_is_503_with_retry_after():
    url = "postgresql+psycopg://postgres@127.0.0.1:1/nowhere?connect_timeout=1"
    with TestClient(create_app(settings_for(url), publish=lambda keys, lane: None)) as client:
        body = fixture("gitlab", "issue_hook__open")
        headers = gitlab_headers("issue_hook__open", "t")
        response = client.post("/webhooks/gitlab/g", content=body, headers=headers)
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "5"


def test_the_route_is_in_the_api_document(ingress: Ingress):
    paths = ingress.client.get("/openapi.json").json()["paths"]

    assert "/webhooks/gitlab/{source}" in paths
    assert "X-Gitlab-Token" in paths["/webhooks/gitlab/{source}"]["post"]["description"]
