"""Hostile senders at the webhook routes, on SQLite and PostgreSQL: what an
anonymous or replaying caller can make the ingress hold, store or tell
(docs/reliability.md, "Hostile input")."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import tracemalloc

import pytest
from fastapi.testclient import TestClient

from ingest.app import create_app
from ingest.webhooks import UNVERIFIED_IN_MEMORY_BYTES, _receive_body
from models.providers.signing import HmacSha256Stream
from tests.support.deliveries import fixture, github_headers, sign
from tests.support.ingress import GITHUB_SECRET, Ingress, settings_for, wait_until
from tests.support.stores import Store

DELIVERY = "X-Atlassian-Webhook-Identifier"

# --- delivery ids ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "delivery_id",
    [
        pytest.param("0123456789abcdef" * 200, id="3,200 characters (over the btree limit)"),
        pytest.param("d" * 201, id="201 characters"),
        pytest.param("dé-1".encode(), id="non-ASCII (read as latin-1, stored garbled)"),
        pytest.param("two words", id="a space"),
    ],
)
def test_a_delivery_id_no_provider_sends_is_a_400_and_stores_nothing(
    ingress: Ingress, delivery_id: str | bytes
):
    body = fixture("github", "issues__opened")
    headers = github_headers("issues__opened", body, GITHUB_SECRET)
    headers["X-GitHub-Delivery"] = delivery_id

    response = ingress.client.post("/webhooks/github/acme-github", content=body, headers=headers)

    assert response.status_code == 400
    assert response.json()["error"] == (
        "invalid X-GitHub-Delivery header: at most 200 printable ASCII characters"
    )
    assert ingress.deliveries() == []
    metrics = ingress.client.get("/metrics").text
    assert 'result="bad_request"' in metrics
    assert 'result="store_unavailable"' not in metrics


def test_the_longest_delivery_id_taken_is_stored_as_sent(ingress: Ingress):
    response = ingress.github("issues__opened", **{"X-GitHub-Delivery": "d" * 200})

    assert response.status_code == 202
    assert [d.delivery_id for d in ingress.deliveries()] == ["d" * 200]


# --- /metrics --------------------------------------------------------------------------------


@pytest.fixture
def guarded(store: Store):
    """An ingress whose /metrics needs a token and labels deliveries by source."""
    settings = settings_for(store.url, metrics_token="m3trics", metrics_source_labels=True)
    with TestClient(create_app(settings, publish=lambda keys, lane: None)) as client:
        yield client


def test_metrics_with_a_token_answer_only_its_bearer(guarded: TestClient):
    anonymous = guarded.get("/metrics")
    wrong = guarded.get("/metrics", headers={"Authorization": "Bearer m3tric"})
    right = guarded.get("/metrics", headers={"Authorization": "Bearer m3trics"})

    assert (anonymous.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert anonymous.headers["www-authenticate"] == "Bearer"
    assert "taskhook_deliveries" not in anonymous.text
    assert "taskhook_ingress_seconds" in right.text


def test_source_names_label_the_metrics_only_when_asked(ingress: Ingress, store: Store):
    ingress.github("issues__opened")
    assert "acme-github" not in ingress.client.get("/metrics").text

    settings = settings_for(store.url, metrics_source_labels=True)
    with TestClient(create_app(settings, publish=lambda keys, lane: None)) as client:
        # Another body: the same one under a new delivery id would be a replay.
        body = fixture("github", "issues__opened_with_organization")
        headers = github_headers("issues__opened_with_organization", body, GITHUB_SECRET)
        client.post("/webhooks/github/acme-github", content=body, headers=headers)
        client.post("/webhooks/github/no-such-source", content=body, headers=headers)
        metrics = client.get("/metrics").text
    assert 'result="queued",source="acme-github"} 1.0' in metrics
    assert 'result="unknown_source",source="-"} 1.0' in metrics  # random URLs grow nothing


# --- unverified bodies -----------------------------------------------------------------------


def test_an_unsigned_24_mib_body_is_never_held_in_memory():
    """The body streams through the signature and past 1 MiB to disk: the
    memory it takes is bounded by the spool's threshold, not by its size."""
    chunk = b"x" * 65536
    left = 24 * 1024 * 1024 // len(chunk)

    async def receive():
        nonlocal left
        left -= 1
        return {"type": "http.request", "body": chunk, "more_body": left > 0}

    async def read_then_refuse() -> bool:
        signature = HmacSha256Stream(["secret"])
        with await _receive_body(receive, None, 25 * 1024 * 1024, signature):
            return signature.matches("sha256=" + "0" * 64)

    tracemalloc.start()
    try:
        verified = asyncio.run(read_then_refuse())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert verified is False
    assert peak < UNVERIFIED_IN_MEMORY_BYTES + 1024 * 1024, f"peak {peak:,} bytes"


def test_a_signed_body_that_streams_in_many_chunks_is_verified_and_stored(ingress: Ingress):
    payload = json.loads(fixture("github", "issues__opened"))
    payload["padding"] = "p" * (3 * UNVERIFIED_IN_MEMORY_BYTES)  # past the spool threshold
    body = json.dumps(payload).encode()
    headers = github_headers("issues__opened", body, GITHUB_SECRET)

    def chunks():
        for start in range(0, len(body), 65536):
            yield body[start : start + 65536]

    response = ingress.client.post(
        "/webhooks/github/acme-github", content=chunks(), headers=headers
    )
    bad = ingress.client.post(
        "/webhooks/github/acme-github",
        content=chunks(),
        headers=headers | {"X-Hub-Signature-256": sign(body, "not the secret")},
    )

    assert response.status_code == 202, response.text
    assert bad.status_code == 401
    [stored] = ingress.deliveries()
    assert stored.body_sha256 == hashlib.sha256(body).hexdigest()


# --- captured bodies -------------------------------------------------------------------------


def test_a_signed_body_resent_under_a_new_delivery_id_is_a_replay_never_queued(ingress: Ingress):
    """GitHub keeps a delivery's GUID when it sends it again: the same bytes
    under another GUID are someone's resend (to undo a delete, say)."""
    body = fixture("github", "issues__opened")
    original = ingress.github("issues__opened", body=body, **{"X-GitHub-Delivery": "guid-1"})
    resent = ingress.github("issues__opened", body=body, **{"X-GitHub-Delivery": "attacker-guid-1"})

    assert original.json()["status"] == "queued"
    assert resent.status_code == 202
    assert resent.json() == {"delivery": resent.json()["delivery"], "status": "replay"}
    first, replay = ingress.deliveries()
    assert (replay.delivery_id, replay.status) == ("attacker-guid-1", "replay")
    assert replay.status_reason == (
        f"the same body as delivery {first.id} under another delivery id: a replay, never processed"
    )
    wait_until(lambda: ingress.published == [first.id])
    assert 'result="replay"' in ingress.client.get("/metrics").text


def test_a_body_sent_first_under_a_genuine_deliverys_id_cannot_make_it_disappear(
    ingress: Ingress,
):
    """Jira: one signed comment body under 7001, 7002 and 7003, then the
    genuine issue_created under 7002 -- which must still become work."""
    comment = fixture("jira", "comment_created__cloud")
    decoys = [
        ingress.jira("comment_created__cloud", body=comment, **{DELIVERY: str(n)})
        for n in (7001, 7002, 7003)
    ]
    genuine = ingress.jira("jira_issue_created__cloud", **{DELIVERY: "7002"})

    assert [d.json()["status"] for d in decoys] == ["ignored", "replay", "replay"]
    assert genuine.status_code == 202
    assert genuine.json()["status"] == "queued"
    rows = {row.id: row for row in ingress.deliveries()}
    kept = rows[genuine.json()["delivery"]]
    assert (kept.status, kept.event) == ("queued", "jira:issue_created")
    assert kept.delivery_id.startswith("7002#")
    wait_until(lambda: ingress.published == [kept.id])


@pytest.mark.parametrize(("hours_ago", "status"), [(25, 400), (23, 202)])
def test_a_jira_body_older_than_a_day_is_refused(ingress: Ingress, hours_ago: int, status: int):
    payload = json.loads(fixture("jira", "jira_issue_created__cloud"))
    payload["timestamp"] = int((time.time() - hours_ago * 3600) * 1000)

    response = ingress.jira("jira_issue_created__cloud", body=json.dumps(payload).encode())

    assert response.status_code == status
    if status == 400:
        assert response.json()["error"] == (
            "the delivery was sent 25 h ago; at most 24 h is taken "
            "(TASKHOOK_MAX_DELIVERY_AGE_SECONDS)"
        )
        assert ingress.deliveries() == []
        assert 'result="too_old"' in ingress.client.get("/metrics").text
