"""Twenty deliveries for one Jira issue, raced by two worker processes.

Each worker runs one delivery at a time, and the one whose insert commits
holds there (a fail point) until the other has found the identity unsettled
and retried -- the path a slow create takes in production. The order comes
from the workers' own logs, not from a pause racing the machine, so the test
holds on a loaded machine too.
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
    start_worker: StartWorker, client: Celery, sessions, tmp_path
):
    go = tmp_path / "go"
    held_insert = {
        "TASKHOOK_FAILPOINT": f"after_insert:hold={go}",
        "TASKHOOK_WORKER_CONCURRENCY": "1",
    }
    workers = [start_worker("racer-a", **held_insert), start_worker("racer-b", **held_insert)]
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
    # The inserting worker is held; the other one is free, so it takes the
    # next delivery, finds the identity unsettled and schedules a retry.
    wait_until(
        lambda: any("Retry in" in worker.text() for worker in workers),
        timeout=60,
        what="a delivery to find the held create unsettled and retry",
        logs=workers,
    )
    go.touch()
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
    (holder,) = [log for log in logs if "after_insert: holding" in log]
    (waiter,) = [log for log in logs if log is not holder]
    assert "Retry in" in waiter, "the other worker took a delivery and waited for the create"
