"""A delivery whose worker dies on it every time is parked, on any broker.

With late acknowledgement a message that kills its worker comes back -- from
the broker at once, or from the sweeper once its lease runs out -- and would
take every worker down in turn, for ever. The row counts its attempts that
ended without an answer (``attempts - answered_attempts``); once
TASKHOOK_MAX_LOST_ATTEMPTS were lost, the next worker parks it as
needs_operator instead of running it. A wait for a retry is an answer, and a
replay forgives what was lost. On SQLite and on PostgreSQL with the fast path
on and off.
"""

from __future__ import annotations

from models.db import session_scope
from models.inbox import DeliveryStatus, claim
from tests.support.feeds import delivery, make_feed, store_fixture, tasks_of
from tests.support.runs import (
    SETTINGS,
    database_goes_away,
    expire_lease,
    replay_delivery,
    run,
)
from tests.support.stores import Store
from worker.processing import Seams

LIMIT = 3
SETTINGS_WITH_LIMIT = SETTINGS.model_copy(
    update={"max_lost_attempts": LIMIT, "database_max_retries": 10}
)


def the_worker_dies(store: Store, pk: int) -> None:
    """A worker claims the delivery and is killed before it answers; later its
    lease runs out (a broker redelivery, or the sweeper, then sends it again)."""
    with session_scope(store.sessions) as session:
        assert claim(session=session, delivery_pk=pk, lease_seconds=60) is not None
    expire_lease(store, pk)


def test_a_delivery_lost_that_many_times_is_parked_not_run_again(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")
    for _ in range(LIMIT):
        the_worker_dies(store, pk)

    parked = run(store, pk, settings=SETTINGS_WITH_LIMIT)

    assert parked.status is DeliveryStatus.NEEDS_OPERATOR
    row = delivery(store.sessions, pk)
    assert row.status == "needs_operator" and row.lease_expires_at is None
    assert f"{LIMIT} attempts ended without an answer" in row.status_reason
    assert row.attempts == LIMIT  # the parking run claimed nothing
    assert tasks_of(store.sessions, feed.workspace_id) == []
    # Another message for it (the sweeper's, the broker's) changes nothing.
    assert run(store, pk, settings=SETTINGS_WITH_LIMIT).status is None


def test_one_lost_attempt_fewer_runs_as_usual(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")
    for _ in range(LIMIT - 1):
        the_worker_dies(store, pk)

    done = run(store, pk, settings=SETTINGS_WITH_LIMIT)

    assert done.status is DeliveryStatus.DONE
    assert len(tasks_of(store.sessions, feed.workspace_id)) == 1


def test_a_wait_for_a_retry_is_an_answer_not_a_lost_attempt(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")
    for _ in range(LIMIT + 1):  # more waits than the limit on lost attempts
        waited = run(
            store,
            pk,
            settings=SETTINGS_WITH_LIMIT,
            seams=Seams(after_lookup=database_goes_away),
        )
        assert waited.status is DeliveryStatus.PROCESSING and waited.retry_in is not None
        expire_lease(store, pk)

    assert run(store, pk, settings=SETTINGS_WITH_LIMIT).status is DeliveryStatus.DONE


def test_a_replay_forgives_the_lost_attempts(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")
    for _ in range(LIMIT):
        the_worker_dies(store, pk)
    assert run(store, pk, settings=SETTINGS_WITH_LIMIT).status is DeliveryStatus.NEEDS_OPERATOR

    replay_delivery(store, pk)  # the operator fixed the cause

    assert run(store, pk, settings=SETTINGS_WITH_LIMIT).status is DeliveryStatus.DONE
    assert len(tasks_of(store.sessions, feed.workspace_id)) == 1
