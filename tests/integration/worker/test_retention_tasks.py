"""The retention policy in the worker: PRUNE on beat's schedule and on the
operator queue, run eagerly against the store; and a delivery whose body was
dropped, should it ever be claimed, ends with a clear reason, never a crash
(on SQLite, and on PostgreSQL with the fast path on and off)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from celery import Celery
from sqlalchemy import update

import worker.retention
from models.broker.messages import OPERATOR_QUEUE, PRUNE
from models.db import session_scope
from models.inbox import DeliveryStatus
from models.retention import Policy, prune
from models.settings import Settings
from models.tables import Delivery, IdempotencyKey, utcnow
from tests.support.feeds import delivery, make_feed, store_fixture, tasks_of
from tests.support.runs import run
from tests.support.stores import Store
from worker import runtime
from worker.celery_app import make_celery_app

SETTINGS = Settings(
    broker_url="memory://",
    result_backend_url="cache+memory://",
    task_time_limit_seconds=10,
    lease_seconds=30,
    retention_pause_seconds=0,
)
DAYS = timedelta(days=1)


@pytest.fixture
def eager(store: Store) -> Iterator[Celery]:
    app = make_celery_app(SETTINGS)
    app.conf.task_always_eager = True
    runtime.use(sessions=store.sessions, settings=store.worker_settings(SETTINGS))
    try:
        yield app
    finally:
        runtime.reset()


def finished(store: Store, pk: int, status: str, age: timedelta) -> None:
    now = utcnow()
    with session_scope(store.sessions) as session:
        session.execute(
            update(Delivery)
            .where(Delivery.id == pk)
            .values(status=status, received_at=now - age, updated_at=now - age)
        )


def test_prune_is_on_beat_s_schedule_and_the_operator_queue():
    conf = make_celery_app(Settings(broker_url="memory://", retention_interval_seconds=600)).conf
    entries = {entry["task"]: entry for entry in conf.beat_schedule.values()}
    assert entries[PRUNE]["schedule"] == 600
    assert entries[PRUNE]["options"] == {"expires": 600}
    assert conf.task_routes[PRUNE] == {"queue": OPERATOR_QUEUE}
    off = make_celery_app(Settings(broker_url="memory://", retention_interval_seconds=0)).conf
    assert PRUNE not in {entry["task"] for entry in off.beat_schedule.values()}


def test_the_prune_task_is_registered_from_its_module():
    app = make_celery_app(SETTINGS)
    app.loader.import_default_modules()
    assert app.tasks[PRUNE].run.__module__ == "worker.retention"


def test_the_prune_task_applies_the_policy(eager: Celery, store: Store):
    feed = make_feed(store.sessions)
    old = store_fixture(store.sessions, feed, "github", "issues__opened")
    middle = store_fixture(store.sessions, feed, "github", "pull_request__opened")
    parked = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    finished(store, old, "done", 100 * DAYS)
    finished(store, middle, "ignored", 40 * DAYS)
    finished(store, parked, "needs_operator", 100 * DAYS)

    done = eager.tasks[PRUNE].apply().get()

    assert done["deleted"] == {"done": 1}
    assert done["dropped"] == {"ignored": 1}
    assert done["batches"] == 2 and done["finished"] is True and done["body_bytes"] > 0
    assert delivery(store.sessions, old) is None
    assert delivery(store.sessions, middle).body == b""
    assert delivery(store.sessions, parked).body_dropped_at is None


@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")
def test_a_prune_out_of_time_sends_itself_again(
    eager: Celery, store: Store, monkeypatch: pytest.MonkeyPatch
):
    feed = make_feed(store.sessions)
    finished(
        store, store_fixture(store.sessions, feed, "github", "issues__opened"), "done", 99 * DAYS
    )
    monkeypatch.setattr(worker.retention, "BUDGET_SHARE", 0)

    done = eager.tasks[PRUNE].apply().get()

    assert (done["batches"], done["finished"]) == (0, False)
    with eager.connection_for_read() as connection:
        message = connection.SimpleQueue(OPERATOR_QUEUE).get(timeout=5)
        message.ack()
    assert message.headers["task"] == PRUNE


def test_a_dropped_body_put_back_in_the_queue_ends_dead_saying_why(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")
    finished(store, pk, "done", 45 * DAYS)
    with session_scope(store.sessions) as session:
        assert prune(session=session, policy=Policy(30, 90)).dropped == {"done": 1}
        # By hand: nothing in taskhook queues a done delivery again.
        session.execute(update(Delivery).where(Delivery.id == pk).values(status="queued"))

    processed = run(store, pk)

    assert processed.status is DeliveryStatus.DEAD
    assert processed.reason == (
        "nothing to process: body dropped after 45 days by the retention policy"
    )
    assert processed.path == "general"  # the fast path has no draft to create from
    assert tasks_of(store.sessions, feed.workspace_id) == []
    assert delivery(store.sessions, pk).status == "dead"


def test_prune_deletes_idempotency_keys_past_their_window(eager: Celery, store: Store):
    now = utcnow()
    with session_scope(store.sessions) as session:
        for key, expires_at in (("old", now - DAYS), ("live", now + DAYS)):
            session.add(
                IdempotencyKey(
                    actor="token:1",
                    key=key,
                    fingerprint="0" * 64,
                    target="task 1",
                    status=204,
                    expires_at=expires_at,
                )
            )
    done = eager.tasks[PRUNE].apply().get()
    assert done["idempotency_keys"] == 1
    assert store.scalar("SELECT key FROM idempotency_keys") == "live"
