"""A bulk replay after a delete, through the real worker on both executors
and both databases: a delivery parked because its task was deleted before
its creation settled stays parked unless an operator names it
(docs/contract.md, "14. Fencing the create"; docs/runbook.md, "Bulk replay")."""

from __future__ import annotations

from models.inbox import DeliveryStatus
from models.operations import DeliveryFilter, bulk_replay
from tests.support.feeds import delivery, make_feed, store_fixture, tasks_of
from tests.support.runs import a_create_deleted_before_it_settled, run
from tests.support.scenarios import settle_as
from tests.support.stores import Store


def replay_in_bulk(store: Store, **named) -> list[int]:
    """A bulk replay of every parked and dead delivery; the keys it sent."""
    sent: list[int] = []
    bulk_replay(
        sessions=store.sessions,
        filter=DeliveryFilter(),
        name="after the outage",
        operator="alice",
        expected=None,
        send=sent.extend,
        **named,
    )
    return sent


def test_a_bulk_replay_after_a_delete_recreates_nothing_until_the_delivery_is_named(
    store: Store,
):
    feed = make_feed(store.sessions)
    parked, deleted = a_create_deleted_before_it_settled(store, feed)
    dead = store_fixture(store.sessions, feed, "github", "issues__opened")
    settle_as(store, dead, DeliveryStatus.DEAD, reason="database errors, 2 retries spent")

    sent = replay_in_bulk(store)
    ran = [run(store, pk) for pk in sent]

    assert sent == [dead]
    assert ran[0].outcome == "created"
    row = delivery(store.sessions, parked)
    assert (row.status, row.created_task_id) == ("needs_operator", deleted)
    assert [t.external_id for t in tasks_of(store.sessions, feed.workspace_id)] == [
        "gh-issue/Codertocat/Hello-World#1"
    ]

    named = replay_in_bulk(store, named=frozenset({parked}))
    again = run(store, parked)

    assert named == [parked]
    assert (again.status, again.outcome) == (DeliveryStatus.DONE, "created")
    assert {t.external_id: t.identifier for t in tasks_of(store.sessions, feed.workspace_id)} == {
        "gh-issue/Codertocat/Hello-World#1": "ACME-2",
        "jira:TES-41": "ACME-3",
    }
