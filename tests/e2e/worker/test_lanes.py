"""A live delivery overtakes the background lane's backlog, on every broker.

The deliveries worker consumes two queues, the live lane and the background
lane (``models.broker.lanes``), taking from each in turn, on Redis, RabbitMQ
and the embedded broker. So a delivery a sender waits for goes to work after
one message of a flood at most, not after the whole flood -- the fair share
of docs/architecture.md. The proof is an order of events, not a timing: with
one worker thread, and 300 background messages sent before the live one, the
live delivery is done while almost all of the backlog still waits. First in,
first out, it would be done last."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import func, select

from models.broker.lanes import Lane
from models.broker.messages import PROCESS_DELIVERY
from models.db import make_engine, make_session_factory
from models.inbox import FINISHED
from models.settings import Settings
from models.tables import Delivery
from tests.support.deliveries import fixture
from tests.support.feeds import make_feed, store_delivery
from tests.support.processes import StartWorker, finished, wait_until
from worker.celery_app import make_celery_app

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.rabbitmq]
#: Runs once on Redis and once on RabbitMQ (tests/e2e/conftest.py).
ON_EVERY_BROKER = True

BACKLOG = 300
#: Background messages a live one may wait behind: a few, from the moment
#: the worker starts (each lane's first message, its prefetch), never the flood.
AT_MOST_AHEAD = 8


def jira_issue(number: int) -> bytes:
    """The fixture's issue created, renumbered: key TES-<number>, its own id."""
    body = fixture("jira", "jira_issue_created__cloud")
    return body.replace(b"TES-41", f"TES-{number}".encode()).replace(
        b"10040", f"{20000 + number}".encode()
    )


def store_issues(sessions, source_id: int, numbers: range) -> list[int]:
    return [
        store_delivery(
            sessions,
            source_id,
            body=jira_issue(number),
            event="jira:issue_created",
            content_type="application/json; charset=UTF-8",
            delivery_id=f"lanes-{number}",
        )
        for number in numbers
    ]


def finished_among(sessions, keys: list[int]) -> int:
    with sessions() as session:
        return session.scalar(
            select(func.count())
            .select_from(Delivery)
            .where(Delivery.id.in_(keys), Delivery.status.in_([s.value for s in FINISHED]))
        )


def test_a_live_delivery_overtakes_the_background_backlog(
    start_worker: StartWorker, client: Celery, sessions
):
    live_overtakes_the_backlog(sessions, client, start_worker)


def test_a_live_delivery_overtakes_the_background_backlog_on_the_embedded_broker(
    start_embedded_worker: StartWorker, sqlite_template: Path, tmp_path: Path
):
    database = tmp_path / "taskhook.db"  # where start_embedded_worker points the worker
    shutil.copyfile(sqlite_template, database)
    database_url = f"sqlite:///{database}"
    engine = make_engine(database_url)
    client = make_celery_app(Settings(database_url=database_url, broker_folder=tmp_path / "broker"))
    try:
        live_overtakes_the_backlog(make_session_factory(engine), client, start_embedded_worker)
    finally:
        client.close()
        engine.dispose()


def live_overtakes_the_backlog(sessions, client: Celery, start_worker: StartWorker) -> None:
    feed = make_feed(sessions, slug="lanes", prefix="LANES")
    flood = store_issues(sessions, feed.jira_source_id, range(1000, 1000 + BACKLOG))
    (live,) = store_issues(sessions, feed.jira_source_id, range(5000, 5001))
    for key in flood:
        client.send_task(PROCESS_DELIVERY, args=[key], queue=Lane.BACKGROUND)
    client.send_task(PROCESS_DELIVERY, args=[live], queue=Lane.LIVE)

    worker = start_worker("lanes", TASKHOOK_WORKER_CONCURRENCY="1")
    wait_until(finished(sessions, live), timeout=60, what="the live delivery", logs=[worker])
    ahead = finished_among(sessions, flood)
    assert ahead <= AT_MOST_AHEAD, f"{ahead} background deliveries went before the live one"

    # The background lane is not starved: all of it is done after.
    wait_until(
        lambda: finished_among(sessions, flood) == BACKLOG,
        timeout=120,
        what="the background backlog",
        logs=[worker],
    )
    with sessions() as session:
        outcomes = session.scalars(
            select(Delivery.outcome).where(Delivery.id.in_([*flood, live])).distinct()
        ).all()
    assert outcomes == ["created"]
