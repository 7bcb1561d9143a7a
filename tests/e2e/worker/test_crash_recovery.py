"""A worker SIGKILLed in the middle of a create loses nothing and duplicates nothing.

The worker kills itself at a fail point. Its message stays unacknowledged in
Redis (and would come back only after the hour-long visibility timeout), so
what recovers the delivery is the inbox: a new worker's beat runs the
sweeper, which re-sends the delivery once its lease has run out, and the
redelivery finishes the create it finds this very delivery started.
"""

from __future__ import annotations

import pytest
from celery import Celery
from sqlalchemy import select

from models.broker.messages import PROCESS_DELIVERY
from models.tables import TaskSource
from tests.support.feeds import delivery, link_of, make_feed, store_fixture, tasks_of
from tests.support.processes import StartWorker, finished, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]
#: Runs once on Redis and once on RabbitMQ (tests/e2e/conftest.py).
ON_EVERY_BROKER = True


def _killed_at(start_worker: StartWorker, client: Celery, sessions, point: str):
    """A worker that kills itself at ``point`` while processing one Jira delivery."""
    feed = make_feed(sessions, slug=f"crash-{point.replace('_', '-')}", prefix="CRASH")
    pk = store_fixture(sessions, feed, "jira", "jira_issue_created__cloud")
    doomed = start_worker(f"doomed-{point}", TASKHOOK_FAILPOINT=f"{point}:kill")
    client.send_task(PROCESS_DELIVERY, args=[pk])
    wait_until(
        lambda: doomed.process.poll() is not None, timeout=30, what="the kill", logs=[doomed]
    )
    assert doomed.process.returncode == -9
    assert f"fail point {point}: SIGKILL" in doomed.text()
    return feed, pk, doomed


def test_a_worker_killed_between_insert_and_settlement_is_recovered_by_the_sweeper(
    start_worker: StartWorker, client: Celery, sessions
):
    feed, pk, doomed = _killed_at(start_worker, client, sessions, "after_insert")
    rescuer = None
    try:
        (task,) = tasks_of(sessions, feed.workspace_id)
        assert (task.created_by_delivery, task.external_id_settled_at) == (pk, None)
        assert delivery(sessions, pk).status == "processing"

        rescuer = start_worker("rescuer-after-insert", beat=True)
        wait_until(finished(sessions, pk), timeout=30, what="recovery", logs=[rescuer])

        row = delivery(sessions, pk)
        assert (row.status, row.outcome, row.task_id, row.attempts) == (
            "done",
            "created",
            task.id,
            2,
        )
        assert "finished the create an earlier attempt" in row.status_reason
        (recovered,) = tasks_of(sessions, feed.workspace_id)
        assert recovered.id == task.id and recovered.external_id_settled_at is not None
        assert link_of(sessions, task.id).remote_key == "TES-41"
        with sessions() as session:
            links = session.scalars(select(TaskSource).where(TaskSource.task_id == task.id)).all()
        assert len(links) == 1
        assert "taskhook.sweep" in rescuer.text()
    finally:  # the next case needs the deliveries queue to itself
        for process in (doomed, rescuer):
            if process is not None:
                process.stop()


def test_a_worker_killed_after_the_settlement_leaves_nothing_to_recover(
    start_worker: StartWorker, client: Celery, sessions
):
    # On PostgreSQL the settlement, the task.created event and the delivery's
    # "done" commit in one statement (models.fastpath): there is no state in
    # which the task is settled and its delivery not yet recorded. (The
    # general path's version of that state is covered on both databases by
    # tests/integration/worker/test_processing.py.)
    feed, pk, doomed = _killed_at(start_worker, client, sessions, "after_settle")
    try:
        (task,) = tasks_of(sessions, feed.workspace_id)
        assert task.external_id_settled_at is not None
        row = delivery(sessions, pk)
        assert (row.status, row.outcome, row.task_id, row.attempts) == (
            "done",
            "created",
            task.id,
            1,
        )
    finally:
        doomed.stop()
