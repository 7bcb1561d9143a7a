"""The worker's fast path (PostgreSQL) and where it hands over to the general path.

Each test runs on SQLite, where the general path does everything, and on
PostgreSQL, where the plain case takes the fast path's four statements: the
same assertions on both prove the two paths give the same answers, including
at every hand-over (a WIP limit, a lost race, a release or a delete between
the insert and the settlement).
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import select, update

from models.access import Caller
from models.db import session_scope
from models.events import events_after
from models.inbox import DeliveryStatus
from models.tables import Delivery, Task
from models.tasks import CreateHooks, NewTask, SourceLink, create_task
from tests.conftest import Store
from tests.integration.worker.feeds import delivery, make_feed, store_fixture, tasks_of
from tests.integration.worker.test_processing import expire_lease, run
from worker.fastpath import FastPath, fast_path

RIVAL_SOURCE = SourceLink(provider="jira", url="https://rival.example/TES-41", remote_key="TES-41")


def test_a_plain_create_takes_the_fast_path_on_postgresql_and_the_general_one_on_sqlite(
    store: Store,
):
    with fast_path(store.engine) as fast:
        assert (fast is not None) == (store.dialect == "postgresql")


def test_consecutive_creates_number_tasks_without_gaps_and_append_one_event_each(store: Store):
    feed = make_feed(store.sessions)
    pks = [
        store_fixture(store.sessions, feed, "github", "issues__opened"),
        store_fixture(store.sessions, feed, "github", "pull_request__opened"),
        store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud"),
    ]

    processed = [run(store, pk) for pk in pks]

    assert [p.outcome for p in processed] == ["created"] * 3
    tasks = tasks_of(store.sessions, feed.workspace_id)
    assert [t.identifier for t in tasks] == ["ACME-1", "ACME-2", "ACME-3"]
    assert all(t.external_id_settled_at is not None for t in tasks)
    with session_scope(store.sessions) as session:
        events = events_after(session=session, workspace_id=feed.workspace_id)
        assert [(e.position, e.type, e.task_id) for e in events] == [
            (n, "task.created", t.id) for n, t in enumerate(tasks, start=1)
        ]
    for pk, task in zip(pks, tasks, strict=True):
        row = delivery(store.sessions, pk)
        assert (row.status, row.outcome, row.task_id, row.lease_expires_at) == (
            "done",
            "created",
            task.id,
            None,
        )
        assert row.status_reason is None


def test_an_intake_step_with_a_wip_limit_and_room_is_admitted_by_the_general_path(store: Store):
    feed = make_feed(store.sessions, intake_wip_limit=1)
    first = store_fixture(store.sessions, feed, "github", "issues__opened")
    second = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")

    admitted, waiting = run(store, first), run(store, second)

    assert (admitted.status, admitted.outcome) == (DeliveryStatus.DONE, "created")
    assert waiting.status is DeliveryStatus.PROCESSING and waiting.retry_in is not None
    assert "WIP limit of 1" in delivery(store.sessions, second).status_reason
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert task.identifier == "ACME-1"
    assert store.scalar("SELECT task_sequence FROM workspaces") == 1  # none spent on the wait


def test_a_rival_that_wins_the_race_after_the_lookup_is_found_by_the_backstop(
    store: Store, caplog: pytest.LogCaptureFixture
):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")

    def rival_creates_it() -> None:
        with session_scope(store.sessions) as session:
            create_task(
                session=session,
                caller=Caller.trusted("rival"),
                workspace_id=feed.workspace_id,
                new=NewTask(title="rival", external_id="jira:TES-41", source=RIVAL_SOURCE),
            )

    calls = []

    def once() -> None:
        if not calls:
            calls.append(1)
            rival_creates_it()

    with caplog.at_level(logging.INFO, logger="worker.processing"):
        processed = run(store, pk, hooks=CreateHooks(after_lookup=once))

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert task.title == "rival"
    assert (processed.status, processed.outcome, processed.task_id) == (
        DeliveryStatus.DONE,
        "found_settled",
        task.id,
    )
    assert "the insert backstop found task" in caplog.text
    assert store.scalar("SELECT task_sequence FROM workspaces") == 1  # the rival's only


def test_a_release_between_the_insert_and_the_settlement_is_created_identity_lost(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")

    def operator_releases(task: Task) -> None:
        with session_scope(store.sessions) as session:
            session.execute(
                update(Task)
                .where(Task.id == task.id)
                .values(external_id=None, external_id_settled_at=None)
            )

    processed = run(store, pk, hooks=CreateHooks(after_insert=operator_releases))

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (processed.status, processed.outcome) == (DeliveryStatus.DONE, "created_identity_lost")
    assert (task.external_id, task.external_id_settled_at) == (None, None)
    with session_scope(store.sessions) as session:
        assert events_after(session=session, workspace_id=feed.workspace_id) == []


def test_a_delivery_taken_over_after_it_settled_keeps_the_newer_attempts_record(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")

    def a_newer_attempt_claims_it(_task: Task) -> None:
        with session_scope(store.sessions) as session:
            session.execute(
                update(Delivery).where(Delivery.id == pk).values(attempts=Delivery.attempts + 1)
            )

    stale = run(store, pk, hooks=CreateHooks(after_insert=a_newer_attempt_claims_it))

    assert stale.status is None and "taken over" in stale.reason
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert task.external_id_settled_at is not None  # the create itself is complete
    row = delivery(store.sessions, pk)
    assert (row.status, row.attempts, row.outcome) == ("processing", 2, None)


def test_the_connection_goes_back_to_the_pool_as_it_came(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")

    run(store, pk)

    with store.engine.connect() as connection:
        raw = connection.connection.driver_connection
        assert getattr(raw, "autocommit", False) is False
        assert connection.execute(select(Task.id)).all()


def test_a_connection_lost_mid_delivery_is_retried_and_not_reused(postgres_store: Store):
    store = postgres_store
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")

    def the_server_drops_every_other_connection() -> None:
        with store.engine.connect() as admin:
            admin.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )

    retried = run(
        store, pk, hooks=CreateHooks(after_lookup=the_server_drops_every_other_connection)
    )

    assert retried.status is DeliveryStatus.PROCESSING and retried.retry_in is not None
    row = delivery(store.sessions, pk)
    assert "terminating connection" in row.last_error
    assert tasks_of(store.sessions, feed.workspace_id) == []

    expire_lease(store, pk)
    processed = run(store, pk)

    assert (processed.status, processed.outcome) == (DeliveryStatus.DONE, "created")
    assert [t.identifier for t in tasks_of(store.sessions, feed.workspace_id)] == ["ACME-1"]


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The identities the fast path looked up with a statement of their own."""
    looked_up: list[str] = []
    is_held = FastPath.is_held

    def counting(self: FastPath, workspace_id: int, external_id: str) -> bool:
        looked_up.append(external_id)
        return is_held(self, workspace_id, external_id)

    monkeypatch.setattr(FastPath, "is_held", counting)
    return looked_up


def test_the_claim_looks_up_the_identity_the_ingress_read(
    postgres_store: Store, lookups: list[str]
):
    store = postgres_store
    feed = make_feed(store.sessions)
    first = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    again = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")

    created, found = run(store, first), run(store, again)

    assert (created.outcome, found.outcome) == ("created", "found_settled")
    assert lookups == []  # both answered by the claim's own lookup
    assert delivery(store.sessions, first).external_id == "jira:TES-41"


def test_a_row_without_the_identity_is_looked_up_on_its_own(
    postgres_store: Store, lookups: list[str]
):
    store = postgres_store
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud", named=False)

    processed = run(store, pk)

    assert processed.outcome == "created"
    assert lookups == ["jira:TES-41"]


def test_the_workers_own_reading_of_the_body_decides_the_identity(
    postgres_store: Store, lookups: list[str]
):
    store = postgres_store
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    with session_scope(store.sessions) as session:  # as if the ingress had read it otherwise
        session.execute(update(Delivery).where(Delivery.id == pk).values(external_id="jira:X-1"))

    processed = run(store, pk)

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (processed.outcome, task.external_id) == ("created", "jira:TES-41")
    assert lookups == ["jira:TES-41"]
