"""Deliveries through a real worker, Redis and PostgreSQL, end to end.

One prefork worker (one pool child, which builds its engine in
``worker_process_init``) serves the module, on both queues.
"""

from __future__ import annotations

import json
import time

import pytest
from celery import Celery

from models.broker.messages import (
    IDEMPOTENCY_KEY_HEADER,
    PROCESS_DELIVERY,
    RELEASE_IDENTITY,
    SWEEP,
)
from models.broker.versions import HEADER, MESSAGE_VERSION
from models.tables import IdentityRelease, Task
from tests.support.feeds import (
    EXPECTED,
    delivery,
    link_of,
    make_feed,
    store_fixture,
    tasks_of,
)
from tests.support.processes import StartWorker, WorkerProcess, finished, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]
#: Runs once on Redis and once on RabbitMQ (tests/e2e/conftest.py).
ON_EVERY_BROKER = True

WAIT = 30.0


@pytest.fixture(scope="module")
def worker(start_worker: StartWorker) -> WorkerProcess:
    return start_worker("main", pool="prefork")


def send(client: Celery, pk: int) -> None:
    client.send_task(PROCESS_DELIVERY, args=[pk])


def test_real_fixtures_become_tasks_with_their_external_ids_and_links(
    worker: WorkerProcess, client: Celery, sessions
):
    feed = make_feed(sessions, slug="fixtures", prefix="FIX")
    pks = {key: store_fixture(sessions, feed, *key) for key in sorted(EXPECTED)}
    for pk in pks.values():
        send(client, pk)

    wait_until(finished(sessions, *pks.values()), timeout=WAIT, what="deliveries", logs=[worker])

    for pk in pks.values():
        row = delivery(sessions, pk)
        assert (row.status, row.outcome) == ("done", "created"), row.status_reason
    by_external_id = {task.external_id: task for task in tasks_of(sessions, feed.workspace_id)}
    assert set(by_external_id) == {external_id for external_id, _ in EXPECTED.values()}
    for (provider, name), (external_id, url) in EXPECTED.items():
        task = by_external_id[external_id]
        assert task.external_id_settled_at is not None
        assert task.created_by_delivery == pks[provider, name]
        link = link_of(sessions, task.id)
        assert (link.provider, link.url) == (provider, url)


def test_the_same_delivery_sent_five_times_is_one_task(
    worker: WorkerProcess, client: Celery, sessions
):
    feed = make_feed(sessions, slug="five-times", prefix="FIVE")
    pk = store_fixture(sessions, feed, "github", "issues__opened")

    for _ in range(5):
        send(client, pk)
    wait_until(finished(sessions, pk), timeout=WAIT, what="the delivery", logs=[worker])
    # Every one of the five messages ran (the worker logs each one's answer),
    # rather than a sleep that hopes so.
    ran = "succeeded in"
    wait_until(
        lambda: (
            sum(ran in line and f"'delivery': {pk}," in line for line in worker.text().splitlines())
            == 5
        ),
        timeout=WAIT,
        what="all five messages",
        logs=[worker],
    )

    assert len(tasks_of(sessions, feed.workspace_id)) == 1
    row = delivery(sessions, pk)
    assert (row.status, row.outcome, row.attempts) == ("done", "created", 1)


def test_a_delivery_whose_message_was_lost_is_processed_by_the_sweeper(
    worker: WorkerProcess, client: Celery, sessions
):
    feed = make_feed(sessions, slug="lost-message", prefix="LOST")
    pk = store_fixture(sessions, feed, "github", "pull_request__opened")  # never sent

    time.sleep(1.2)  # past the queued grace period (1 s)
    client.send_task(SWEEP)  # what beat sends every sweep interval
    wait_until(finished(sessions, pk), timeout=WAIT, what="the swept delivery", logs=[worker])

    (task,) = tasks_of(sessions, feed.workspace_id)
    assert task.external_id == "gh-pr/Codertocat/Hello-World#2"
    assert delivery(sessions, pk).outcome == "created"


def test_release_through_the_operator_queue_frees_the_identity_and_audits_it(
    worker: WorkerProcess, client: Celery, sessions
):
    feed = make_feed(sessions, slug="release", prefix="REL")
    first = store_fixture(sessions, feed, "jira", "jira_issue_created__cloud")
    send(client, first)
    wait_until(finished(sessions, first), timeout=WAIT, what="the first task", logs=[worker])
    (task,) = tasks_of(sessions, feed.workspace_id)

    mistake = client.send_task(
        RELEASE_IDENTITY, args=[feed.workspace_id, "jira:TES-41", "alice", " ", task.id]
    ).get(timeout=WAIT)
    # What an older CLI queued: no expected holder, so nothing is released.
    legacy = client.send_task(
        RELEASE_IDENTITY, args=[feed.workspace_id, "jira:TES-41", "alice", "import gone wrong"]
    ).get(timeout=WAIT)
    # The CLI's key rides in a header: the message sent again answers the first release.
    answer, resent = (
        client.send_task(
            RELEASE_IDENTITY,
            args=[feed.workspace_id, "jira:TES-41", "alice", "import gone wrong", task.id],
            headers={IDEMPOTENCY_KEY_HEADER: "k-e2e-release"},
        ).get(timeout=WAIT)
        for _ in range(2)
    )

    assert mistake == {"released": False, "error": "a release must give a reason"}
    assert (legacy["released"], legacy["expected_holder_missing"]) == (False, True)
    assert (answer["released"], answer["replayed"]) == (True, False)
    assert (answer["task_id"], answer["identifier"]) == (task.id, task.identifier)
    assert resent == answer | {"replayed": True}
    json.dumps(answer)  # JSON all the way
    with sessions() as session:
        audit = session.get(IdentityRelease, answer["audit_id"])
        assert (audit.task_id, audit.operator, audit.reason) == (
            task.id,
            "alice",
            "import gone wrong",
        )
        released = session.get(Task, task.id)
        assert (released.external_id, released.external_id_settled_at) == (None, None)

    # The identity is free: the next delivery for the issue makes a new task.
    again = store_fixture(sessions, feed, "jira", "jira_issue_created__cloud")
    send(client, again)
    wait_until(finished(sessions, again), timeout=WAIT, what="the second task", logs=[worker])
    assert [t.external_id for t in tasks_of(sessions, feed.workspace_id)] == [None, "jira:TES-41"]


def test_a_message_with_arguments_this_release_does_not_know_is_processed(
    worker: WorkerProcess, client: Celery, sessions
):
    """What a newer release might send (models.broker.versions): the task runs
    with what it knows and says once what it ignored -- never a TypeError."""
    feed = make_feed(sessions, slug="newer", prefix="NEW")
    pk = store_fixture(sessions, feed, "jira", "jira_issue_created__cloud")

    client.send_task(
        PROCESS_DELIVERY,
        args=[pk],
        kwargs={"added_later": True},
        headers={HEADER: MESSAGE_VERSION + 1},
    )

    wait_until(finished(sessions, pk), timeout=WAIT, what="the delivery", logs=[worker])
    assert delivery(sessions, pk).outcome == "created"
    wait_until(
        lambda: "ignored arguments this release does not know (added_later)" in worker.text(),
        timeout=WAIT,
        what="the worker's notice",
        logs=[worker],
    )
    assert "TypeError" not in worker.text()
