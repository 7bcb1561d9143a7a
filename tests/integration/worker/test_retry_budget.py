"""A delivery's retry budget lives on its inbox row, so a crash does not refill it.

The message's retry count starts again at 0 when the sweeper sends a delivery
whose worker died, so a delivery that counted only its message could retry
without end, one budget per crash. ``deliveries.retries`` keeps the count
instead; each test runs on SQLite and on PostgreSQL with the fast path on and
off.
"""

from __future__ import annotations

import json

from sqlalchemy import update

from models.db import session_scope
from models.inbox import DeliveryStatus
from models.tables import Delivery, Task
from tests.support.deliveries import fixture
from tests.support.feeds import (
    delivery,
    make_feed,
    store_delivery,
    store_fixture,
    tasks_of,
)
from tests.support.runs import (
    SETTINGS,
    crashed_create,
    database_goes_away,
    expire_lease,
    replay_delivery,
    run,
)
from tests.support.stores import Store
from worker.processing import Seams
from worker.sweeper import sweep


def spend(store: Store, pk: int, retries: int) -> None:
    """As if earlier messages of the delivery had retried ``retries`` times."""
    with session_scope(store.sessions) as session:
        session.execute(update(Delivery).where(Delivery.id == pk).values(retries=retries))


def the_worker_dies_before_sending_its_retry(store: Store, pk: int) -> list[int]:
    """The deferred retry's message is lost with its worker: once the lease
    runs out, the sweeper sends a new message, whose retry count is 0."""
    expire_lease(store, pk)
    sent: list[int] = []
    with session_scope(store.sessions) as session:
        sweep(session=session, queued_grace_seconds=60, send=sent.append)
    return sent


def test_each_retry_is_counted_on_the_row(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")

    retried = run(store, pk, seams=Seams(after_lookup=database_goes_away), retries=0)

    assert retried.status is DeliveryStatus.PROCESSING and retried.retry_in is not None
    assert "retry 1 of 2" in retried.reason
    assert delivery(store.sessions, pk).retries == 1


def test_messages_resent_after_crashes_spend_one_budget_not_one_each(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")
    failing = Seams(after_lookup=database_goes_away)

    first = run(store, pk, seams=failing, retries=0)
    assert the_worker_dies_before_sending_its_retry(store, pk) == [pk]
    second = run(store, pk, seams=failing, retries=0)  # the sweeper's message
    assert the_worker_dies_before_sending_its_retry(store, pk) == [pk]
    third = run(store, pk, seams=failing, retries=0)

    assert "retry 1 of 2" in first.reason and "retry 2 of 2" in second.reason
    assert (third.status, third.retry_in) == (DeliveryStatus.DEAD, None)
    row = delivery(store.sessions, pk)
    assert (row.status, row.status_reason) == ("dead", "database errors, 2 retries spent")
    assert row.attempts == 3


def test_a_spent_budget_on_the_row_ends_a_fresh_message_on_either_executor(store: Store):
    # A database error right after the insert: reached on the fast path (its
    # claim read the row's budget) and on the general path alike.
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    spend(store, pk, SETTINGS.database_max_retries)

    def database_goes_away_after_the_insert(_task: Task) -> None:
        database_goes_away()

    dead = run(store, pk, seams=Seams(after_insert=database_goes_away_after_the_insert), retries=0)

    assert (dead.status, dead.retry_in) == (DeliveryStatus.DEAD, None)
    row = delivery(store.sessions, pk)
    assert (row.status, row.status_reason) == ("dead", "database errors, 2 retries spent")
    # The task its insert made is this delivery's own: a replay finishes it.
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (task.created_by_delivery, task.external_id_settled_at) == (pk, None)


def test_waiting_for_another_create_spends_the_rows_budget_too(store: Store):
    feed = make_feed(store.sessions)
    crashed_create(store, feed)
    # Another event about the same issue (Jira stamps each one with its time).
    payload = json.loads(fixture("jira", "jira_issue_created__cloud"))
    payload["timestamp"] += 1
    body = json.dumps(payload).encode()
    pk = store_delivery(store.sessions, feed.jira_source_id, body=body, event="jira:issue_created")
    spend(store, pk, SETTINGS.unsettled_max_retries)

    parked = run(store, pk, retries=0)

    assert (parked.status, parked.retry_in) == (DeliveryStatus.NEEDS_OPERATOR, None)
    assert "still so after 3 retries" in delivery(store.sessions, pk).status_reason


def test_a_replay_starts_a_fresh_budget(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")
    spend(store, pk, SETTINGS.database_max_retries)
    failing = Seams(after_lookup=database_goes_away)
    assert run(store, pk, seams=failing).status is DeliveryStatus.DEAD

    replay_delivery(store, pk)  # the operator fixed the database
    assert delivery(store.sessions, pk).retries == 0
    retried = run(store, pk, seams=failing)

    assert retried.status is DeliveryStatus.PROCESSING and "retry 1 of 2" in retried.reason
