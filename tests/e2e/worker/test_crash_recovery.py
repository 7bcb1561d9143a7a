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

from models.messages import PROCESS_DELIVERY
from models.tables import TaskSource
from tests.e2e.conftest import StartWorker, finished, wait_until
from tests.integration.worker.feeds import delivery, link_of, make_feed, store_fixture, tasks_of

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


@pytest.mark.parametrize(
    ("point", "settled_at_death", "recovery"),
    [
        ("after_insert", False, "finished the create an earlier attempt"),
        ("after_settle", True, "an earlier attempt of this delivery created the task"),
    ],
)
def test_a_worker_killed_mid_create_is_recovered_by_the_sweeper(
    start_worker: StartWorker,
    client: Celery,
    sessions,
    point: str,
    settled_at_death: bool,
    recovery: str,
):
    feed = make_feed(sessions, slug=f"crash-{point.replace('_', '-')}", prefix="CRASH")
    pk = store_fixture(sessions, feed, "jira", "jira_issue_created__cloud")
    doomed = start_worker(f"doomed-{point}", TASKHOOK_FAILPOINT=f"{point}:kill")
    rescuer = None
    try:
        client.send_task(PROCESS_DELIVERY, args=[pk])
        wait_until(
            lambda: doomed.process.poll() is not None, timeout=30, what="the kill", logs=[doomed]
        )

        assert doomed.process.returncode == -9
        assert f"fail point {point}: SIGKILL" in doomed.text()
        (task,) = tasks_of(sessions, feed.workspace_id)
        assert task.created_by_delivery == pk
        assert (task.external_id_settled_at is not None) is settled_at_death
        assert delivery(sessions, pk).status == "processing"

        rescuer = start_worker(f"rescuer-{point}", beat=True)
        wait_until(finished(sessions, pk), timeout=30, what="recovery", logs=[rescuer])

        row = delivery(sessions, pk)
        assert (row.status, row.outcome, row.task_id, row.attempts) == (
            "done",
            "created",
            task.id,
            2,
        )
        assert recovery in row.status_reason
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
