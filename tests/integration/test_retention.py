"""The inbox's retention policy (models/retention.py), on SQLite and PostgreSQL:
what is dropped, deleted and kept, by status and age; show, replay and
explain on a dropped body; batches; the dry run; the settings;
``taskhook deliveries prune`` and the disk use in ``taskhook stats``. A late
redelivery through the real ingress: tests/integration/ingest/
test_retention_redelivery.py; the worker and the beat task:
tests/integration/worker/test_retention_tasks.py."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from click.testing import CliRunner, Result
from pydantic import ValidationError
from sqlalchemy import event, select, update

from models import retention
from models.db import session_scope
from models.errors import NotReplayable
from models.inbox import DeliveryStatus, IncomingDelivery, record_delivery, replay
from models.reports import inbox_disk_use, show_delivery
from models.retention import NEVER_TOUCHED, Policy, plan, prune
from models.settings import Settings
from models.tables import Delivery, IdentityRelease, Task, TaskEvent, utcnow
from tests.support.cli import as_json, refused, taskhook
from tests.support.scenarios import (
    EXTERNAL_ID,
    a_delivery,
    a_source,
    create_by,
    release,
)
from tests.support.stores import Store
from worker.cli import cli

POLICY = Policy(body_days=30, row_days=90, batch=1000, pause_seconds=0)
DAY = timedelta(days=1)


def aged(store: Store, pk: int, status: str, age: timedelta, now: datetime) -> int:
    """Put delivery ``pk`` in ``status``, last changed ``age`` before ``now``."""
    with session_scope(store.sessions) as session:
        session.execute(
            update(Delivery)
            .where(Delivery.id == pk)
            .values(status=status, updated_at=now - age, received_at=now - age)
        )
    return pk


def row(store: Store, pk: int) -> Delivery | None:
    with store.sessions() as session:
        return session.get(Delivery, pk)


def pruned(store: Store, policy: Policy = POLICY, now: datetime | None = None, **options):
    with session_scope(store.sessions) as session:
        return prune(session=session, policy=policy, now=now, **options)


@pytest.fixture
def source(store: Store) -> int:
    return a_source(store, store.workspace().id)


# --- what goes, what stays ------------------------------------------------------------


def test_bodies_are_dropped_and_rows_deleted_by_status_and_age(store: Store, source: int):
    now = utcnow()
    rows = {
        (status.value, days): aged(
            store,
            a_delivery(store, source, f"{status.value}-{days}"),
            status.value,
            days * DAY,
            now,
        )
        for status in DeliveryStatus
        for days in (10, 45, 120)
    }
    bodies = {key: row(store, pk).body for key, pk in rows.items()}

    done = pruned(store, now=now)

    assert done.deleted == {"done": 1, "ignored": 1, "replay": 1, "mismatch": 1}
    assert done.dropped == {"done": 1, "ignored": 1}
    for (status, days), pk in rows.items():
        found = row(store, pk)
        if status in NEVER_TOUCHED:
            # queued, processing, needs_operator, dead: whatever their age.
            assert (found.body, found.body_dropped_at) == (bodies[status, days], None)
        elif days == 120:
            assert found is None, (status, days)
        elif days == 45 and status in ("done", "ignored"):
            assert (found.body, found.body_dropped_at) == (b"", now), status
            # What a redelivery is compared on stays, and so does the status.
            assert (found.status, found.delivery_id) == (status, f"{status}-{days}")
            assert found.body_sha256 and found.draft_title is None
        else:
            assert (found.body, found.body_dropped_at) == (bodies[status, days], None)
    assert {"queued", "processing", "needs_operator", "dead"} == NEVER_TOUCHED


def test_tasks_their_events_and_releases_outlive_the_deliveries(store: Store, source: int):
    workspace = store.workspace("globex", "GLX")
    creator = a_delivery(store, source, "d-creates")
    task_id = create_by(store, workspace.id, creator)
    release(store, workspace.id)
    now = utcnow()
    aged(store, creator, "done", 120 * DAY, now)
    events = store.scalar("SELECT count(*) FROM task_events")

    assert pruned(store, now=now).deleted == {"done": 1}

    assert row(store, creator) is None
    with store.sessions() as session:
        task = session.get(Task, task_id)
        assert task.created_by_delivery == creator  # a plain integer: nothing cascaded
        assert session.scalar(select(IdentityRelease.task_id)) == task_id
        assert len(session.scalars(select(TaskEvent)).all()) == events > 0


@pytest.mark.parametrize(
    ("age", "dropped", "deleted"),
    [
        (30 * DAY, False, False),  # exactly the age: not older than it
        (30 * DAY + timedelta(seconds=1), True, False),
        (90 * DAY, True, False),
        (90 * DAY + timedelta(seconds=1), False, True),
    ],
)
def test_the_ages_are_strict_at_the_boundaries(store: Store, source, age, dropped, deleted):
    now = utcnow()
    pk = aged(store, a_delivery(store, source, "d-1"), "done", age, now)

    pruned(store, now=now)

    found = row(store, pk)
    assert (found is None) is deleted
    if not deleted:
        assert (found.body_dropped_at is not None) is dropped


def test_zero_days_turns_each_rule_off(store: Store, source: int):
    now = utcnow()
    old = aged(store, a_delivery(store, source, "old"), "done", 400 * DAY, now)
    middle = aged(store, a_delivery(store, source, "middle"), "done", 45 * DAY, now)

    assert pruned(store, Policy(body_days=0, row_days=0), now=now).batches == 0
    assert row(store, old).body_dropped_at is None

    # Bodies only: nothing deleted, however old.
    assert pruned(store, Policy(body_days=30, row_days=0), now=now).dropped == {"done": 2}
    assert row(store, old) is not None
    # Rows only.
    kept = aged(store, a_delivery(store, source, "kept"), "done", 45 * DAY, now)
    assert pruned(store, Policy(body_days=0, row_days=90), now=now).deleted == {"done": 1}
    assert row(store, old) is None
    assert row(store, kept).body_dropped_at is None
    assert row(store, middle) is not None


def test_a_second_prune_starts_after_the_bodies_already_dropped(store: Store, source: int):
    now = utcnow()
    for number in range(3):
        aged(store, a_delivery(store, source, f"d-{number}"), "done", (40 + number) * DAY, now)
    assert pruned(store, now=now).dropped == {"done": 3}

    assert pruned(store, now=now).batches == 0
    # A week on, a row that was young then is old enough now.
    young = aged(store, a_delivery(store, source, "young"), "done", 25 * DAY, now)
    later = now + 7 * DAY
    assert pruned(store, now=later).dropped == {"done": 1}
    assert row(store, young).body_dropped_at == later


# --- batches -----------------------------------------------------------------------------


@pytest.fixture
def writes(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Each batch's write: how many keys it named, and how many transactions
    had committed on the store when it ran."""
    commits: list[int] = []
    event.listen(store.engine, "commit", lambda conn: commits.append(1))
    seen: list[tuple[int, int]] = []
    write = retention._write

    def counted(action, where, pks, now):
        seen.append((len(pks), len(commits)))
        return write(action, where, pks, now)

    monkeypatch.setattr(retention, "_write", counted)
    return seen


@pytest.mark.parametrize("age", [45 * DAY, 120 * DAY], ids=["dropping", "deleting"])
def test_a_batch_of_two_over_five_rows_takes_three_transactions(store, source, writes, age):
    now = utcnow()
    pks = [
        aged(store, a_delivery(store, source, f"d-{n}"), "done", age + n * DAY, now)
        for n in range(5)
    ]
    pauses: list[float] = []

    # pace=0: the pause is the policy's alone, not stretched by a batch that
    # took long on a loaded machine (the pace's own test is below).
    policy = Policy(30, 90, batch=2, pause_seconds=0.25, pace=0)
    done = pruned(store, policy, now=now, sleep=pauses.append)

    assert done.batches == 3
    assert [size for size, _ in writes] == [2, 2, 1]
    # Each in a transaction of its own: one commit between two writes.
    first = writes[0][1]
    assert [committed - first for _, committed in writes] == [0, 1, 2]
    assert pauses == [0.25, 0.25]  # between two batches, never before the first
    assert sum((done.dropped | done.deleted).values()) == 5
    # The oldest first.
    if age > 90 * DAY:
        assert all(row(store, pk) is None for pk in pks)


def test_a_prune_stops_at_its_budget_and_says_more_is_left(store: Store, source: int):
    now = utcnow()
    for number in range(5):
        aged(store, a_delivery(store, source, f"d-{number}"), "done", 120 * DAY, now)
    slept: list[float] = []
    policy = Policy(30, 90, batch=2, pause_seconds=1, pace=0)

    done = pruned(
        store, policy, now=now, budget_seconds=1.5, sleep=slept.append, clock=lambda: sum(slept)
    )

    assert (done.batches, done.deleted, done.finished) == (2, {"done": 4}, False)
    again = pruned(store, policy, now=now, sleep=slept.append)
    assert (again.deleted, again.finished) == ({"done": 1}, True)


def test_the_pause_grows_with_the_batch_it_follows(store: Store, source: int):
    """A slow batch (a busy database) is followed by a longer pause: the prune
    works at most 1 / (1 + pace) of the time."""
    now = utcnow()
    for number in range(3):
        aged(store, a_delivery(store, source, f"d-{number}"), "done", 120 * DAY, now)
    ticks = iter(range(0, 1000, 2))  # every reading of the clock: 2 s later
    slept: list[float] = []

    pruned(
        store,
        Policy(30, 90, batch=1, pause_seconds=0.5, pace=9),
        now=now,
        sleep=slept.append,
        clock=lambda: next(ticks),
    )

    # 9 x the 2 s each full batch took, not the 0.5 s floor; the last one before
    # the look that finds nothing more.
    assert slept == [18, 18, 18]


@pytest.mark.postgres
def test_a_row_that_changed_since_it_was_chosen_is_left_alone(postgres_store: Store):
    """The batch's statement checks the conditions again, by key. (PostgreSQL:
    on SQLite, with one writer, nothing changes a row between the two.)"""
    store = postgres_store
    source = a_source(store, store.workspace().id)
    now = utcnow()
    pk = aged(store, a_delivery(store, source, "d-1"), "done", 45 * DAY, now)
    changed: list[int] = []

    def replayed_meanwhile(conn, cursor, statement, *args):
        choosing = statement.lstrip().startswith("SELECT deliveries.id")
        if choosing and "body_dropped_at IS NULL" in statement and not changed:
            changed.append(pk)
            with store.engine.connect() as other, other.begin():
                other.execute(update(Delivery).where(Delivery.id == pk).values(status="queued"))

    event.listen(store.engine, "after_cursor_execute", replayed_meanwhile)
    done = pruned(store, now=now)
    event.remove(store.engine, "after_cursor_execute", replayed_meanwhile)

    assert done.dropped == {}
    assert (row(store, pk).status, row(store, pk).body_dropped_at) == ("queued", None)


def explained(store: Store, statement) -> str:
    """The database's plan of ``statement`` (PostgreSQL's without sequential
    scans where an index serves: the test tables are too small to choose one)."""
    sql = str(statement.compile(store.engine, compile_kwargs={"literal_binds": True}))
    with store.engine.begin() as connection:
        if store.dialect == "postgresql":
            connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
            return "\n".join(connection.exec_driver_sql(f"EXPLAIN {sql}").scalars())
        return "\n".join(row[-1] for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))


def test_every_batch_and_every_probe_are_found_through_an_index(store: Store):
    now = utcnow()
    choose_deleted = retention._rows_to_delete("done", now - 90 * DAY)
    choose_dropped = retention._bodies_to_drop("done", now - 30 * DAY, now - 60 * DAY)
    for where in (choose_deleted, choose_dropped):
        plan_of = explained(
            store, select(Delivery.id).where(where).order_by(Delivery.updated_at).limit(1000)
        )
        assert "ix_deliveries_status_updated_at" in plan_of, plan_of
        assert "Sort" not in plan_of and "TEMP B-TREE" not in plan_of, plan_of
    # A probe of the bisection for where the dropped bodies end.
    probe = (
        select(Delivery.updated_at, Delivery.body_dropped_at.is_not(None))
        .where(
            Delivery.status == "done",
            Delivery.updated_at < now - 30 * DAY,
            Delivery.updated_at >= now - 45 * DAY,
        )
        .order_by(Delivery.updated_at)
        .limit(1)
    )
    assert "ix_deliveries_status_updated_at" in explained(store, probe)


def test_the_next_prune_starts_where_the_dropped_bodies_end(store: Store, source: int):
    """Found by bisection, within a second, however many bodies were dropped."""
    now = utcnow()
    pks = [
        aged(store, a_delivery(store, source, f"d-{n}"), "done", 89 * DAY - n * 3 * DAY, now)
        for n in range(20)
    ]
    # Bodies of the oldest 12 dropped (89 .. 56 days old), the others kept.
    pruned(store, Policy(55, 90, pause_seconds=0), now=now)
    assert [row(store, pk).body_dropped_at is not None for pk in pks] == [True] * 12 + [False] * 8

    with store.sessions() as session:
        start = retention._drop_from(session, "done", now - 90 * DAY, now - 30 * DAY)
    newest_dropped, oldest_kept = row(store, pks[11]).updated_at, row(store, pks[12]).updated_at
    assert newest_dropped <= start <= oldest_kept
    assert start - newest_dropped <= timedelta(seconds=1)
    # And when nothing is left before the cutoff, nothing is read.
    with store.sessions() as session:
        assert retention._drop_from(session, "ignored", None, now) == now


# --- the dry run ------------------------------------------------------------------------


def test_the_plan_says_what_would_go_by_status_and_event_and_changes_nothing(store, source):
    now = utcnow()
    aged(store, a_delivery(store, source, "a"), "done", 45 * DAY, now)
    aged(store, a_delivery(store, source, "b"), "ignored", 120 * DAY, now)
    aged(store, a_delivery(store, source, "c"), "dead", 400 * DAY, now)
    before = store.scalar("SELECT count(*) FROM deliveries WHERE body_dropped_at IS NULL")

    with store.sessions() as session:
        lines = plan(session=session, policy=POLICY, now=now)

    assert [(line.action, line.status, line.event, line.rows) for line in lines] == [
        ("delete row", "ignored", "issues.opened", 1),
        ("drop body", "done", "issues.opened", 1),
    ]
    assert all(line.body_bytes > 0 for line in lines)
    assert store.scalar("SELECT count(*) FROM deliveries WHERE body_dropped_at IS NULL") == before
    assert store.scalar("SELECT count(*) FROM deliveries") == 3


# --- a dropped body: redelivery, show, replay, explain --------------------------------------


def test_a_redelivery_whose_row_vanished_between_two_statements_is_stored_anew(store, source):
    """The retention policy may delete a row between the ingress's insert (which
    found it) and its read of it: the id is free, and the insert runs again."""
    pk = a_delivery(store, source, "d-1")
    stored = row(store, pk)
    incoming = IncomingDelivery(
        source_id=source,
        delivery_id="d-1",
        body=stored.body,
        event="issues.opened",
        action="opened",
        headers={},
        content_type="application/json",
    )

    deleted: list[int] = []

    def deleted_meanwhile(conn, cursor, statement, *args):
        if statement.lstrip().startswith("INSERT INTO deliveries") and not deleted:
            deleted.append(pk)
            cursor.connection.cursor().execute(f"DELETE FROM deliveries WHERE id = {pk}")

    event.listen(store.engine, "after_cursor_execute", deleted_meanwhile)
    with session_scope(store.sessions) as session:
        recorded = record_delivery(session=session, incoming=incoming)
    event.remove(store.engine, "after_cursor_execute", deleted_meanwhile)

    assert recorded.is_new and recorded.pk != pk
    assert row(store, recorded.pk).delivery_id == "d-1"


def a_dropped_delivery(store: Store, source: int, status: str = "done") -> int:
    now = utcnow()
    pk = aged(store, a_delivery(store, source, "d-dropped"), "done", 45 * DAY, now)
    assert pruned(store, now=now).dropped == {"done": 1}
    if status != "done":
        with session_scope(store.sessions) as session:
            session.execute(update(Delivery).where(Delivery.id == pk).values(status=status))
    return pk


def test_show_says_the_body_was_dropped_and_by_whom(store: Store, source: int):
    pk = a_dropped_delivery(store, source)

    with store.sessions() as session:
        detail = show_delivery(session=session, delivery_pk=pk)
    text = taskhook(store, "deliveries", "show", str(pk)).stdout
    document = as_json(taskhook(store, "deliveries", "show", str(pk), "--json"))

    assert detail.body_bytes == 0
    assert detail.body_dropped == "body dropped after 45 days by the retention policy"
    assert "body dropped after 45 days by the retention policy (on " in text
    assert f"it had sha256 {detail.body_sha256}" in text
    assert document["body_dropped"] == detail.body_dropped
    assert document["summary"]["body_dropped_at"] is not None


@pytest.mark.parametrize("status", ["done", "dead"])
def test_a_replay_of_a_dropped_body_is_refused_saying_why(store: Store, source: int, status):
    pk = a_dropped_delivery(store, source, status)

    with pytest.raises(NotReplayable) as refusal, session_scope(store.sessions) as session:
        replay(session=session, delivery_pk=pk)
    line = refused(taskhook(store, "deliveries", "replay", str(pk)))

    assert str(refusal.value) == line.removeprefix("Error: ")
    assert line == (
        f"Error: delivery {pk} cannot be replayed: body dropped after 45 days by the "
        "retention policy, only its record is kept"
    )
    assert row(store, pk).status == status


def test_explain_shows_the_drop_and_survives_the_deletion(store: Store, source: int):
    workspace_id = store.scalar("SELECT id FROM workspaces WHERE slug = 'acme'")
    creator = a_delivery(store, source, "d-creates")
    create_by(store, workspace_id, creator)
    now = utcnow()
    aged(store, creator, "done", 45 * DAY, now)
    pruned(store, now=now)

    text = taskhook(store, "explain", "--workspace", "acme", EXTERNAL_ID).stdout
    assert f"delivery {creator} body dropped" in text
    assert "body dropped after 45 days by the retention policy" in text

    pruned(store, now=now + 60 * DAY)
    assert row(store, creator) is None
    after = taskhook(store, "explain", "--workspace", "acme", EXTERNAL_ID)
    assert after.exit_code == 0
    assert "task ACME-1 created" in after.stdout
    assert f"delivery {creator}" not in after.stdout.replace(f"by delivery {creator}", "")


# --- settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"body_retention_days": 100, "inbox_retention_days": 90},
            "TASKHOOK_BODY_RETENTION_DAYS (100) must not exceed TASKHOOK_INBOX_RETENTION_DAYS (90)",
        ),
        (
            {"inbox_retention_days": 5, "body_retention_days": 1},
            "TASKHOOK_INBOX_RETENTION_DAYS is 5: it must be 0 (never delete) or at least 8",
        ),
        ({"body_retention_days": -1}, "greater than or equal to 0"),
        ({"retention_batch": 0}, "greater than or equal to 1"),
        ({"retention_interval_seconds": -1}, "greater than or equal to 0"),
    ],
)
def test_incoherent_retention_settings_are_refused(values, message):
    with pytest.raises(ValidationError) as refusal:
        Settings(**values)
    assert message in str(refusal.value)


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"body_retention_days": 0, "inbox_retention_days": 0},
        {"body_retention_days": 400, "inbox_retention_days": 0},  # rows kept: any body age
        {"body_retention_days": 0, "inbox_retention_days": 8},
        {"body_retention_days": 90, "inbox_retention_days": 90},
    ],
)
def test_coherent_retention_settings_are_taken(values):
    settings = Settings(**values)
    assert (settings.body_retention_days, settings.inbox_retention_days) == (
        values.get("body_retention_days", 30),
        values.get("inbox_retention_days", 90),
    )
    assert settings.retention_interval_seconds == 3600


def cli_with(store: Store, env: dict[str, str], *args: str) -> Result:
    runner = CliRunner(env={"TASKHOOK_DATABASE_URL": store.url, **env})
    return runner.invoke(cli, list(args))


def test_the_cli_refuses_incoherent_settings_in_one_line(store: Store):
    result = cli_with(
        store,
        {"TASKHOOK_BODY_RETENTION_DAYS": "120", "TASKHOOK_INBOX_RETENTION_DAYS": "90"},
        "deliveries",
        "prune",
    )
    line = refused(result)
    assert line.startswith("Error: TASKHOOK_BODY_RETENTION_DAYS (120) must not exceed")


# --- the command ------------------------------------------------------------------------------


def test_prune_says_what_goes_then_does_it(store: Store, source: int):
    now = utcnow()
    dropped = aged(store, a_delivery(store, source, "a"), "done", 45 * DAY, now)
    deleted = aged(store, a_delivery(store, source, "b"), "ignored", 120 * DAY, now)
    parked = aged(store, a_delivery(store, source, "c"), "needs_operator", 400 * DAY, now)

    dry = taskhook(store, "deliveries", "prune", "--dry-run")
    assert dry.exit_code == 0
    assert dry.stdout.splitlines()[0] == (
        "Retention: bodies of done and ignored deliveries are dropped after 30 days; "
        "finished rows are deleted after 90 days."
    )
    assert "delete row  ignored  issues.opened  1" in dry.stdout
    assert "drop body   done     issues.opened  1" in dry.stdout
    assert "Dry run: nothing changed (2 rows would be pruned)." in dry.stdout
    assert row(store, deleted) is not None and row(store, dropped).body_dropped_at is None

    done = taskhook(store, "deliveries", "prune")
    assert done.exit_code == 0
    assert "Deleted 1 rows and dropped 1 bodies (" in done.stdout
    assert "in 2 batches of at most 1000" in done.stdout
    assert row(store, deleted) is None and row(store, dropped).body_dropped_at is not None
    assert row(store, parked).body_dropped_at is None

    again = taskhook(store, "deliveries", "prune")
    assert "Nothing to prune." in again.stdout


def test_prune_for_scripts(store: Store, source: int):
    now = utcnow()
    aged(store, a_delivery(store, source, "a"), "done", 45 * DAY, now)

    dry = as_json(taskhook(store, "deliveries", "prune", "--dry-run", "--json"))
    assert dry["dry_run"] is True and dry["pruned"] is None
    assert dry["policy"] == {"body_retention_days": 30, "inbox_retention_days": 90}
    (line,) = dry["plan"]
    assert line["action"] == "drop body" and line["rows"] == 1

    done = as_json(taskhook(store, "deliveries", "prune", "--json"))
    assert done["pruned"]["dropped"] == {"done": 1}
    assert done["pruned"]["batches"] == 1 and done["pruned"]["finished"] is True
    assert done["pruned"]["body_bytes"] == line["body_bytes"]


# --- disk use ------------------------------------------------------------------------------


def test_disk_use_counts_the_bodies_and_measures_the_store(store: Store, source: int):
    pks = [a_delivery(store, source, f"d-{n}") for n in range(3)]
    sizes = [len(row(store, pk).body) for pk in pks]
    now = utcnow()
    aged(store, pks[0], "done", 45 * DAY, now)
    pruned(store, now=now)

    with store.sessions() as session:
        use = inbox_disk_use(session=session)
        cheap = inbox_disk_use(session=session, count_bodies=False)

    assert (use.rows, use.body_bytes, use.bodies_dropped) == (3, sum(sizes[1:]), 1)
    assert use.storage_bytes > 0
    assert (cheap.body_bytes, cheap.rows, cheap.bodies_dropped) == (None, None, None)
    if store.dialect == "postgresql":
        assert use.storage == "the deliveries table, its TOAST and its indexes"
        assert use.free_bytes is None
    else:
        assert use.storage == "the SQLite database file (every table)"
        assert use.free_bytes is not None

    text = taskhook(store, "stats").stdout
    assert f"Disk: {sum(sizes[1:])} bytes of bodies in 3 rows (1 bodies dropped); " in text
    assert "Retention: bodies of done and ignored deliveries are dropped after 30 days" in text
    document = json.loads(taskhook(store, "stats", "--json").stdout)
    assert document["disk"]["bodies_dropped"] == 1
    assert document["disk"]["storage_bytes"] > 0
