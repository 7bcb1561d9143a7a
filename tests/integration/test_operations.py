"""The console's delivery filter, the bulk replay's dry run and run (which
leave out, unless named, a delivery whose task was deleted before its
creation settled), and the operations history (``models.operations``), on
both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select, update

from models.db import session_scope
from models.errors import InvalidFilter, InvalidOperation, NotReplayable, OperationNotFound
from models.inbox import DeliveryStatus, IncomingDelivery, record_delivery, replay_delivery
from models.operations import (
    BULK_REPLAY,
    MAX_SEARCH_LENGTH,
    DeliveryFilter,
    ReplayCount,
    bulk_replay,
    checked_named,
    count_replayable,
    get_operation,
    list_operations,
)
from models.reports import list_deliveries
from models.tables import Delivery, Operation, utcnow
from tests.support.feeds import delivery, make_feed, store_fixture, tasks_of
from tests.support.runs import a_create_deleted_before_it_settled
from tests.support.runs import run as process
from tests.support.scenarios import EXTERNAL_ID, a_source, create_by, settle_as
from tests.support.stores import Store

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
PARIS = timezone(timedelta(hours=1))


def stored(
    store: Store,
    source_id: int,
    delivery_id: str,
    *,
    event: str = "issues.opened",
    external_id: str | None = None,
    status: DeliveryStatus | None = None,
    received_at: datetime | None = None,
) -> int:
    """A delivery in the inbox, finished in ``status`` as the worker would."""
    incoming = IncomingDelivery(
        source_id=source_id,
        delivery_id=delivery_id,
        body=b'{"delivery": "%s"}' % delivery_id.encode(),
        event=event,
        action=event.partition(".")[2] or None,
        headers={"X-GitHub-Event": event.partition(".")[0]},
        content_type="application/json",
        external_id=external_id,
    )
    with session_scope(store.sessions) as session:
        pk = record_delivery(session=session, incoming=incoming).pk
    if status is not None:
        settle_as(store, pk, status, reason="for the test", error="boom")
    if received_at is not None:
        with session_scope(store.sessions) as session:
            session.execute(
                update(Delivery).where(Delivery.id == pk).values(received_at=received_at)
            )
    return pk


def matching(store: Store, filter: DeliveryFilter, **page) -> list[int]:
    with store.sessions() as session:
        return [d.id for d in list_deliveries(session=session, filter=filter, **page).deliveries]


def status_of(store: Store, pk: int) -> str:
    return store.scalar("SELECT status FROM deliveries WHERE id = :pk", pk=pk)


def drop_body(store: Store, pk: int) -> None:
    with session_scope(store.sessions) as session:
        session.execute(
            update(Delivery).where(Delivery.id == pk).values(body=b"", body_dropped_at=utcnow())
        )


@pytest.fixture
def acme(store: Store) -> int:
    return a_source(store, store.workspace("acme", "ACME").id, "acme-github")


# --- the filter ------------------------------------------------------------------------


def test_a_filter_matches_by_status_source_and_event(store: Store, acme: int):
    beta = a_source(store, store.workspace("beta", "BETA").id, "beta-github")
    dead = stored(store, acme, "d-1", status=DeliveryStatus.DEAD)
    parked = stored(store, acme, "d-2", status=DeliveryStatus.NEEDS_OPERATOR)
    edited = stored(store, acme, "d-3", event="issues.edited", status=DeliveryStatus.DEAD)
    other = stored(store, beta, "d-4", status=DeliveryStatus.DEAD)

    assert matching(store, DeliveryFilter(status="dead")) == [other, edited, dead]
    assert matching(store, DeliveryFilter(source="acme-github")) == [edited, parked, dead]
    assert matching(store, DeliveryFilter(event="issues.edited")) == [edited]
    assert matching(
        store, DeliveryFilter(status="dead", source="acme-github", event="issues.opened")
    ) == [dead]
    assert matching(store, DeliveryFilter(source="nobody")) == []


def test_a_search_matches_the_delivery_id_the_external_id_or_the_inbox_id(store: Store, acme: int):
    named = stored(store, acme, "guid-72d1", external_id="gh-issue/acme/api#7")
    creator = stored(store, acme, "guid-9f00")
    create_by(store, store.scalar("SELECT id FROM workspaces WHERE slug = 'acme'"), creator)
    unrelated = stored(store, acme, str(named))  # a delivery id made of the other's inbox id

    assert matching(store, DeliveryFilter(search="guid-72d1")) == [named]
    # Normalized as an external id is: trimmed.
    assert matching(store, DeliveryFilter(search="  gh-issue/acme/api#7 ")) == [named]
    # No external id kept on the row: the one its task holds.
    assert matching(store, DeliveryFilter(search=EXTERNAL_ID)) == [creator]
    # All digits: the inbox id too, and the delivery id that reads the same.
    assert matching(store, DeliveryFilter(search=str(named))) == [unrelated, named]
    assert matching(store, DeliveryFilter(search=str(creator))) == [creator]
    assert matching(store, DeliveryFilter(search="guid-72d")) == []
    assert matching(store, DeliveryFilter(search="99999999999999999999")) == []


def test_time_bounds_are_from_inclusive_until_exclusive(store: Store, acme: int):
    pks = [
        stored(store, acme, f"d-{n}", received_at=T0 + timedelta(minutes=10 * n)) for n in range(6)
    ]

    at = [T0 + timedelta(minutes=10 * n) for n in range(6)]
    assert matching(store, DeliveryFilter(received_from=at[2])) == pks[:1:-1]
    assert matching(store, DeliveryFilter(received_until=at[2])) == pks[1::-1]
    assert matching(store, DeliveryFilter(received_from=at[1], received_until=at[4])) == [
        pks[3],
        pks[2],
        pks[1],
    ]
    # In another zone, the same instants.
    paris = at[4].astimezone(PARIS)
    assert matching(store, DeliveryFilter(received_from=paris)) == [pks[5], pks[4]]
    assert matching(store, DeliveryFilter(received_from=at[5] + timedelta(seconds=1))) == []
    assert matching(store, DeliveryFilter(received_until=T0)) == []


def test_time_bounds_hold_for_rows_a_little_out_of_key_order(store: Store, acme: int):
    # A writer that waited for a lock stored its row after one received later.
    late = stored(store, acme, "d-late", received_at=T0 + timedelta(seconds=20))
    early = stored(store, acme, "d-early", received_at=T0 + timedelta(seconds=5))
    after = stored(store, acme, "d-after", received_at=T0 + timedelta(minutes=5))

    assert matching(store, DeliveryFilter(received_from=T0 + timedelta(seconds=10))) == [
        after,
        late,
    ]
    assert matching(store, DeliveryFilter(received_until=T0 + timedelta(seconds=10))) == [early]


def test_a_filtered_list_pages_newest_first_by_key(store: Store, acme: int):
    dead = [stored(store, acme, f"d-{n}", status=DeliveryStatus.DEAD) for n in range(5)]
    stored(store, acme, "d-done", status=DeliveryStatus.DONE)

    pages, before = [], None
    while True:
        with store.sessions() as session:
            page = list_deliveries(
                session=session, filter=DeliveryFilter(status="dead"), limit=2, before=before
            )
        pages.append([d.id for d in page.deliveries])
        if page.next_before is None:
            break
        before = page.next_before

    assert pages == [dead[:2:-1], dead[2:0:-1], dead[:1]]


def test_a_filter_sees_only_its_workspaces(store: Store, acme: int):
    beta_id = store.workspace("beta", "BETA").id
    beta = a_source(store, beta_id, "beta-github")
    mine = stored(store, acme, "d-1", external_id="gh-issue/x#1")
    theirs = stored(store, beta, "d-2", external_id="gh-issue/x#1")
    acme_id = store.scalar("SELECT id FROM workspaces WHERE slug = 'acme'")

    assert matching(store, DeliveryFilter(workspace_ids=frozenset({acme_id}))) == [mine]
    assert matching(store, DeliveryFilter(workspace_ids=frozenset({beta_id}))) == [theirs]
    assert matching(store, DeliveryFilter(workspace_ids=frozenset())) == []
    # Nothing is found beyond the scope, by any key.
    scoped = frozenset({acme_id})
    for search in ("d-2", "gh-issue/x#1", str(theirs)):
        assert theirs not in matching(store, DeliveryFilter(search=search, workspace_ids=scoped))
    assert matching(store, DeliveryFilter(source="beta-github", workspace_ids=scoped)) == []


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"status": "lost"}, "unknown status 'lost'"),
        (
            {"received_from": T0, "received_until": T0},
            "received_from must be before received_until",
        ),
        ({"received_from": datetime(2026, 12, 1)}, "received_from must say its time zone"),
        ({"search": "x" * (MAX_SEARCH_LENGTH + 1)}, "search must be at most 300 characters"),
        ({"search": "a\nb"}, "search must be one line without control characters"),
        ({"source": 12}, "source must be text"),
    ],
)
def test_a_wrong_filter_is_refused_saying_why(given, message):
    with pytest.raises(InvalidFilter, match=message):
        DeliveryFilter(**given)


def test_criteria_are_json_without_the_scope_and_rebuild_the_filter():
    given = DeliveryFilter(
        status="dead",
        source=" acme-github ",
        received_from=datetime(2026, 12, 1, 9, 0, tzinfo=PARIS),
        search=" ",
        workspace_ids=frozenset({1}),
    )

    criteria = given.criteria()

    assert criteria == {
        "status": "dead",
        "source": "acme-github",
        "received_from": "2026-12-01T08:00:00+00:00",
    }
    rebuilt = DeliveryFilter.from_criteria(criteria, workspace_ids=frozenset({2}))
    assert rebuilt.criteria() == criteria and rebuilt.workspace_ids == {2}
    assert DeliveryFilter.from_criteria({}) == DeliveryFilter()
    with pytest.raises(InvalidFilter, match="unknown criterion 'owner'"):
        DeliveryFilter.from_criteria({"owner": "x"})


# --- the dry run -------------------------------------------------------------------------


def test_the_dry_run_counts_parked_and_dead_rows_and_those_whose_body_was_dropped(
    store: Store, acme: int
):
    stored(store, acme, "d-1", status=DeliveryStatus.DEAD)
    stored(store, acme, "d-2", status=DeliveryStatus.NEEDS_OPERATOR)
    dropped = stored(store, acme, "d-3", status=DeliveryStatus.DEAD)
    drop_body(store, dropped)
    stored(store, acme, "d-4", status=DeliveryStatus.DONE)
    stored(store, acme, "d-5")
    stored(store, acme, "d-6", status=DeliveryStatus.REPLAY)

    with store.sessions() as session:
        every = count_replayable(session=session, filter=DeliveryFilter())
        dead = count_replayable(session=session, filter=DeliveryFilter(status="dead"))
        none = count_replayable(session=session, filter=DeliveryFilter(search="d-4"))

    assert every == ReplayCount(replayable=2, bodies_dropped=1)
    assert dead == ReplayCount(replayable=1, bodies_dropped=1)
    assert none == ReplayCount(replayable=0, bodies_dropped=0)
    assert status_of(store, dropped) == "dead"


@pytest.mark.parametrize("status", ["done", "queued", "replay", "mismatch"])
def test_only_parked_and_dead_deliveries_replay_in_bulk(store: Store, status: str):
    with (
        store.sessions() as session,
        pytest.raises(NotReplayable, match="only dead or needs_operator deliveries"),
    ):
        count_replayable(session=session, filter=DeliveryFilter(status=status))
    with pytest.raises(NotReplayable, match=f"{status} deliveries cannot be replayed in bulk"):
        run(store, DeliveryFilter(status=status))
    assert store.scalar("SELECT count(*) FROM operations") == 0


# --- the run -------------------------------------------------------------------------------


class Sent:
    """The ``send`` of a run: what it was handed, and what the inbox said then."""

    def __init__(self, store: Store, then=None) -> None:
        self.store, self.then = store, then
        self.batches: list[list[int]] = []
        self.seen: list[list[str]] = []

    def __call__(self, keys: list[int]) -> None:
        self.batches.append(list(keys))
        # Another connection: what was committed before the keys went out.
        self.seen.append([status_of(self.store, pk) for pk in keys])
        if self.then is not None:
            self.then(keys)


def run(store: Store, filter: DeliveryFilter, send=None, **options):
    options = {"name": "adapter fix 1.4.2", "operator": "alice", "expected": None} | options
    return bulk_replay(sessions=store.sessions, filter=filter, send=send or Sent(store), **options)


def test_a_bulk_replay_queues_commits_then_sends_and_keeps_its_history(store: Store, acme: int):
    dead = [stored(store, acme, f"d-{n}", status=DeliveryStatus.DEAD) for n in range(5)]
    parked = stored(store, acme, "d-parked", status=DeliveryStatus.NEEDS_OPERATOR)
    done = stored(store, acme, "d-done", status=DeliveryStatus.DONE)
    sent = Sent(store)

    operation = run(store, DeliveryFilter(status="dead"), sent, expected=5, batch=2)

    assert sent.batches == [dead[0:2], dead[2:4], dead[4:]]
    assert sent.seen == [["queued"] * len(batch) for batch in sent.batches]
    assert [status_of(store, pk) for pk in (parked, done)] == ["needs_operator", "done"]
    with store.sessions() as session:
        replayed = session.get(Delivery, dead[0])
        assert (replayed.retries, replayed.answered_attempts) == (0, replayed.attempts)
        assert replayed.status_reason == (
            f"replayed by alice in bulk (operation {operation.id}: adapter fix 1.4.2)"
        )
        history = list_operations(session=session)
    assert history == [operation]
    assert (operation.kind, operation.name, operation.operator) == (
        BULK_REPLAY,
        "adapter fix 1.4.2",
        "alice",
    )
    assert operation.criteria == {"status": "dead"}
    assert (operation.expected, operation.matched, operation.done) == (5, 5, 5)
    assert operation.finished and operation.error is None
    assert operation.started_at <= operation.finished_at


def test_a_row_that_fails_again_during_the_run_is_not_replayed_twice(store: Store, acme: int):
    dead = [stored(store, acme, f"d-{n}", status=DeliveryStatus.DEAD) for n in range(4)]

    def fail_again(keys: list[int]) -> None:
        # The worker takes the batch at once and fails on it again.
        for pk in keys:
            settle_as(store, pk, DeliveryStatus.DEAD, error="still broken")

    sent = Sent(store, then=fail_again)
    operation = run(store, DeliveryFilter(), sent, batch=1)

    assert sent.batches == [[pk] for pk in dead]
    assert [status_of(store, pk) for pk in dead] == ["dead"] * 4
    assert (operation.matched, operation.done) == (4, 4)


def test_a_bulk_replay_skips_rows_whose_body_was_dropped(store: Store, acme: int):
    kept = stored(store, acme, "d-1", status=DeliveryStatus.DEAD)
    dropped = stored(store, acme, "d-2", status=DeliveryStatus.DEAD)
    drop_body(store, dropped)
    sent = Sent(store)

    operation = run(store, DeliveryFilter(), sent, expected=1)

    assert sent.batches == [[kept]]
    assert (status_of(store, kept), status_of(store, dropped)) == ("queued", "dead")
    assert (operation.expected, operation.matched, operation.done) == (1, 1, 1)


def test_a_send_that_raises_leaves_the_rows_queued_for_the_sweeper(store: Store, acme: int, caplog):
    dead = [stored(store, acme, f"d-{n}", status=DeliveryStatus.DEAD) for n in range(3)]
    calls: list[list[int]] = []

    def broker_down(keys: list[int]) -> None:
        calls.append(keys)
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    operation = run(store, DeliveryFilter(), broker_down, batch=2)

    assert calls == [dead[:2], dead[2:]]
    assert [status_of(store, pk) for pk in dead] == ["queued"] * 3
    assert (operation.done, operation.error) == (3, None) and operation.finished
    assert "the sweeper sends them" in caplog.text


def test_a_run_stopped_by_an_error_records_it_and_raises_it(store: Store, acme: int):
    dead = [stored(store, acme, f"d-{n}", status=DeliveryStatus.DEAD) for n in range(4)]

    def interrupted(keys: list[int]) -> None:
        raise KeyboardInterrupt()

    with pytest.raises(KeyboardInterrupt):
        run(store, DeliveryFilter(), interrupted, batch=2)

    with store.sessions() as session:
        (operation,) = list_operations(session=session)
    # The first batch was committed before its send: queued, and counted.
    assert [status_of(store, pk) for pk in dead] == ["queued", "queued", "dead", "dead"]
    assert (operation.matched, operation.done) == (4, 2)
    assert operation.finished and operation.error == "KeyboardInterrupt"


def test_a_bulk_replay_touches_only_its_workspaces_and_its_criteria(store: Store, acme: int):
    beta = a_source(store, store.workspace("beta", "BETA").id, "beta-github")
    acme_id = store.scalar("SELECT id FROM workspaces WHERE slug = 'acme'")
    old = stored(store, acme, "d-0", status=DeliveryStatus.DEAD, received_at=T0 - timedelta(days=1))
    mine = stored(store, acme, "d-1", status=DeliveryStatus.DEAD, received_at=T0)
    theirs = stored(store, beta, "d-2", status=DeliveryStatus.DEAD, received_at=T0)

    scoped = DeliveryFilter(received_from=T0, workspace_ids=frozenset({acme_id}))
    operation = run(store, scoped)

    assert [status_of(store, pk) for pk in (mine, old, theirs)] == ["queued", "dead", "dead"]
    assert operation.criteria == {"received_from": T0.isoformat()}
    assert operation.done == 1


def test_a_bulk_replay_leaves_rows_stored_after_it_began(store: Store, acme: int):
    first = stored(store, acme, "d-1", status=DeliveryStatus.DEAD)
    later: list[int] = []

    def another_dies(keys: list[int]) -> None:
        if not later:
            later.append(stored(store, acme, "d-2", status=DeliveryStatus.DEAD))

    operation = run(store, DeliveryFilter(), Sent(store, then=another_dies), batch=1)

    assert (status_of(store, first), status_of(store, later[0])) == ("queued", "dead")
    assert operation.done == 1


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "a bulk replay needs a name"),
        ("   ", "a bulk replay needs a name"),
        (None, "a bulk replay needs a name"),
        ("x" * 201, "must be at most 200 characters"),
        ("two\nlines", "must be one line"),
    ],
)
def test_a_bulk_replay_needs_a_name_and_records_nothing_without_one(
    store: Store, acme: int, name, message
):
    dead = stored(store, acme, "d-1", status=DeliveryStatus.DEAD)
    with pytest.raises(InvalidOperation, match=message):
        run(store, DeliveryFilter(), name=name)
    assert status_of(store, dead) == "dead"
    assert store.scalar("SELECT count(*) FROM operations") == 0


def test_the_name_is_kept_trimmed_and_a_negative_expectation_is_refused(store: Store, acme: int):
    stored(store, acme, "d-1", status=DeliveryStatus.DEAD)
    with pytest.raises(InvalidOperation, match="cannot be negative"):
        run(store, DeliveryFilter(), expected=-1)
    assert run(store, DeliveryFilter(), name="  after the outage  ").name == "after the outage"


def test_the_history_is_newest_first_and_an_unknown_operation_is_not_found(store: Store, acme: int):
    first = run(store, DeliveryFilter(), name="first")
    second = run(store, DeliveryFilter(status="needs_operator"), name="second", expected=0)

    with store.sessions() as session:
        assert [o.name for o in list_operations(session=session)] == ["second", "first"]
        assert [o.id for o in list_operations(session=session, limit=1)] == [second.id]
        assert get_operation(session=session, operation_id=first.id) == first
        assert session.scalar(select(func.count()).select_from(Operation)) == 2
        for missing in (999, 0, 2**40):
            with pytest.raises(OperationNotFound, match=f"operation {missing} not found"):
                get_operation(session=session, operation_id=missing)
    assert (first.matched, first.done, second.expected) == (0, 0, 0)


# --- a task deleted before its creation settled (docs/contract.md, "14. Fencing the create") --


def a_dead_create(store: Store, feed) -> int:
    """A GitHub create that died of database errors before its lookup: no task."""
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")
    settle_as(store, pk, DeliveryStatus.DEAD, reason="database errors, 2 retries spent")
    return pk


def test_the_dry_run_counts_apart_a_delivery_whose_task_was_deleted_and_the_run_leaves_it_out(
    store: Store,
):
    feed = make_feed(store.sessions)
    parked, deleted = a_create_deleted_before_it_settled(store, feed)
    dead = a_dead_create(store, feed)

    with store.sessions() as session:
        every = count_replayable(session=session, filter=DeliveryFilter())
        parked_only = count_replayable(
            session=session, filter=DeliveryFilter(status="needs_operator")
        )
    sent = Sent(store)
    operation = run(store, DeliveryFilter(), sent, expected=every.replayable)

    assert every == ReplayCount(
        replayable=1, bodies_dropped=0, task_deleted=1, task_deleted_ids=(parked,)
    )
    assert parked_only == ReplayCount(
        replayable=0, bodies_dropped=0, task_deleted=1, task_deleted_ids=(parked,)
    )
    assert sent.batches == [[dead]]
    assert (status_of(store, parked), status_of(store, dead)) == ("needs_operator", "queued")
    assert delivery(store.sessions, parked).created_task_id == deleted  # still marked
    assert (operation.matched, operation.done) == (1, 1)
    assert operation.criteria == {}
    # The replayed one makes its task; the parked one made nothing.
    process(store, dead)
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert task.external_id == "gh-issue/Codertocat/Hello-World#1"


def test_a_named_delivery_whose_task_was_deleted_is_replayed_and_creates_it_again(store: Store):
    feed = make_feed(store.sessions)
    parked, _ = a_create_deleted_before_it_settled(store, feed)
    dead = a_dead_create(store, feed)
    named = frozenset({parked})

    with store.sessions() as session:
        counted = count_replayable(session=session, filter=DeliveryFilter(), named=named)
    sent = Sent(store)
    operation = run(store, DeliveryFilter(), sent, named=named, expected=counted.replayable)
    again = process(store, parked)

    assert counted == ReplayCount(replayable=2, bodies_dropped=0, task_deleted=0)
    assert sent.batches == [[parked, dead]]
    assert operation.criteria == {"recreate": [parked]}
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (again.status, again.outcome, task.identifier) == (
        DeliveryStatus.DONE,
        "created",
        "ACME-2",  # ACME-1 was the deleted one
    )
    row = delivery(store.sessions, parked)
    assert row.created_task_id == task.id
    with store.sessions() as session:
        reason = session.get(Delivery, dead).status_reason
    assert "named to create its deleted task again" not in reason


def test_a_named_delivery_must_be_one_the_replay_leaves_out(store: Store):
    feed = make_feed(store.sessions)
    parked, _ = a_create_deleted_before_it_settled(store, feed)
    dead = a_dead_create(store, feed)
    # Each named id is a decision about one delivery: one the replay would
    # take anyway (mistyped?), no delivery at all, or one outside the filter
    # is refused before anything changes.
    wrong = [
        (DeliveryFilter(), frozenset({dead, 999}), f"{dead}, 999"),
        (DeliveryFilter(status="dead"), frozenset({parked}), str(parked)),
    ]

    for filter, named, listed in wrong:
        with store.sessions() as session, pytest.raises(NotReplayable, match=f"not so: {listed}$"):
            count_replayable(session=session, filter=filter, named=named)
        with pytest.raises(NotReplayable, match="must be one this replay leaves out"):
            run(store, filter, named=named)

    assert (status_of(store, parked), status_of(store, dead)) == ("needs_operator", "dead")
    assert store.scalar("SELECT count(*) FROM operations") == 0


def test_a_replay_that_does_not_recreate_keeps_the_mark_and_the_worker_parks_it_again(
    store: Store,
):
    # A task deleted between a bulk replay's selection and its row's change:
    # not named, so the row keeps its mark and the worker parks it again.
    feed = make_feed(store.sessions)
    parked, deleted = a_create_deleted_before_it_settled(store, feed)

    with session_scope(store.sessions) as session:
        replay_delivery(
            session=session, delivery=session.get(Delivery, parked), recreate_deleted=False
        )
    again = process(store, parked)

    assert again.status is DeliveryStatus.NEEDS_OPERATOR
    assert "deleted before its creation settled" in again.reason
    assert delivery(store.sessions, parked).created_task_id == deleted
    assert tasks_of(store.sessions, feed.workspace_id) == []


@pytest.mark.parametrize("named", [["0"], ["x"], ["12a"], [str(2**31)]])
def test_a_named_id_that_is_no_delivery_id_is_refused(named):
    with pytest.raises(InvalidOperation, match="is not a delivery's id"):
        checked_named(named)
