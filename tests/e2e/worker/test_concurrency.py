"""Twenty deliveries for one Jira issue, raced by two worker processes.

Both workers pause half a second after their task insert commits (a fail
point), so while one holds the identity unsettled the other surely finds it
so, and has to wait by retrying -- the path a slow create takes in production.
"""

from __future__ import annotations

import pytest
from celery import Celery
from sqlalchemy import func, select

from models.broker.messages import PROCESS_DELIVERY
from models.tables import Delivery
from tests.support.deliveries import fixture
from tests.support.feeds import make_feed, store_delivery, tasks_of
from tests.support.processes import StartWorker, finished, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]
#: Runs once on Redis and once on RabbitMQ (tests/e2e/conftest.py).
ON_EVERY_BROKER = True


def test_twenty_deliveries_for_one_jira_issue_on_two_workers_are_one_task_and_19_found(
    start_worker: StartWorker, client: Celery, sessions
):
    slow_insert = {"TASKHOOK_FAILPOINT": "after_insert:pause=0.5"}
    workers = [start_worker("racer-a", **slow_insert), start_worker("racer-b", **slow_insert)]
    feed = make_feed(sessions, slug="twenty", prefix="TWENTY")
    body = fixture("jira", "jira_issue_created__cloud")
    pks = [
        store_delivery(
            sessions,
            feed.jira_source_id,
            # Twenty deliveries, twenty bodies: the same one under twenty ids
            # would be replays (trailing white space stands in for Jira's
            # differing timestamps).
            body=body + b" " * number,
            event="jira:issue_created",
            content_type="application/json; charset=UTF-8",
            delivery_id=f"twenty-{number}",
        )
        for number in range(20)
    ]

    for pk in pks:
        client.send_task(PROCESS_DELIVERY, args=[pk])
    wait_until(finished(sessions, *pks), timeout=60, what="20 deliveries", logs=workers)

    (task,) = tasks_of(sessions, feed.workspace_id)
    assert task.external_id == "jira:TES-41" and task.external_id_settled_at is not None
    with sessions() as session:
        outcomes = dict(
            session.execute(
                select(Delivery.outcome, func.count())
                .where(Delivery.id.in_(pks), Delivery.status == "done", Delivery.task_id == task.id)
                .group_by(Delivery.outcome)
            ).all()
        )
    assert outcomes == {"created": 1, "found_settled": 19}
    logs = [worker.text() for worker in workers]
    assert all("succeeded" in log for log in logs), "both workers took deliveries"
    assert any("Retry in" in log for log in logs), "a delivery waited for the unsettled create"
