"""process_delivery on SQLite and PostgreSQL, with real fixture bodies.

Each test reads as one sentence about what a stored delivery becomes. A crash
is simulated by a create hook raising ``Crash`` (tests/support/runs.py),
a BaseException the worker does not catch -- as a SIGKILL would, it leaves
everything committed so far in place and nothing after it.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
from datetime import timedelta

import pytest
from sqlalchemy import delete, update

from models.db import session_scope
from models.inbox import DeliveryStatus, sweepable
from models.providers import PROVIDERS
from models.settings import Settings
from models.tables import Delivery, Task, utcnow
from models.tasks import delete_task, release_external_id
from tests.support.deliveries import fixture
from tests.support.feeds import (
    EXPECTED,
    delivery,
    link_of,
    make_feed,
    store_delivery,
    store_fixture,
    tasks_of,
)
from tests.support.runs import (
    SETTINGS,
    crashed_create,
    database_goes_away,
    expire_lease,
    replay_delivery,
    run,
)
from tests.support.stores import TRUSTED, Store
from worker.processing import Processed, Seams, backoff_seconds, next_retry
from worker.sweeper import sweep

# --- what a delivery becomes -------------------------------------------------------


@pytest.mark.parametrize(("provider", "name"), sorted(EXPECTED))
def test_a_create_event_becomes_a_settled_linked_task_and_its_delivery_is_done(
    store: Store, provider: str, name: str
):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, provider, name)

    processed = run(store, pk)

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    external_id, url = EXPECTED[provider, name]
    assert (processed.status, processed.outcome, processed.task_id) == (
        DeliveryStatus.DONE,
        "created",
        task.id,
    )
    assert task.external_id == external_id
    assert task.external_id_settled_at is not None
    assert task.created_by_delivery == pk
    link = link_of(store.sessions, task.id)
    assert (link.provider, link.url) == (provider, url)
    row = delivery(store.sessions, pk)
    assert (row.status, row.outcome, row.task_id, row.attempts) == ("done", "created", task.id, 1)
    assert row.lease_expires_at is None


def test_the_same_delivery_processed_twice_is_one_task(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")

    run(store, pk)
    again = run(store, pk)

    assert again.status is None
    assert len(tasks_of(store.sessions, feed.workspace_id)) == 1
    assert delivery(store.sessions, pk).attempts == 1


def test_two_deliveries_for_one_jira_issue_are_one_task_and_the_second_is_found(store: Store):
    feed = make_feed(store.sessions)
    first = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    second = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")

    created, found = run(store, first), run(store, second)

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (created.outcome, found.outcome) == ("created", "found_settled")
    assert found.task_id == created.task_id == task.id
    assert delivery(store.sessions, second).status == "done"
    assert store.scalar("SELECT task_sequence FROM workspaces") == 1  # no number burnt


def test_an_event_the_source_does_not_create_from_is_ignored_with_the_reason(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__closed")

    processed = run(store, pk)

    assert processed.status is DeliveryStatus.IGNORED
    assert "issues.closed does not create tasks" in delivery(store.sessions, pk).status_reason
    assert tasks_of(store.sessions, feed.workspace_id) == []


@pytest.mark.parametrize(
    ("body", "content_type", "reason"),
    [
        (b"{not json", "application/json", "not valid JSON"),
        (b'{"action": "opened"}', "application/json", "expected shape"),
        (b'{"action": "opened"}', "text/plain", "must be application/json"),
    ],
    ids=["not-json", "wrong-shape", "wrong-content-type"],
)
def test_an_unusable_body_is_dead_with_the_reason_and_never_retried(
    store: Store, body: bytes, content_type: str, reason: str
):
    feed = make_feed(store.sessions)
    pk = store_delivery(
        store.sessions,
        feed.github_source_id,
        body=body,
        event="issues.opened",
        content_type=content_type,
    )

    processed = run(store, pk)

    assert (processed.status, processed.retry_in) == (DeliveryStatus.DEAD, None)
    assert reason in delivery(store.sessions, pk).status_reason
    assert tasks_of(store.sessions, feed.workspace_id) == []


# --- another create holds the identity -----------------------------------------------


def test_another_deliverys_unsettled_create_is_waited_for_then_parked_untouched(store: Store):
    feed = make_feed(store.sessions)
    holder_pk = crashed_create(store, feed)
    (holder,) = tasks_of(store.sessions, feed.workspace_id)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")

    waiting = run(store, pk, retries=0)

    assert waiting.status is DeliveryStatus.PROCESSING
    assert 0.5 <= waiting.retry_in - 0.5 <= 1.0  # first retry: half to all of the base
    row = delivery(store.sessions, pk)
    assert row.lease_expires_at > utcnow()  # deferred: the sweeper leaves it alone
    assert holder.identifier in row.status_reason and f"delivery {holder_pk}" in row.status_reason
    with session_scope(store.sessions) as session:
        assert pk not in sweepable(session=session, queued_grace_seconds=0)

    expire_lease(store, pk)
    parked = run(store, pk, retries=SETTINGS.unsettled_max_retries)

    assert (parked.status, parked.retry_in) == (DeliveryStatus.NEEDS_OPERATOR, None)
    row = delivery(store.sessions, pk)
    assert (row.status, row.outcome, row.task_id) == (
        "needs_operator",
        "found_unsettled",
        holder.id,
    )
    assert "'jira:TES-41' is held by unsettled task ACME-1" in row.status_reason
    # Another delivery's create is never finished (nor released) by this one.
    (still,) = tasks_of(store.sessions, feed.workspace_id)
    assert (still.external_id, still.external_id_settled_at) == ("jira:TES-41", None)
    assert link_of(store.sessions, holder.id) is None


def test_the_retry_wait_grows_exponentially_with_jitter_and_stops_at_the_limit():
    rng = random.Random(4)
    settings = Settings(retry_base_seconds=1.0, retry_max_seconds=20.0)
    for retries, ceiling in enumerate([1, 2, 4, 8, 16, 20, 20]):
        waits = [backoff_seconds(retries, settings=settings, rng=rng) for _ in range(200)]
        assert ceiling / 2 <= min(waits) and max(waits) <= ceiling
        assert max(waits) - min(waits) > ceiling / 4  # jittered, not one fixed wait
    assert next_retry(2, limit=3, settings=settings, rng=rng) is not None
    assert next_retry(3, limit=3, settings=settings, rng=rng) is None
    assert next_retry(0, limit=0, settings=settings, rng=rng) is None
    assert backoff_seconds(10_000, settings=settings) <= 20.0  # no overflow far out


def test_a_full_intake_step_is_retried_then_parked(store: Store):
    feed = make_feed(store.sessions, intake_wip_limit=0)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")

    waiting = run(store, pk)
    assert waiting.status is DeliveryStatus.PROCESSING and waiting.retry_in is not None
    assert "WIP limit" in delivery(store.sessions, pk).status_reason

    expire_lease(store, pk)
    parked = run(store, pk, retries=SETTINGS.unsettled_max_retries)
    assert parked.status is DeliveryStatus.NEEDS_OPERATOR
    assert "WIP limit of 0" in delivery(store.sessions, pk).status_reason
    assert store.scalar("SELECT task_sequence FROM workspaces") == 0


# --- crashes, redeliveries and stale attempts ------------------------------------------


def test_a_redelivery_finishes_its_own_unsettled_create(store: Store):
    feed = make_feed(store.sessions)
    pk = crashed_create(store, feed)
    expire_lease(store, pk)
    with session_scope(store.sessions) as session:
        assert pk in sweepable(session=session, queued_grace_seconds=60)

    processed = run(store, pk)

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (processed.status, processed.outcome, processed.task_id) == (
        DeliveryStatus.DONE,
        "created",
        task.id,
    )
    assert task.external_id_settled_at is not None
    assert link_of(store.sessions, task.id).remote_key == "TES-41"
    assert delivery(store.sessions, pk).attempts == 2


def test_a_task_settled_by_a_run_that_died_before_recording_it_counts_as_created(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "pull_request__opened")
    run(store, pk)
    with session_scope(store.sessions) as session:  # as if the last commit never happened
        session.execute(
            update(Delivery)
            .where(Delivery.id == pk)
            .values(status="processing", outcome=None, task_id=None, lease_expires_at=utcnow())
        )

    processed = run(store, pk)

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (processed.status, processed.outcome, processed.task_id) == (
        DeliveryStatus.DONE,
        "created",
        task.id,
    )


def test_a_stale_attempt_cannot_overwrite_the_attempt_that_took_over(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    newer: list[Processed] = []

    def lease_runs_out_and_a_redelivery_takes_over(_task: Task) -> None:
        expire_lease(store, pk)
        newer.append(run(store, pk))

    stale = run(store, pk, seams=Seams(after_insert=lease_runs_out_and_a_redelivery_takes_over))

    assert (newer[0].status, newer[0].outcome) == (DeliveryStatus.DONE, "created")
    assert stale.status is None and "taken over" in stale.reason
    row = delivery(store.sessions, pk)
    assert (row.status, row.attempts, row.outcome) == ("done", 2, "created")
    assert "earlier attempt" in row.status_reason  # the newer attempt's record stands
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert task.external_id_settled_at is not None


def test_a_task_deleted_before_it_settled_parks_the_delivery(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")

    def someone_deletes_it(task: Task) -> None:
        with session_scope(store.sessions) as session:
            session.execute(delete(Task).where(Task.id == task.id))

    processed = run(store, pk, seams=Seams(after_insert=someone_deletes_it))

    assert processed.status is DeliveryStatus.NEEDS_OPERATOR
    assert "deleted before its creation settled" in delivery(store.sessions, pk).status_reason
    assert tasks_of(store.sessions, feed.workspace_id) == []


# --- the create fenced by the lease (docs/contract.md, "Fencing the create") -----------


def delete_over_rest(store: Store, task_id: int) -> None:
    """What DELETE /api/v1/tasks/{id} does: the task service's delete."""
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=task_id)


def test_a_task_deleted_after_its_attempt_died_parks_the_delivery_instead_of_a_new_task(
    store: Store,
):
    feed = make_feed(store.sessions)
    pk = crashed_create(store, feed)
    (inserted,) = tasks_of(store.sessions, feed.workspace_id)
    delete_over_rest(store, inserted.id)
    expire_lease(store, pk)

    processed = run(store, pk)

    assert processed.status is DeliveryStatus.NEEDS_OPERATOR
    row = delivery(store.sessions, pk)
    assert "deleted before its creation settled" in row.status_reason
    assert row.created_task_id == inserted.id
    assert tasks_of(store.sessions, feed.workspace_id) == []
    assert store.scalar("SELECT task_sequence FROM workspaces") == 1  # no number spent

    replay_delivery(store, pk)  # the operator's word: create it again
    again = run(store, pk)

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (again.status, again.outcome, task.identifier) == (
        DeliveryStatus.DONE,
        "created",
        "ACME-2",
    )
    assert delivery(store.sessions, pk).created_task_id == task.id


def test_a_stale_attempt_resuming_after_its_lookup_inserts_nothing(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    newer: list[Processed] = []

    def lease_runs_out_a_redelivery_creates_and_the_task_is_deleted() -> None:
        if newer:
            return
        expire_lease(store, pk)
        newer.append(run(store, pk))
        delete_over_rest(store, newer[0].task_id)

    stale = run(
        store,
        pk,
        seams=Seams(after_lookup=lease_runs_out_a_redelivery_creates_and_the_task_is_deleted),
    )

    assert (newer[0].status, newer[0].outcome) == (DeliveryStatus.DONE, "created")
    assert stale.status is None and "taken over" in stale.reason
    assert tasks_of(store.sessions, feed.workspace_id) == []  # the delete stands
    row = delivery(store.sessions, pk)
    assert (row.status, row.attempts, row.task_id) == ("done", 2, newer[0].task_id)
    assert store.scalar("SELECT task_sequence FROM workspaces") == 1  # the stale number rolled back


def test_an_earlier_attempts_task_released_before_it_settled_is_finished_not_made_again(
    store: Store,
):
    feed = make_feed(store.sessions)
    pk = crashed_create(store, feed)
    (inserted,) = tasks_of(store.sessions, feed.workspace_id)
    with session_scope(store.sessions) as session:
        release_external_id(
            session=session,
            workspace_id=feed.workspace_id,
            external_id=inserted.external_id,
            operator="ops",
            reason="abandoned",
        )
    expire_lease(store, pk)

    processed = run(store, pk)

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (processed.status, processed.outcome, processed.task_id) == (
        DeliveryStatus.DONE,
        "created_identity_lost",
        inserted.id,
    )
    assert (task.external_id, task.external_id_settled_at) == (None, None)
    assert link_of(store.sessions, task.id).remote_key == "TES-41"


BLANK = " \u3000 "


@pytest.fixture
def blank_identities(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Jira adapter reads every body as naming a blank external id, at the
    ingress and in the worker alike. No adapter does (each prefixes its own);
    were one to, a task without an identity would be made again by every
    redelivery."""
    jira = PROVIDERS["jira"]
    real = jira.to_draft

    def blank(*arguments, **keywords):
        return dataclasses.replace(real(*arguments, **keywords), external_id=BLANK)

    monkeypatch.setattr(jira, "to_draft", blank)


@pytest.mark.usefixtures("blank_identities")
def test_a_delivery_whose_body_names_a_blank_identity_is_dead_on_every_path(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    assert delivery(store.sessions, pk).draft_title is None  # the ingress kept no draft

    processed = run(store, pk)

    assert processed.status is DeliveryStatus.DEAD
    assert "names no external id" in delivery(store.sessions, pk).status_reason
    assert tasks_of(store.sessions, feed.workspace_id) == []


@pytest.mark.usefixtures("blank_identities")
def test_a_kept_draft_naming_a_blank_identity_is_dead_too_the_fast_paths_sql_refuses_it(
    store: Store,
):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    with session_scope(store.sessions) as session:  # as if an ingress had kept one
        session.execute(
            update(Delivery)
            .where(Delivery.id == pk)
            .values(
                draft_title="t", draft_url="https://x/1", draft_remote_key="1", external_id=BLANK
            )
        )

    processed = run(store, pk)

    assert processed.status is DeliveryStatus.DEAD
    assert "names no external id" in delivery(store.sessions, pk).status_reason
    assert tasks_of(store.sessions, feed.workspace_id) == []


# --- errors ---------------------------------------------------------------------------


def test_a_database_error_is_retried_then_the_delivery_is_dead_with_the_error(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")
    failing = Seams(after_lookup=database_goes_away)

    retried = run(store, pk, seams=failing, retries=0)

    assert retried.status is DeliveryStatus.PROCESSING and retried.retry_in is not None
    row = delivery(store.sessions, pk)
    assert "server closed the connection" in row.last_error
    assert row.lease_expires_at > utcnow()

    expire_lease(store, pk)
    dead = run(store, pk, seams=failing, retries=SETTINGS.database_max_retries)

    assert dead.status is DeliveryStatus.DEAD
    row = delivery(store.sessions, pk)
    assert row.status == "dead"
    assert row.last_error == "OperationalError: server closed the connection"
    assert tasks_of(store.sessions, feed.workspace_id) == []


def test_an_unexpected_error_is_dead_not_a_loop(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")

    def bug() -> None:
        raise RuntimeError("boom")

    processed = run(store, pk, seams=Seams(after_lookup=bug))

    assert processed.status is DeliveryStatus.DEAD
    assert delivery(store.sessions, pk).last_error == "RuntimeError: boom"


def test_a_missing_delivery_is_nothing_to_do(store: Store):
    assert run(store, 12345).status is None


# --- the sweeper ------------------------------------------------------------------------


def test_the_sweeper_sends_lost_queued_rows_and_expired_leases_after_committing(store: Store):
    feed = make_feed(store.sessions)
    lost = store_fixture(store.sessions, feed, "github", "issues__opened")
    fresh = store_fixture(store.sessions, feed, "github", "pull_request__opened")
    dead_worker = crashed_create(store, feed)
    expire_lease(store, dead_worker)
    with session_scope(store.sessions) as session:
        session.execute(
            update(Delivery)
            .where(Delivery.id == lost)
            .values(updated_at=utcnow() - timedelta(minutes=5))
        )
    sent: list[int] = []

    with session_scope(store.sessions) as session:
        swept = sweep(session=session, queued_grace_seconds=60, send=sent.append)

    assert sorted(sent) == sorted(swept) == sorted([lost, dead_worker])
    assert fresh not in sent
    for pk in sent:  # what the sweeper sent is processed to the end
        run(store, pk)
    assert {delivery(store.sessions, pk).status for pk in sent} == {"done"}
    assert len(tasks_of(store.sessions, feed.workspace_id)) == 2


# --- two runs at the same time ---------------------------------------------------------


@pytest.mark.postgres
def test_many_runs_of_one_delivery_at_once_make_one_task(postgres_store: Store):
    feed = make_feed(postgres_store.sessions)
    pk = store_fixture(postgres_store.sessions, feed, "jira", "jira_issue_created__cloud")
    start = threading.Barrier(6)
    results: list[Processed] = []

    def one_run() -> None:
        start.wait()
        results.append(run(postgres_store, pk))

    threads = [threading.Thread(target=one_run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(str(result.status) for result in results).count("done") == 1
    assert len(tasks_of(postgres_store.sessions, feed.workspace_id)) == 1
    row = delivery(postgres_store.sessions, pk)
    assert (row.status, row.outcome, row.attempts) == ("done", "created", 1)


def test_a_payload_naming_an_invalid_external_id_is_dead_naming_the_rule(store: Store):
    """InvalidExternalId has a subclass per rule an external id breaks; each
    ends the delivery as the refusals table says for InvalidExternalId."""
    feed = make_feed(store.sessions)
    payload = json.loads(fixture("github", "issues__opened"))
    payload["repository"]["full_name"] = "own\x07er/repo"
    pk = store_delivery(
        store.sessions,
        feed.github_source_id,
        body=json.dumps(payload).encode(),
        event="issues.opened",
    )

    processed = run(store, pk)

    assert processed.status is DeliveryStatus.DEAD
    assert processed.reason.startswith("cannot become a task: "), processed.reason
    assert "control characters" in processed.reason
    assert tasks_of(store.sessions, feed.workspace_id) == []
