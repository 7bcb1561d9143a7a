"""A delivery waiting for its retry holds no worker, on Redis and on RabbitMQ.

A delivery that finds its identity held by a create that never settled waits
and tries again later: its message is sent again with a countdown. On
RabbitMQ that countdown is Celery's native delayed delivery -- the message
waits in the broker's ``celery_delayed_*`` queues, which needs the queues'
exchanges to be topic exchanges (``models.broker.connection``); with direct
ones Celery hands the message to the worker at once, and the worker holds it
unacknowledged until it is due. On Redis the worker holds it (Redis has no
delayed delivery), without taking a place in its pool.

Either way a worker of one thread goes on with the next delivery meanwhile:
the proof is the order of events -- the other delivery is done while the
first still waits -- not a timing.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from celery import Celery
from kombu import Connection
from kombu.transport.native_delayed_delivery import MAX_LEVEL, level_name
from sqlalchemy import select

from models.broker.messages import PROCESS_DELIVERY
from models.db import make_engine
from models.tables import Delivery
from tests.support.brokers import rabbitmq_vhost
from tests.support.deliveries import fixture
from tests.support.feeds import make_feed, store_delivery
from tests.support.processes import (
    ROOT,
    StartWorker,
    WorkerProcess,
    finished,
    wait_until,
    worker_environment,
)
from tests.support.scenarios import create_by
from tests.support.stores import Store

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.rabbitmq]
#: Runs once on Redis and once on RabbitMQ (tests/e2e/conftest.py).
ON_EVERY_BROKER = True

JIRA_ISSUE = "jira:TES-41"  # the fixture's issue


def waiting_in_the_broker(broker_url: str) -> int:
    """Messages in RabbitMQ's delayed-delivery queues now (a passive declare
    answers with the count at once; rabbitmqctl's figures lag)."""
    total = 0
    with Connection(broker_url) as connection:
        channel = connection.default_channel
        for level in range(MAX_LEVEL + 1):
            total += channel.queue_declare(level_name(level), passive=True).message_count
    return total


def state_of(sessions, pk: int) -> tuple[str, str | None, int]:
    with sessions() as session:
        row = session.execute(
            select(Delivery.status, Delivery.status_reason, Delivery.retries).where(
                Delivery.id == pk
            )
        ).one()
    return row.status, row.status_reason, row.retries


def test_a_delivery_waiting_for_a_retry_does_not_hold_the_worker(
    start_worker: StartWorker, client: Celery, sessions, postgres_url, broker, broker_url
):
    feed = make_feed(sessions, slug="waits", prefix="WAITS")
    body = fixture("jira", "jira_issue_created__cloud")

    def jira_delivery(name: str, body: bytes) -> int:
        return store_delivery(
            sessions,
            feed.jira_source_id,
            body=body,
            event="jira:issue_created",
            content_type="application/json; charset=UTF-8",
            delivery_id=name,
        )

    # The issue's first create inserted its task and died before settling it.
    creator = jira_delivery("creator", body)
    engine = make_engine(postgres_url)
    try:
        store = Store("postgresql", postgres_url, engine, sessions)
        create_by(store, feed.workspace_id, creator, JIRA_ISSUE, crash_before_settle=True)
    finally:
        engine.dispose()
    waiter = jira_delivery("waiter", body + b" ")
    # Another issue (its key and its id), which nothing holds.
    other = jira_delivery("other", body.replace(b"TES-41", b"TES-42").replace(b"10040", b"10042"))

    # One thread, and a first wait of 15-30 s: long enough that the other
    # delivery, sent after it, is done long before the wait ends.
    worker = start_worker(
        "waits",
        TASKHOOK_WORKER_CONCURRENCY="1",
        TASKHOOK_RETRY_BASE_SECONDS="30",
        TASKHOOK_RETRY_MAX_SECONDS="60",
    )
    client.send_task(PROCESS_DELIVERY, args=[waiter])
    wait_until(
        lambda: (state_of(sessions, waiter)[1] or "").startswith("waiting:"),
        timeout=60,
        what="the delivery to find the create unsettled and wait",
        logs=[worker],
    )
    waiting = state_of(sessions, waiter)
    if broker == "rabbitmq":
        wait_until(
            lambda: waiting_in_the_broker(broker_url) == 1,
            timeout=10,
            what="the retry's message to wait in RabbitMQ's delayed-delivery queues",
            logs=[worker],
        )

    client.send_task(PROCESS_DELIVERY, args=[other])
    wait_until(finished(sessions, other), timeout=60, what="the other delivery", logs=[worker])

    # ... while the first still waits for its retry, as it was.
    assert state_of(sessions, waiter) == waiting
    assert waiting[0] == "processing"
    with sessions() as session:
        done = session.execute(select(Delivery.outcome).where(Delivery.id == other)).scalar_one()
    assert done == "created"
    assert "direct exchange" not in worker.text().lower(), worker.tail()


def procfile_command(name: str) -> list[str]:
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return shlex.split(line.partition(":")[2])
    raise AssertionError(f"no {name} line in the Procfile")


def test_a_worker_of_one_queue_sets_delayed_delivery_up_on_a_new_virtual_host(
    postgres_url: str, tmp_path: Path
):
    """The Procfile's worker takes only the deliveries queue. Celery's delayed
    delivery binds every queue the app knows, so on a virtual host no other
    process used yet the worker declares the operator's queue too."""
    with rabbitmq_vhost() as fresh:
        command = procfile_command("worker")
        assert command[:2] == ["celery", "-A"] and "--queues" in command
        args = [sys.executable, "-m", *command]
        args = [arg.replace("%h", "retry-waits") for arg in args]
        worker = WorkerProcess(
            "one-queue", tmp_path / "worker.log", args, worker_environment(postgres_url, fresh)
        )
        try:
            worker.wait_ready()
        finally:
            worker.stop()
    text = worker.text()
    assert "Failed to" not in text and "direct exchange" not in text.lower(), worker.tail()
