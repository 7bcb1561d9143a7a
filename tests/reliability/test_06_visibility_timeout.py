"""Scenario 6: a task that runs past Redis's visibility timeout -> executed twice,
one task.

Redis hands an unacknowledged message to another consumer once its
visibility timeout has passed (here 4 s; an hour in production, above the
task time limit). A worker that stalls longer than that -- the threads pool
(taskhook's default), which enforces no Celery time limit, held at a fail
point right after its insert committed -- loses its message: a worker that
starts restores overdue messages, and the next free thread takes it (the
rescuer's, or one of the stalled worker's own).
Beat is not running: the only second delivery is Redis's own.

Both run the same delivery. The second finds the lease of the first run
expired (3 s), claims a new attempt, finds the unsettled task that this very
delivery inserted and finishes it. Only then is the first released (its fail
point holds until the test creates a file; a fixed pause raced the rescuer's
start on a busy machine, and a first run waking before the second claimed
made a different scenario): its settlement finds the task already settled,
and its write to the inbox row is fenced off by the newer attempt. One task,
one source link, one outcome.
"""

from __future__ import annotations

import re
import time

import pytest
from sqlalchemy import select

from models.tables import Delivery as DeliveryRow
from models.tables import Task, TaskSource
from tests.support.invariants import assert_invariants
from tests.support.processes import finished, wait_until
from tests.support.stack import add_tenant, database_view, wait_for_text
from tests.support.traffic import post_all

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

SCENARIO = "6. a task that runs past the visibility timeout"
TIMINGS = {
    "TASKHOOK_TASK_TIME_LIMIT_SECONDS": "2",
    "TASKHOOK_LEASE_SECONDS": "3",
    "TASKHOOK_VISIBILITY_TIMEOUT_SECONDS": "4",
}
VISIBILITY_TIMEOUT = 4.0
RECEIVED = re.compile(r"Task taskhook\.process_delivery\[([0-9a-f-]+)\] received")


def test_a_message_redelivered_past_its_visibility_timeout_runs_twice_and_makes_one_task(
    private_redis, shared_database, stack_on, secret_book, figures, module_logs
):
    engine, sessions = database_view(shared_database.url)
    stack = stack_on(shared_database.url, private_redis.url, **TIMINGS)
    tenant = add_tenant(sessions, secret_book, "overdue", "LATE")
    ingress = stack.ingress()
    release = module_logs / "release-the-first-run"
    slow = stack.worker("stalls", TASKHOOK_FAILPOINT=f"after_insert:hold={release}")

    answer = post_all(ingress.url, [tenant.jira("LATE-1")]).answers[0]
    assert answer.status == 202
    pk = answer.body["delivery"]
    wait_for_text(slow, "fail point after_insert: holding")
    stalled_at = time.monotonic()
    with sessions() as session:
        (task,) = session.scalars(select(Task).where(Task.workspace_id == tenant.workspace_id))
        assert task.external_id_settled_at is None  # inserted, not settled: the stall

    # A starting worker restores the messages unacknowledged for longer than the
    # visibility timeout, counted from when the stalled worker took it (before
    # the stall): past it here, whatever the machine's load.
    time.sleep(max(0.0, VISIBILITY_TIMEOUT + 0.5 - (time.monotonic() - stalled_at)))
    rescuer = stack.worker("restores")
    wait_until(finished(sessions, pk), timeout=60, what="the second run", logs=stack.processes)
    second_done = time.monotonic() - stalled_at
    assert "fail point after_insert: released" not in slow.text()

    # The first run goes on only now, and finds its attempt fenced off.
    release.touch()
    wait_until(
        lambda: f"delivery {pk}: attempt 1 was taken over" in slow.text(),
        timeout=60,
        what="the first run, released, to find its attempt taken over",
        logs=[slow],
    )
    first_stalled = time.monotonic() - stalled_at

    # Which worker runs it the second time is the broker's choice: the rescuer,
    # or a free thread of the stalled worker itself.
    received = RECEIVED.findall(slow.text() + rescuer.text())
    assert len(set(received)) == 1 and len(received) == 2, "one message, executed twice"

    with sessions() as session:
        tasks = session.scalars(select(Task).where(Task.workspace_id == tenant.workspace_id)).all()
        links = session.scalars(select(TaskSource).where(TaskSource.task_id == tasks[0].id)).all()
        row = session.get(DeliveryRow, pk)
    assert len(tasks) == 1 and tasks[0].id == task.id
    assert tasks[0].external_id_settled_at is not None and len(links) == 1
    assert (row.status, row.outcome, row.task_id, row.attempts) == ("done", "created", task.id, 2)
    assert "finished the create an earlier attempt" in row.status_reason
    assert_invariants(engine)
    engine.dispose()
    figures.record(
        SCENARIO,
        visibility_timeout_s=4,
        lease_s=3,
        first_run_stalled_s=round(first_stalled, 1),
        executions=2,
        tasks=1,
        source_links=1,
        attempts_on_the_row=row.attempts,
        outcome=row.outcome,
        second_run_done_s_after_the_stall_began=round(second_done, 1),
        first_run_write="fenced off (taken over by attempt 2)",
    )
