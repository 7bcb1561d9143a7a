"""Hostile senders at the webhook routes, on SQLite and PostgreSQL: what an
anonymous or replaying caller can make the ingress hold, store or tell
(docs/reliability.md, "Hostile input")."""

from __future__ import annotations

import asyncio
import hashlib
import json
import tracemalloc

import pytest
from fastapi.testclient import TestClient

from ingest.app import create_app
from ingest.signing import HmacSha256Stream
from ingest.webhooks import UNVERIFIED_IN_MEMORY_BYTES, _receive_body
from tests.conftest import Store
from tests.deliveries import fixture, github_headers, sign
from tests.integration.ingest.conftest import GITHUB_SECRET, Ingress, settings_for

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
    with TestClient(create_app(settings, publish=lambda keys: None)) as client:
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
    with TestClient(create_app(settings, publish=lambda keys: None)) as client:
        body = fixture("github", "issues__opened")
        headers = github_headers("issues__opened", body, GITHUB_SECRET)
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
