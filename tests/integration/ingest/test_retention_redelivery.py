"""A delivery whose body the retention policy dropped, sent again through the
real webhook route, on SQLite and PostgreSQL: the inbox answers on the
delivery id and the stored hash, never on the body (models/retention.py).
And a row the policy deletes between the ingress's insert and its read of
the stored row, on PostgreSQL's writer on the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select, update

from ingest.app import create_app
from ingest.runtime import AsyncInbox
from models.db import session_scope
from models.inbox import DeliveryStatus, IncomingDelivery, postgresql_inbox_sql
from models.retention import Policy, prune
from models.tables import Delivery, utcnow
from tests.support.deliveries import fixture, github_headers
from tests.support.ingress import GITHUB_SECRET, Ingress, settings_for
from tests.support.scenarios import a_delivery, a_source
from tests.support.stores import Store

DAYS_45 = timedelta(days=45)


def fresh_ingress(store: Store) -> Iterator[TestClient]:
    """Another ingress process: nothing it stored itself to answer from."""
    with TestClient(create_app(settings_for(store.url), publish=lambda keys, lane: None)) as client:
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
        # Another body under the dropped one's id: still a counted mismatch
        # (nothing is left to compare it with), kept apart; no create, so
        # never processed.
        other = post(client, "d-late", name="issues__closed")

    assert (again.status_code, again.json()) == (202, {"status": "duplicate"})
    assert (resent.status_code, resent.json()["status"]) == (202, "replay")
    assert (other.status_code, other.json()) == (202, {"status": "duplicate"})
    rows = {row.delivery_id: row for row in ingress.deliveries()}
    stored = rows["d-late"]
    assert (stored.status, stored.body, stored.payload_mismatches) == ("done", b"", 1)
    assert stored.body_dropped_at is not None
    assert rows["d-resent"].status == "replay"
    (apart,) = [row for row in rows.values() if row.delivery_id.startswith("d-late#")]
    assert apart.status == "mismatch"
    # Nothing went to the worker again.
    assert store.scalar("SELECT count(*) FROM deliveries WHERE status = 'queued'") == 0


# --- a row deleted between the insert and the read, on PostgreSQL -------------------------


class DeletedBeforeTheRead:
    """A psycopg connection of the ingress on which, just before the inbox's
    read of the stored row, another connection deletes that row: as the
    retention policy may between the insert that found it and the read."""

    def __init__(self, connection, store: Store, pk: int) -> None:
        self._connection, self._store, self._pk = connection, store, pk
        self.deleted = False

    def __getattr__(self, name: str):
        return getattr(self._connection, name)

    def cursor(self):
        return _DeletingCursor(self._connection.cursor(), self)

    def delete_once(self) -> None:
        if not self.deleted:
            with self._store.engine.begin() as other:
                other.execute(delete(Delivery).where(Delivery.id == self._pk))
            self.deleted = True


class _DeletingCursor:
    def __init__(self, cursor, connection: DeletedBeforeTheRead) -> None:
        self._cursor, self._connection = cursor, connection

    async def __aenter__(self):
        await self._cursor.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._cursor.__aexit__(*exc)

    async def execute(self, query, parameters=None):
        if query == postgresql_inbox_sql().stored:
            self._connection.delete_once()
        return await self._cursor.execute(query, parameters)

    async def fetchone(self):
        return await self._cursor.fetchone()


@pytest.mark.postgres
def test_a_row_deleted_before_the_read_is_stored_anew_on_the_event_loop(postgres_store: Store):
    """GitHub never sends again a delivery the ingress failed: this one must be
    stored (the id is free again), never answered 503."""
    store = postgres_store
    source = a_source(store, store.workspace().id)
    pk = a_delivery(store, source, "d-1")
    with store.sessions() as session:
        body = session.scalar(select(Delivery.body).where(Delivery.id == pk))
    incoming = IncomingDelivery(
        source_id=source,
        delivery_id="d-1",
        body=body,
        event="issues.opened",
        action="opened",
        headers={"User-Agent": "GitHub-Hookshot/abc"},
        content_type="application/json",
    )

    connections: list[DeletedBeforeTheRead] = []

    async def record():
        conninfo = store.engine.url.set(drivername="postgresql")
        inbox = AsyncInbox(conninfo.render_as_string(hide_password=False))
        take = inbox._take

        async def take_and_delete_before_the_read():
            connections.append(DeletedBeforeTheRead(await take(), store, pk))
            return connections[-1]

        inbox._take = take_and_delete_before_the_read
        try:
            return await inbox.record(incoming)
        finally:
            await inbox.close()

    recorded = asyncio.run(record())

    assert [connection.deleted for connection in connections] == [True]
    assert (recorded.is_new, recorded.status) == (True, DeliveryStatus.QUEUED)
    assert recorded.pk != pk
    with store.sessions() as session:
        stored = session.scalars(select(Delivery).where(Delivery.delivery_id == "d-1")).all()
    assert [(row.id, row.status) for row in stored] == [(recorded.pk, "queued")]
