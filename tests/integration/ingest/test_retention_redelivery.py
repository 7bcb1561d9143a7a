"""A delivery whose body the retention policy dropped, sent again through the
real webhook route, on SQLite and PostgreSQL: the inbox answers on the
delivery id and the stored hash, never on the body (models/retention.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import update

from ingest.app import create_app
from models.db import session_scope
from models.retention import Policy, prune
from models.tables import Delivery, utcnow
from tests.conftest import Store
from tests.deliveries import fixture, github_headers
from tests.integration.ingest.conftest import GITHUB_SECRET, Ingress, settings_for

DAYS_45 = timedelta(days=45)


def fresh_ingress(store: Store) -> Iterator[TestClient]:
    """Another ingress process: nothing it stored itself to answer from."""
    with TestClient(create_app(settings_for(store.url), publish=lambda keys: None)) as client:
        yield client


def post(client: TestClient, delivery: str, name: str = "issues__opened"):
    body = fixture("github", name)
    headers = github_headers(name, body, GITHUB_SECRET, delivery=delivery)
    return client.post("/webhooks/github/acme-github", content=body, headers=headers)


def finished_45_days_ago_and_pruned(store: Store, pk: int) -> None:
    now = utcnow()
    with session_scope(store.sessions) as session:
        session.execute(
            update(Delivery)
            .where(Delivery.id == pk)
            .values(status="done", received_at=now - DAYS_45, updated_at=now - DAYS_45)
        )
        pruned = prune(session=session, policy=Policy(body_days=30, row_days=90), now=now)
    assert pruned.dropped == {"done": 1}


def test_a_late_redelivery_of_a_dropped_body_is_answered_as_a_duplicate(ingress: Ingress):
    store = ingress.store
    first = post(ingress.client, "d-late")
    assert first.json()["status"] == "queued"
    pk = first.json()["delivery"]
    finished_45_days_ago_and_pruned(store, pk)

    for client in fresh_ingress(store):
        again = post(client, "d-late")
        # The same body under another id: still a replay (its hash stayed).
        resent = post(client, "d-resent")
        # Another body under the dropped one's id: still a counted mismatch.
        other = post(client, "d-late", name="issues__opened_with_organization")

    assert (again.status_code, again.json()) == (202, {"status": "duplicate"})
    assert (resent.status_code, resent.json()["status"]) == (202, "replay")
    assert (other.status_code, other.json()) == (202, {"status": "duplicate"})
    rows = {row.delivery_id: row for row in ingress.deliveries()}
    stored = rows["d-late"]
    assert (stored.status, stored.body, stored.payload_mismatches) == ("done", b"", 1)
    assert stored.body_dropped_at is not None
    assert rows["d-resent"].status == "replay"
    (apart,) = [row for row in rows.values() if row.delivery_id.startswith("d-late#")]
    assert apart.status == "mismatch"  # the stored row was a create: never processed
    # Nothing went to the worker again.
    assert store.scalar("SELECT count(*) FROM deliveries WHERE status = 'queued'") == 0
