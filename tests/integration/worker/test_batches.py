"""A worker message's keys share the fast path's two commits.

``worker.processing.process_deliveries`` runs the keys of one message; on
the fast path their claims and inserts commit in one transaction and their
settlements in another (docs/architecture.md, "The fast path"): on SQLite
statement by statement, on PostgreSQL each group one simple query. Each
test runs on every store: with the fast path on the keys share the commits
(``Processed.path == "batch"``); without it each key runs alone, and the
answers are the same.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
from sqlalchemy import event, false, select, true, update

import worker.tasks
from models import fastpath
from models.access import Caller
from models.db import session_scope
from models.events import EventType
from models.inbox import DeliveryStatus, claim
from models.tables import Delivery, Task, TaskEvent
from models.tasks import NewTask, SourceLink, create_task, delete_task
from tests.support.feeds import (
    Feed,
    delivery,
    make_feed,
    store_fixture,
    store_github_issue,
    tasks_of,
)
from tests.support.runs import SETTINGS, Crash, expire_lease, run
from tests.support.stores import TRUSTED, Store
from worker import failpoints, processing, runtime
from worker.failpoints import AFTER_INSERT, AFTER_SETTLE, BEFORE_ACK, BEFORE_SETTLE
from worker.processing import Processed, Seams, process_deliveries

#: Lost attempts before a delivery is parked (``park_lost``), low enough to reach.
MAX_LOST = 2
BATCH_SETTINGS = SETTINGS.model_copy(update={"max_lost_attempts": MAX_LOST})


def run_message(store: Store, pks: list[int], **options) -> list[Processed | Exception]:
    """One worker message of ``pks``, as ``worker.tasks.process_deliveries`` runs it."""
    settings = store.worker_settings(options.pop("settings", BATCH_SETTINGS))
    with session_scope(store.sessions) as session:
        return process_deliveries(session=session, delivery_pks=pks, settings=settings, **options)


def batches(store: Store) -> bool:
    """The keys of a message share their commits on this store."""
    return store.takes_fast_path


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], str]]:
    """Each simple query PostgreSQL's fast path sent for a group: its keys and
    the statement it ran after locking them."""
    sent: list[tuple[list[int], str]] = []
    run_together = fastpath._run_together

    def counted(connection, statement, delivery_pks, execution):
        sent.append((list(delivery_pks), execution))
        return run_together(connection, statement, delivery_pks, execution)

    monkeypatch.setattr(fastpath, "_run_together", counted)
    return sent


def answer(processed: Processed | Exception) -> tuple:
    """What a key's run answered, whichever way the fast path ran it."""
    assert isinstance(processed, Processed), processed
    path = "fast" if processed.path == "batch" else processed.path
    return (processed.status, processed.outcome, processed.reason, processed.retry_in, path)


@pytest.fixture
def commits(store: Store) -> Iterator[list[object]]:
    """Every commit on the store's engine from here on: the worker's fast path
    and its session alike."""
    counted: list[object] = []

    def count(connection) -> None:
        counted.append(connection)

    event.listen(store.engine, "commit", count)
    try:
        yield counted
    finally:
        event.remove(store.engine, "commit", count)


def assert_created_and_settled(store: Store, feed: Feed, pks: list[int]) -> None:
    """Exactly one settled task per key, each the key's, and every row done."""
    tasks = tasks_of(store.sessions, feed.workspace_id)
    assert sorted(t.created_by_delivery for t in tasks) == sorted(pks)
    assert len({t.external_id for t in tasks}) == len(tasks)
    assert all(t.external_id_settled_at is not None for t in tasks)
    for task in tasks:
        row = delivery(store.sessions, task.created_by_delivery)
        assert (row.status, row.outcome, row.task_id) == ("done", "created", task.id)


def held_by_hand(store: Store, feed, number: int, *, title: str) -> Task:
    """A task made through the task store, not a delivery, holding the
    identity of ``store_github_issue(..., number)``'s issue."""
    with session_scope(store.sessions) as session:
        return create_task(
            session=session,
            caller=Caller.trusted(title),
            workspace_id=feed.workspace_id,
            new=NewTask(
                title=title,
                external_id=f"gh-issue/Codertocat/Hello-World#{number}",
                source=SourceLink(
                    provider="github", url=f"https://example.com/{number}", remote_key=str(number)
                ),
            ),
        ).task


def test_a_message_of_plain_keys_commits_twice(
    store: Store, commits: list[object], groups: list[tuple[list[int], str]]
):
    feed = make_feed(store.sessions)
    pks = [store_github_issue(store.sessions, feed, number) for number in range(1, 5)]
    commits.clear()

    processed = run_message(store, pks)

    assert [answer(p)[:2] for p in processed] == [(DeliveryStatus.DONE, "created")] * 4
    assert_created_and_settled(store, feed, pks)
    assert [t.identifier for t in tasks_of(store.sessions, feed.workspace_id)] == [
        f"ACME-{n}" for n in range(1, 5)
    ]
    if batches(store):
        assert [p.path for p in processed] == ["batch"] * 4
    if batches(store) and store.dialect == "sqlite":
        assert len(commits) == 2  # the claims and inserts, then the settlements
    elif batches(store):
        # The claims and inserts, then the settlements: each one simple query,
        # its rows locked first, then one EXECUTE for all the keys.
        assert [keys for keys, _ in groups] == [pks, pks]
        assert all(execution.startswith("EXECUTE ") for _, execution in groups)
    else:
        assert "batch" not in {p.path for p in processed}


def test_a_message_across_workspaces_numbers_each_in_the_messages_order(store: Store):
    """Two workspaces' keys in one message, with a key the general path
    decides among them: each workspace's identifiers and stream positions go
    on from where they were, in the message's order, and none is skipped for
    the key that was not the plain case (docs/contract.md, "Why the lookup
    comes first")."""
    acme = make_feed(store.sessions, "acme", "ACME")
    beta = make_feed(store.sessions, "beta", "BETA")
    by_hand = held_by_hand(store, acme, 3, title="made by hand")  # ACME-1
    issue = partial(store_github_issue, store.sessions)
    pks = [issue(beta, 1), issue(acme, 1), issue(acme, 3), issue(beta, 2), issue(acme, 2)]

    processed = run_message(store, pks)

    assert [answer(p)[1] for p in processed] == ["created"] * 2 + ["found_settled"] + [
        "created"
    ] * 2
    assert [
        (t.created_by_delivery, t.identifier) for t in tasks_of(store.sessions, acme.workspace_id)
    ] == [
        (None, "ACME-1"),
        (pks[1], "ACME-2"),
        (pks[4], "ACME-3"),
    ]
    assert [
        (t.created_by_delivery, t.identifier) for t in tasks_of(store.sessions, beta.workspace_id)
    ] == [
        (pks[0], "BETA-1"),
        (pks[3], "BETA-2"),
    ]
    with store.sessions() as session:
        events = session.execute(
            select(TaskEvent.workspace_id, TaskEvent.position, Task.created_by_delivery)
            .join(Task, Task.id == TaskEvent.task_id)
            .where(TaskEvent.type == EventType.CREATED.value)
            .order_by(TaskEvent.workspace_id, TaskEvent.position)
        ).all()
    assert events == [
        (acme.workspace_id, 1, None),
        (acme.workspace_id, 2, pks[1]),
        (acme.workspace_id, 3, pks[4]),
        (beta.workspace_id, 1, pks[0]),
        (beta.workspace_id, 2, pks[3]),
    ]
    assert by_hand.identifier == "ACME-1"


def test_a_group_writes_its_workspaces_row_and_stream_once(fast_path_store: Store):
    """Every create takes a number from its workspace's row and a position
    from its stream's row, and PostgreSQL keeps each update as a new version
    of the row, which each later create walks past until a vacuum
    (docs/performance.md §25): a group takes all its keys' numbers, and all
    their positions, with one write of each row."""
    store = fast_path_store
    feed = make_feed(store.sessions)
    pks = [store_github_issue(store.sessions, feed, number) for number in range(1, 5)]
    counting = [
        "CREATE TABLE row_writes (written text)",
        "CREATE FUNCTION count_row_write() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN INSERT INTO row_writes VALUES (TG_TABLE_NAME); RETURN NULL; END $$",
        *(
            f"CREATE TRIGGER counted AFTER INSERT OR UPDATE ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION count_row_write()"
            for table in ("workspaces", "event_streams")
        ),
    ]
    with store.engine.begin() as connection:
        for statement in counting:
            connection.exec_driver_sql(statement)
    try:
        processed = run_message(store, pks)
        with store.engine.connect() as connection:
            written = connection.exec_driver_sql(
                "SELECT written, count(*) FROM row_writes GROUP BY written ORDER BY written"
            ).all()
    finally:
        with store.engine.begin() as connection:
            connection.exec_driver_sql("DROP TABLE row_writes")
            connection.exec_driver_sql("DROP FUNCTION count_row_write() CASCADE")

    assert [p.path for p in processed] == ["batch"] * 4
    assert_created_and_settled(store, feed, pks)
    assert written == [("event_streams", 1), ("workspaces", 1)]


def test_a_message_of_one_key_runs_it_alone(store: Store):
    feed = make_feed(store.sessions)
    pk = store_github_issue(store.sessions, feed, 1)

    (processed,) = run_message(store, [pk])

    assert processed.path == ("fast" if store.takes_fast_path else "general")


def test_behind_pgbouncer_a_messages_keys_run_alone_on_postgresql(
    store: Store, groups: list[tuple[list[int], str]]
):
    """A group prepares its statements, which a session behind PgBouncer
    would not keep: there each key runs alone (SQLite has no pooler)."""
    feed = make_feed(store.sessions)
    pks = [store_github_issue(store.sessions, feed, number) for number in (1, 2)]
    behind = BATCH_SETTINGS.model_copy(update={"database_pooler": "pgbouncer"})

    processed = run_message(store, pks, settings=behind)

    assert [answer(p)[:2] for p in processed] == [(DeliveryStatus.DONE, "created")] * 2
    if not store.takes_fast_path:
        assert {p.path for p in processed} == {"general"}
    elif store.dialect == "sqlite":
        assert {p.path for p in processed} == {"batch"}
    else:
        assert {p.path for p in processed} == {"fast"} and groups == []


def mixed_message(store: Store, slug: str) -> tuple[Feed, list[int]]:
    """A message of every kind of key, in a workspace of its own: plain ones
    and, between them, keys the general path decides or nobody runs."""
    feed = make_feed(store.sessions, slug, slug.upper())
    plain = store_github_issue(store.sessions, feed, 1)
    no_draft = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud", read=False)
    held_by_hand(store, feed, 3, title="made by hand")  # its identity held by a REST create
    found = store_github_issue(store.sessions, feed, 3)
    finished = store_github_issue(store.sessions, feed, 4)
    run(store, finished, settings=BATCH_SETTINGS)
    leased = store_github_issue(store.sessions, feed, 5)
    with session_scope(store.sessions) as session:  # another worker's live lease
        claim(session=session, delivery_pk=leased, lease_seconds=60)
    same_issue = store_github_issue(store.sessions, feed, 1)  # the plain key's, again
    lost = store_github_issue(store.sessions, feed, 7)
    for _ in range(MAX_LOST):  # each attempt's worker died
        with session_scope(store.sessions) as session:
            claim(session=session, delivery_pk=lost, lease_seconds=60)
        expire_lease(store, lost)
    jira = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud_many_fields")
    return feed, [plain, no_draft, found, finished, leased, same_issue, lost, jira]


def test_a_mixed_message_answers_each_key_as_it_would_be_answered_alone(store: Store):
    batched_feed, batched = mixed_message(store, "acme")
    alone_feed, alone = mixed_message(store, "beta")

    in_a_message = run_message(store, batched)
    one_by_one = [run(store, pk, settings=BATCH_SETTINGS) for pk in alone]

    assert [answer(p) for p in in_a_message] == [answer(p) for p in one_by_one]
    outcomes = [(p.status and p.status.value, p.outcome) for p in in_a_message]
    assert outcomes == [
        ("done", "created"),
        ("done", "created"),
        ("done", "found_settled"),
        (None, None),  # finished before
        (None, None),  # another worker holds it
        ("done", "found_settled"),  # the first key's task
        ("needs_operator", None),  # its attempts were lost
        ("done", "created"),
    ]
    if batches(store):
        assert [p.path for p in in_a_message] == [
            "batch",
            "general",
            "general",
            None,
            None,
            "general",
            None,
            "batch",
        ]

    def held(feed: Feed) -> set[tuple[str, bool]]:
        return {
            (t.external_id, t.external_id_settled_at is not None)
            for t in tasks_of(store.sessions, feed.workspace_id)
        }

    assert held(batched_feed) == held(alone_feed)
    assert all(settled for _, settled in held(batched_feed))


@pytest.fixture
def blind_lookup(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The fast lookup misses every holder, in the tasks and in the
    identity ledger, as a lookup that lost a race to a rival's insert would:
    only the unique index finds it."""
    holds = fastpath.holds_identity
    monkeypatch.setattr(fastpath, "holds_identity", lambda *held: (*holds(*held), false()))
    monkeypatch.setattr(fastpath, "unknown_to_the_ledger", lambda *names: true())
    fastpath._sqlite_statements.cache_clear()
    fastpath._claim_and_insert.cache_clear()
    yield
    monkeypatch.undo()
    fastpath._sqlite_statements.cache_clear()
    fastpath._claim_and_insert.cache_clear()


def test_a_key_that_loses_the_race_in_the_claims_sends_each_key_alone(
    store: Store, blind_lookup: None
):
    feed = make_feed(store.sessions)
    rival = held_by_hand(store, feed, 2, title="rival")
    first, losing, last = (store_github_issue(store.sessions, feed, n) for n in (1, 2, 3))

    processed = run_message(store, [first, losing, last])

    assert [(p.status, p.outcome) for p in processed] == [
        (DeliveryStatus.DONE, "created"),
        (DeliveryStatus.DONE, "found_settled"),
        (DeliveryStatus.DONE, "created"),
    ]
    assert processed[1].task_id == rival.id
    tasks = tasks_of(store.sessions, feed.workspace_id)
    assert len(tasks) == 3 and len({t.external_id for t in tasks}) == 3
    # The rolled-back group spent no identifier: the rival's and the two creates'.
    assert [t.identifier for t in tasks] == ["ACME-1", "ACME-2", "ACME-3"]
    assert "batch" not in {p.path for p in processed}  # each key claimed alone
    assert delivery(store.sessions, first).attempts == 1  # the group's claim left no attempt


def release(store: Store, task: Task) -> None:
    with session_scope(store.sessions) as session:
        session.execute(
            update(Task)
            .where(Task.id == task.id)
            .values(external_id=None, external_id_settled_at=None)
        )


def delete(store: Store, task: Task) -> None:
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=task.id)


def take_over(store: Store, task: Task) -> None:
    with session_scope(store.sessions) as session:
        session.execute(
            update(Delivery)
            .where(Delivery.id == task.created_by_delivery)
            .values(attempts=Delivery.attempts + 1)
        )


@pytest.mark.parametrize("meanwhile", [release, delete, take_over], ids=lambda f: f.__name__)
def test_a_key_changed_between_the_insert_and_the_settlement_answers_as_alone(
    store: Store, meanwhile: Callable[[Store, Task], None]
):
    """The middle key's task is released, deleted or its delivery taken over
    after the inserts committed: that key answers as it would alone, and its
    neighbours are created and settled."""
    feed = make_feed(store.sessions)
    pks = [store_github_issue(store.sessions, feed, n) for n in (1, 2, 3)]
    alone_feed = make_feed(store.sessions, "beta", "BETA")
    alone_pk = store_github_issue(store.sessions, alone_feed, 2)

    def for_the_middle_key(task: Task) -> None:
        if task.created_by_delivery in (pks[1], alone_pk):
            meanwhile(store, task)

    seams = Seams(after_insert=for_the_middle_key)
    first, middle, last = run_message(store, pks, seams=seams)
    alone = run(store, alone_pk, settings=BATCH_SETTINGS, seams=seams)

    # The same answer, but for the task's identifier (ACME-2 here, BETA-1 there).
    assert answer(middle)[:2] == answer(alone)[:2]
    assert (middle.reason or "").replace("ACME-2", "BETA-1") == (alone.reason or "")
    assert [answer(p)[:2] for p in (first, last)] == [(DeliveryStatus.DONE, "created")] * 2

    def settled_by(pk: int) -> bool | None:
        """Whether the key's task holds its identity settled; None: no task."""
        tasks = tasks_of(store.sessions, feed.workspace_id) + tasks_of(
            store.sessions, alone_feed.workspace_id
        )
        mine = [t for t in tasks if t.created_by_delivery == pk]
        return bool(mine[0].external_id and mine[0].external_id_settled_at) if mine else None

    assert [settled_by(pk) for pk in pks] == [True, settled_by(alone_pk), True]
    assert delivery(store.sessions, pks[1]).status == delivery(store.sessions, alone_pk).status
    if batches(store):
        assert [p.path for p in (first, middle, last)] == ["batch"] * 3


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, int], None]:
    """Arm fail point ``name`` to kill the worker (a :class:`Crash`) when it
    is reached for ``delivery``."""

    def arm(name: str, target: int) -> None:
        def crash(delivery_pk: int | None) -> None:
            if delivery_pk == target:
                raise Crash(f"{name} of delivery {delivery_pk}")

        monkeypatch.setattr(failpoints, "_ACTIONS", {name: crash})

    return arm


@pytest.fixture
def worker_runtime(store: Store) -> Iterator[None]:
    """The Celery task bodies' runtime, on the store."""
    runtime.use(sessions=store.sessions, settings=store.worker_settings(BATCH_SETTINGS))
    try:
        yield
    finally:
        runtime.reset()


@pytest.mark.parametrize("resent", ["message", "each-key"])
@pytest.mark.parametrize("point", [AFTER_INSERT, BEFORE_SETTLE, AFTER_SETTLE, BEFORE_ACK])
def test_a_crash_at_any_point_of_a_message_is_finished_by_its_next_attempts(
    store: Store,
    worker_runtime: None,
    crash_at: Callable[[str, int], None],
    monkeypatch: pytest.MonkeyPatch,
    point: str,
    resent: str,
):
    feed = make_feed(store.sessions)
    pks = [store_github_issue(store.sessions, feed, n) for n in (1, 2, 3)]
    crash_at(point, pks[1])

    with pytest.raises(Crash):
        worker.tasks.process_deliveries(pks)

    tasks = tasks_of(store.sessions, feed.workspace_id)
    if batches(store) and point in (AFTER_INSERT, BEFORE_SETTLE):
        # Every key's insert committed with the group's; none settled.
        assert [t.created_by_delivery for t in tasks] == pks
        assert all(t.external_id_settled_at is None for t in tasks)
        assert {delivery(store.sessions, pk).status for pk in pks} == {"processing"}
    monkeypatch.setattr(failpoints, "_ACTIONS", {})
    for pk in pks:  # the dead worker's leases run out
        expire_lease(store, pk)
    if resent == "message":  # the broker gives the message back whole
        worker.tasks.process_deliveries(pks)
    else:  # the sweeper sends each unfinished key on its own
        for pk in pks:
            worker.tasks.process_delivery(pk)

    assert_created_and_settled(store, feed, pks)


def test_an_error_in_one_keys_claim_holds_up_no_other_key(
    store: Store, worker_runtime: None, monkeypatch: pytest.MonkeyPatch
):
    """The batch's version of a key that fails before its claim: the group's
    claims roll back, each key claims alone, and only the failing one is left
    queued for the sweeper."""
    feed = make_feed(store.sessions)
    broken, fine = (store_github_issue(store.sessions, feed, n) for n in (1, 2))
    claim_one, claim_sqlite = processing.fast.claim_alone, fastpath.SQLiteFastPath._claim_and_insert

    def failing_for_one(claim_it):
        def claim(*args, **kwargs):
            run = args[0] if isinstance(args[0], processing.attempt.Run) else None
            if broken in args or (run is not None and run.delivery_pk == broken):
                raise RuntimeError("the pool is gone")
            return claim_it(*args, **kwargs)

        return claim

    monkeypatch.setattr(processing.fast, "claim_alone", failing_for_one(claim_one))
    monkeypatch.setattr(fastpath.SQLiteFastPath, "_claim_and_insert", failing_for_one(claim_sqlite))
    execute = fastpath._Statement.execute

    def failing_in_the_database(statement, connection, **values):
        if broken in values.get("deliveries", ()):  # PostgreSQL's group: an error mid-query
            return "SELECT 1 / 0"
        return execute(statement, connection, **values)

    monkeypatch.setattr(fastpath._Statement, "execute", failing_in_the_database)

    with pytest.raises(RuntimeError, match="the pool is gone"):
        worker.tasks.process_deliveries([broken, fine])

    assert delivery(store.sessions, fine).outcome == "created"
    assert delivery(store.sessions, fine).attempts == 1  # the group's claim rolled back
    assert delivery(store.sessions, broken).status == "queued"
    assert [t.created_by_delivery for t in tasks_of(store.sessions, feed.workspace_id)] == [fine]


def at_once(store: Store, start: threading.Barrier, keys: list[int]) -> list:
    start.wait()
    return run_message(store, keys)


def test_two_messages_sharing_keys_at_once_each_create_once(
    store: Store, caplog: pytest.LogCaptureFixture
):
    """A message and another holding the same keys in the opposite order (a
    resend, a redelivery) run at once: each key is created once, and where
    the keys share their transactions the groups queue on the store's locks
    instead of failing over to one key at a time."""
    feed = make_feed(store.sessions)
    caplog.set_level(logging.INFO, logger="worker.processing")
    for round_ in range(5):
        pks = [store_github_issue(store.sessions, feed, 10 * round_ + n) for n in range(1, 7)]
        start = threading.Barrier(2)
        with ThreadPoolExecutor(max_workers=2) as pool:
            answers = list(pool.map(partial(at_once, store, start), [pks, pks[::-1]]))

        for processed in answers[0] + answers[1]:
            assert isinstance(processed, Processed), processed
        created = [p for p in answers[0] + answers[1] if p.outcome == "created"]
        assert sorted(p.delivery_pk for p in created) == sorted(pks)
    tasks = tasks_of(store.sessions, feed.workspace_id)
    assert len(tasks) == 30
    assert_created_and_settled(store, feed, [t.created_by_delivery for t in tasks])
    fell_back = [r.getMessage() for r in caplog.records if "one at a time" in r.getMessage()]
    assert fell_back == []
