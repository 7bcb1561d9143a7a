"""The worker's fast path and where it hands over to the general path.

Each test runs on SQLite and on PostgreSQL, each with the fast path on (the
plain case takes its two transactions) and off (the general path does
everything): the same assertions on all four prove the paths give the same
answers, including
at every hand-over (a WIP limit, a lost race, a release or a delete between
the insert and the settlement, a row without the draft the ingress reads).
"""

from __future__ import annotations

import logging
import threading

import psycopg
import psycopg.sql
import pytest
from sqlalchemy import select, update

from models import fastpath
from models.access import Caller
from models.db import session_scope
from models.events import events_after
from models.fastpath import fast_path
from models.inbox import DeliveryStatus, replay
from models.tables import Delivery, Task
from models.tasks import (
    MAX_DESCRIPTION_LENGTH,
    MAX_REMOTE_KEY_LENGTH,
    MAX_TITLE_LENGTH,
    NewTask,
    SourceLink,
    create_task,
)
from tests.support.feeds import delivery, make_feed, store_fixture, tasks_of
from tests.support.processes import wait_until
from tests.support.runs import expire_lease, run
from tests.support.stores import Store
from worker import processing
from worker.processing import Seams

RIVAL_SOURCE = SourceLink(provider="jira", url="https://rival.example/TES-41", remote_key="TES-41")


@pytest.fixture
def general_creates(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The deliveries whose create went down the general path (``create_task``)."""
    creates: list[int] = []

    def counting(**kwargs):
        creates.append(kwargs["new"].created_by_delivery)
        return create_task(**kwargs)

    monkeypatch.setattr(processing.general, "create_task", counting)
    return creates


def test_a_plain_create_takes_the_fast_path_unless_it_is_turned_off(
    store: Store, general_creates: list[int]
):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")
    with fast_path(store.engine) as fast:
        assert fast is not None

    processed = run(store, pk)

    assert (processed.status, processed.outcome) == (DeliveryStatus.DONE, "created")
    assert processed.path == ("fast" if store.takes_fast_path else "general")
    assert general_creates == ([] if store.takes_fast_path else [pk])


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
        processed = run(store, pk, seams=Seams(after_lookup=once))

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

    processed = run(store, pk, seams=Seams(after_insert=operator_releases))

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

    stale = run(store, pk, seams=Seams(after_insert=a_newer_attempt_claims_it))

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


@pytest.mark.postgres
def test_a_connection_lost_mid_delivery_is_retried_and_not_reused(fast_path_store: Store):
    store = fast_path_store
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")

    def the_server_drops_every_other_connection(_task: Task) -> None:
        with store.engine.connect() as admin:
            admin.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )

    retried = run(store, pk, seams=Seams(after_insert=the_server_drops_every_other_connection))

    assert retried.status is DeliveryStatus.PROCESSING and retried.retry_in is not None
    row = delivery(store.sessions, pk)
    assert "terminating connection" in row.last_error
    (unsettled,) = tasks_of(store.sessions, feed.workspace_id)  # the insert had committed
    assert (unsettled.created_by_delivery, unsettled.external_id_settled_at) == (pk, None)

    expire_lease(store, pk)
    processed = run(store, pk)

    assert (processed.status, processed.outcome) == (DeliveryStatus.DONE, "created")
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (task.identifier, task.id) == ("ACME-1", unsettled.id)
    assert task.external_id_settled_at is not None


def test_a_rival_insert_racing_the_fast_statement_is_found_by_the_backstop(
    postgres_store: Store, general_creates: list[int], caplog: pytest.LogCaptureFixture
):
    # Real concurrency, no hook: the rival's row is inserted but not committed
    # when the worker's statement looks up (and misses) and inserts (and waits
    # on the unique index); the rival commits and the statement fails whole.
    store = postgres_store
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    step = store.scalar("SELECT min(id) FROM workflow_steps")
    answers: list[processing.Processed] = []

    with store.engine.connect() as rival:
        rival.exec_driver_sql(
            "INSERT INTO tasks (workspace_id, identifier, title, step_id, external_id,"
            " external_id_settled_at, created_at, updated_at)"
            " VALUES (%s, 'RIVAL-1', 'rival', %s, 'jira:TES-41', now(), now(), now())",
            (feed.workspace_id, step),
        )
        worker = threading.Thread(target=lambda: answers.append(run(store, pk)))
        with caplog.at_level(logging.INFO, logger="worker.processing"):
            worker.start()
            wait_until(
                lambda: (
                    store.scalar(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock'"
                    )
                    == 1
                ),
                timeout=10,
                what="the worker's insert to wait on the rival's",
            )
            rival.commit()
            worker.join(timeout=10)

    (processed,) = answers
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (processed.status, processed.outcome, processed.task_id) == (
        DeliveryStatus.DONE,
        "found_settled",
        task.id,
    )
    assert general_creates == [pk]  # the statement rolled back whole; the general path found it
    assert "the insert backstop found task" in caplog.text
    assert store.scalar("SELECT task_sequence FROM workspaces") == 0  # none spent
    assert delivery(store.sessions, pk).attempts == 1  # the rolled-back claim left no attempt


def test_a_row_without_the_draft_is_created_by_the_general_path(
    store: Store, general_creates: list[int]
):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud", read=False)

    processed = run(store, pk)

    assert (processed.status, processed.outcome) == (DeliveryStatus.DONE, "created")
    assert general_creates == [pk]
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert task.external_id == "jira:TES-41"


def test_the_fast_path_creates_the_task_the_ingress_read(fast_store: Store):
    store = fast_store
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    with session_scope(store.sessions) as session:  # as if the ingress had read it so
        session.execute(update(Delivery).where(Delivery.id == pk).values(draft_title="As read"))

    run(store, pk)

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (task.title, task.external_id) == ("As read", "jira:TES-41")


def test_a_replay_reads_the_body_afresh(store: Store, general_creates: list[int]):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    as_the_body_says = delivery(store.sessions, pk).draft_title
    with session_scope(store.sessions) as session:  # parked, with a draft read before a fix
        session.execute(
            update(Delivery)
            .where(Delivery.id == pk)
            .values(status="dead", draft_title="Read by a buggy adapter")
        )
    with session_scope(store.sessions) as session:
        replay(session=session, delivery_pk=pk)

    processed = run(store, pk)

    assert (processed.status, processed.outcome) == (DeliveryStatus.DONE, "created")
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert task.title == as_the_body_says  # read from the body by the adapter as it is now
    assert general_creates == [pk]


@pytest.mark.parametrize(
    "too_long",
    [
        {"draft_description": "d" * (MAX_DESCRIPTION_LENGTH + 1)},
        {"draft_title": "t" * (MAX_TITLE_LENGTH + 1)},
        {"draft_remote_key": "k" * (MAX_REMOTE_KEY_LENGTH + 1)},
    ],
    ids=["description", "title", "remote-key"],
)
def test_a_kept_draft_longer_than_the_store_keeps_is_created_from_the_body_instead(
    store: Store, general_creates: list[int], too_long: dict[str, str]
):
    # As an ingress from before the store's limits could have kept it: the fast
    # path's SQL checks the limits again, and the general path reads the body.
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    as_the_body_says = delivery(store.sessions, pk)
    with session_scope(store.sessions) as session:
        session.execute(update(Delivery).where(Delivery.id == pk).values(**too_long))

    processed = run(store, pk)

    assert (processed.status, processed.outcome, processed.path) == (
        DeliveryStatus.DONE,
        "created",
        "general",
    )
    assert general_creates == [pk]
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (task.title, task.description) == (
        as_the_body_says.draft_title,
        as_the_body_says.draft_description,
    )


@pytest.mark.parametrize(
    "statement, planned_at, values",
    [
        # No keys: a group that runs and changes nothing; the generic plan
        # is the same whatever the values. Planned at the sizes where this
        # machine's PostgreSQL 15 made each plan wrong.
        (
            fastpath._claim_and_insert,
            200,
            {"deliveries": [], "now": None, "lease_until": None, "max_lost": 3},
        ),
        (
            fastpath._settle_and_finish,
            0,
            {
                "tasks": [],
                "external_ids": [],
                "providers": [],
                "urls": [],
                "remote_keys": [],
                "deliveries": [],
                "attempts": [],
                "now": None,
            },
        ),
    ],
    ids=["claim_and_insert", "settle_and_finish"],
)
def test_a_plan_made_while_the_tasks_are_few_is_made_anew_as_they_grow(
    fast_path_store: Store, statement, planned_at: int, values: dict[str, object]
):
    """A connection keeps the generic plan PostgreSQL makes of a group's
    statement, made from the tables' sizes at the time. On a fresh database
    the tasks are few and any plan may look as cheap as another: made at 200
    tasks, the claim looked a key's task up by scanning all of its
    workspace's tasks, and made at none, the settlement by reading its whole
    external-id index -- for every group after, as the tasks grew
    (docs/performance.md §27). Once the tasks have grown and the connection
    reached its next re-planning, each task is looked up by its key."""
    feed = make_feed(fast_path_store.sessions)
    compiled = statement()
    with fast_path(fast_path_store.engine) as fast:
        connection = fast.connection
        literals = ", ".join(
            psycopg.sql.Literal(value).as_string(connection) for value in compiled.params(**values)
        )

        def run_a_group() -> None:
            fastpath._run_together(
                connection, compiled, [10**9], f"EXECUTE {compiled.name}({literals})"
            )

        def plan() -> list[str]:
            with psycopg.RawCursor(connection) as cursor:
                explained = cursor.execute(f"EXPLAIN EXECUTE {compiled.name}({literals})")
                return [row[0].strip() for row in explained]

        connection.execute("SET plan_cache_mode = force_generic_plan")
        try:
            _add_tasks(connection, feed.workspace_id, up_to=planned_at)
            run_a_group()  # prepared now, planned at this size
            _add_tasks(connection, feed.workspace_id, up_to=3000)
            for _ in range(fastpath.FIRST_REPLAN):
                run_a_group()
            lookups = _task_lookups(plan())
        finally:
            connection.execute("DEALLOCATE ALL")
            connection.execute("RESET plan_cache_mode")
            fastpath._prepared.pop(connection, None)

    assert lookups, "the statement reads the tasks"
    for scan, condition in lookups:
        assert scan.startswith(("Index Scan", "Index Only Scan")), (scan, condition)
        assert condition in {
            "Index Cond: (id = given_2.tasks)",
            "Index Cond: ((workspace_id = webhook_sources_1.workspace_id) AND"
            " (external_id = deliveries_1.external_id))",
        }, (scan, condition)


def _add_tasks(connection: psycopg.Connection, workspace_id: int, *, up_to: int) -> None:
    """Tasks in the workspace, as many as ``up_to`` in all, straight into the table."""
    connection.execute(
        """
        INSERT INTO tasks (workspace_id, identifier, title, step_id, created_at, updated_at,
                           external_id, stable_key)
        SELECT %(workspace)s, 'GROWN-' || n, 'grown', step.id, now(), now(),
               'gh-issue/owner/grown#' || n, 'github:grown:' || n
        FROM generate_series(
            (SELECT count(*) FROM tasks WHERE workspace_id = %(workspace)s) + 1, %(up_to)s
        ) AS n,
        LATERAL (SELECT id FROM workflow_steps WHERE workspace_id = %(workspace)s
                 ORDER BY position LIMIT 1) AS step
        """,
        {"workspace": workspace_id, "up_to": up_to},
    )


def _task_lookups(plan: list[str]) -> list[tuple[str, str]]:
    """Each read of the tasks in ``plan``, with the condition it reads by."""
    return [
        (line.removeprefix("->  "), following)
        for line, following in zip(plan, [*plan[1:], ""], strict=True)
        if " on tasks" in line and " Scan " in line
    ]
