"""One task per real item, whichever way its creates come in, at random.

A hypothesis state machine interleaves, for three real items (GitHub issues
1, 2 and 3 of one repository), every way a create enters and every way an
operator removes a task: webhook creates, redeliveries of an earlier
delivery (same id, same bytes), scan creates, GitHub transfers (both
deliveries of the move, for the worker to run in any order), the worker in
any order (and a worker that dies between the insert and the settlement), deletes,
releases, archives, single and bulk replays, and the pruning of finished
rows. The store is real: SQLite and PostgreSQL, the fast path on and off
(tests/integration/worker/conftest.py).

The model keeps, per item, when an operator last removed its task (a
delete or a release) and which deliveries created its tasks, on a clock of
its own (one tick a step), so "received after the removal" never depends
on the code's timestamps. After every step (docs/contract.md §15, "The
identity ledger"):

- no two tasks answer to one item, and the ledger's live names match the
  tasks that hold them;
- a removed item gets a new task only from a genuine webhook delivery first
  sent after the removal, or from an operator's replay after it -- never
  from a scan, a redelivery of a delivery sent before the removal (the
  creating one above all), or anything received before it;
- a delivery the model says may create is never turned away;
- ``task.created`` comes once per task that settled or was removed, the
  identifiers handed out are the tasks inserted, and no delivery is
  ``processing`` unless its worker died or it waits for an unsettled task.

The two plain tests before the machine's are what it found, shrunk: each
fails until the ledger remembers more than the last delivery that created
an item's task (a redelivery after pruning brings a removed item back).
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import timedelta

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import select

from models.access import Caller
from models.db import session_scope
from models.events import EventType
from models.identities import SYNTHESIZED_ORIGIN, IdentityState, list_names
from models.inbox import REPLAYABLE, WEBHOOK_ORIGIN, DeliveryStatus, replay
from models.intake import NOTHING_READ, read_delivery
from models.names import NameKind
from models.operations import DeliveryFilter, bulk_replay, count_replayable
from models.providers import PROVIDERS
from models.retention import Policy, prune
from models.tables import Delivery, Task, TaskEvent, Workspace, utcnow
from models.tasks import archive_task, delete_task, release_external_id
from tests.support.deliveries import fixture
from tests.support.feeds import (
    github_issue_body,
    make_feed,
    store_delivery,
    store_github_issue,
    tasks_of,
)
from tests.support.runs import Crash, crash_after_insert, expire_lease, run
from tests.support.stores import Store
from worker.processing import Seams

ITEMS = (1, 2, 3)
TRUSTED = Caller.trusted("stateful")
#: Every finished row a prune may delete is older than its cutoff at this "now".
PRUNE = Policy(body_days=0, row_days=1, pause_seconds=0)
#: A drain at the end runs every unfinished delivery at most this many times:
#: one waiting for an unsettled task parks after three retries (the worker's
#: settings in tests/support/runs.py).
DRAIN_ROUNDS = 8
#: Each example gets a workspace of its own (the store lives across examples).
_WORKSPACES = itertools.count(1)

EXPLORATION = settings(
    max_examples=25,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def external_id(item: int) -> str:
    return f"gh-issue/Codertocat/Hello-World#{item}"


#: Where a transfer takes an item: another repository, another number.
ELSEWHERE = "octo-org/elsewhere"


def moved_id(item: int) -> str:
    return f"gh-issue/{ELSEWHERE}#{item + 100}"


def transfer_bodies(item: int) -> tuple[bytes, bytes]:
    """GitHub's two deliveries of one transfer (the recorded fixtures, edited
    to name this item): ``issues.transferred`` at the source, and
    ``issues.opened`` at the destination naming where it came from."""
    transferred = json.loads(fixture("github", "issues__transferred"))
    transferred["repository"].update(full_name="Codertocat/Hello-World", name="Hello-World")
    transferred["issue"]["number"] = item
    transferred["changes"]["new_issue"]["number"] = item + 100
    transferred["changes"]["new_repository"].update(full_name=ELSEWHERE, name="elsewhere")
    opened = json.loads(fixture("github", "issues__opened_via_transfer"))
    opened["repository"].update(full_name=ELSEWHERE, name="elsewhere", id=555)
    opened["issue"]["number"] = item + 100
    opened["issue"]["html_url"] = f"https://github.com/{ELSEWHERE}/issues/{item + 100}"
    opened["changes"]["old_issue"]["number"] = item
    opened["changes"]["old_repository"].update(
        full_name="Codertocat/Hello-World", name="Hello-World"
    )
    return json.dumps(transferred).encode(), json.dumps(opened).encode()


@dataclass
class Sent:
    """One inbox row, as the model knows it."""

    item: int
    origin: str
    delivery_id: str
    body: bytes = field(repr=False)
    #: The tick its delivery id was first sent: a redelivery keeps the first's.
    first_tick: int
    #: The tick of the operator's last replay of it, if any.
    replayed_tick: int | None = None
    #: A create that names where its item was before (an issue transferred in).
    moved: bool = False
    #: The external id it creates under (its item's first name, unless moved).
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            self.name = moved_id(self.item) if self.moved else external_id(self.item)

    #: A delivery that creates nothing: it announces a move.
    announces: bool = False


@dataclass
class Item:
    #: The tick of the last delete or release of its task; None: never removed.
    removed_tick: int | None = None
    #: How: "delete" or "release"; and the external id its task had then.
    removed_by: str | None = None
    removed_name: str | None = None
    #: The task that answers to it now, as the model saw it created.
    task_id: int | None = None
    #: The delivery ids that created its tasks, over every lifetime.
    creators: set[str] = field(default_factory=set)

    def may_be_created_by(self, sent: Sent) -> bool:
        """Whether ``sent`` may bring the item a task now (the invariant)."""
        if self.removed_tick is None:
            return True  # nothing removed: any entrance creates (or is Found)
        if self.removed_by == "delete" and sent.name != self.removed_name:
            # Under another name than its deleted task had: the item moved,
            # it is not a new one (docs/contract.md §15, item 8).
            return False
        if sent.replayed_tick is not None and sent.replayed_tick > self.removed_tick:
            return True  # an operator's decision, after the removal
        return (
            sent.origin == WEBHOOK_ORIGIN
            and sent.first_tick > self.removed_tick
            and sent.delivery_id not in self.creators
        )


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        number = next(_WORKSPACES)
        self.feed = make_feed(store.sessions, slug=f"stateful-{number}")
        self.tick = 0
        self.items = {item: Item() for item in ITEMS}
        self.sent: dict[int, Sent] = {}
        #: The webhook deliveries sent, for a redelivery to resend.
        self.webhooks: list[Sent] = []
        #: Rows whose worker died mid-create, and rows waiting for an
        #: unsettled task: the only ones that may be ``processing``.
        self.in_flight: set[int] = set()
        self.tasks_seen: set[int] = set()
        #: Every external id an item has had, to the item (a transfer adds one).
        self.names = {external_id(item): item for item in ITEMS}
        #: The inbox rows of this workspace by status, as of the last check.
        self.statuses: dict[int, str] = {}

    # --- what comes in ------------------------------------------------------------------

    def _stored(self, pk: int, sent: Sent) -> None:
        if pk not in self.sent:  # else a duplicate: the stored row answered
            self.sent[pk] = sent

    @rule(item=st.sampled_from(ITEMS))
    def webhook(self, item: int) -> None:
        self.tick += 1
        delivery_id, body = str(uuid.uuid4()), github_issue_body(item)
        pk = store_github_issue(
            self.store.sessions, self.feed, item, delivery_id=delivery_id, body=body
        )
        sent = Sent(item, WEBHOOK_ORIGIN, delivery_id, body, first_tick=self.tick)
        self._stored(pk, sent)
        self.webhooks.append(sent)

    def _redeliver(self, earlier: Sent) -> None:
        self.tick += 1
        pk = store_github_issue(
            self.store.sessions,
            self.feed,
            earlier.item,
            delivery_id=earlier.delivery_id,
            body=earlier.body,
        )
        event("redelivery: " + ("a duplicate" if pk in self.sent else "stored again"))
        self._stored(pk, replace(earlier, replayed_tick=None))

    def _pruned_webhooks(self) -> list[Sent]:
        stored = {self.sent[pk].delivery_id for pk in self.statuses}
        return [sent for sent in self.webhooks if sent.delivery_id not in stored]

    def _draw_webhook(self, data: st.DataObject, among: list[Sent]) -> Sent:
        # The how-manieth sent: a drawn Sent would print its 28 KB body, and
        # its random delivery id would differ when hypothesis runs it again.
        return among[data.draw(st.integers(0, len(among) - 1), label="the webhook sent")]

    @precondition(lambda self: self.webhooks)
    @rule(data=st.data())
    def redeliver(self, data: st.DataObject) -> None:
        """The sender sends an earlier delivery again, whatever became of its row."""
        self._redeliver(self._draw_webhook(data, self.webhooks))

    @precondition(lambda self: self._pruned_webhooks())
    @rule(data=st.data())
    def redeliver_after_pruning(self, data: st.DataObject) -> None:
        """... after the retention policy deleted its row: only the ledger remembers."""
        self._redeliver(self._draw_webhook(data, self._pruned_webhooks()))

    @rule(item=st.sampled_from(ITEMS))
    def scan(self, item: int) -> None:
        """A GitHub scan's synthesized create, stored as the catch-up stores
        it but without its storing-time check, which only saves work: the
        worker must hold the line alone (docs/contract.md §15, item 7)."""
        self.tick += 1
        delivery_id, body = f"scan:{external_id(item)}", github_issue_body(item)
        pk = store_github_issue(
            self.store.sessions,
            self.feed,
            item,
            delivery_id=delivery_id,
            body=body,
            origin=SYNTHESIZED_ORIGIN,
        )
        self._stored(pk, Sent(item, SYNTHESIZED_ORIGIN, delivery_id, body, first_tick=self.tick))

    @precondition(lambda self: any(moved_id(i) not in self.names for i in ITEMS))
    @rule(data=st.data())
    def transfer(self, data: st.DataObject) -> None:
        """GitHub transfers an item to another repository: both deliveries of
        the move are stored, for the worker to run in any order."""
        self.tick += 1
        item = data.draw(
            st.sampled_from([i for i in ITEMS if moved_id(i) not in self.names]), label="item"
        )
        self.names[moved_id(item)] = item
        transferred, opened = transfer_bodies(item)
        for event_name, body, moved in (
            ("issues.transferred", transferred, False),
            ("issues.opened", opened, True),
        ):
            delivery_id = str(uuid.uuid4())
            payload = json.loads(body)
            reading = NOTHING_READ
            if moved:
                reading = read_delivery(PROVIDERS["github"], event_name, payload, None)
            pk = store_delivery(
                self.store.sessions,
                self.feed.github_source_id,
                body=body,
                event=event_name,
                delivery_id=delivery_id,
                reading=reading,
            )
            self._stored(
                pk,
                Sent(
                    item,
                    WEBHOOK_ORIGIN,
                    delivery_id,
                    body,
                    first_tick=self.tick,
                    moved=moved,
                    announces=not moved,
                ),
            )

    # --- the worker ---------------------------------------------------------------------

    def _unfinished(self) -> list[int]:
        return sorted(
            pk
            for pk, status in self.statuses.items()
            if status in (DeliveryStatus.QUEUED, DeliveryStatus.PROCESSING)
        )

    def _work(self, pk: int, seams: Seams | None = None) -> None:
        if self.statuses.get(pk) == DeliveryStatus.PROCESSING:
            expire_lease(self.store, pk)  # the sweeper's, or the retry's, turn
        try:
            processed = run(self.store, pk, **({"seams": seams} if seams else {}))
        except Crash:
            self.in_flight.add(pk)  # inserted, unsettled, its lease held
            self.statuses[pk] = DeliveryStatus.PROCESSING
            return
        assert processed.status is not None, processed  # nobody else works here
        self.statuses[pk] = processed.status
        if processed.status is DeliveryStatus.PROCESSING:
            self.in_flight.add(pk)  # waits for an unsettled task, its lease held
            return
        self.in_flight.discard(pk)
        sent = self.sent[pk]
        event(f"{sent.origin} delivery: {processed.status} {processed.outcome or ''}")
        item = self.items[sent.item]
        if sent.announces:
            assert processed.status is DeliveryStatus.IGNORED, processed  # it learns, no more
            return
        if processed.status is DeliveryStatus.IGNORED and item.task_id is None:
            assert not item.may_be_created_by(sent), (
                f"delivery {pk} ({sent}) may create item {sent.item} but was turned away: "
                f"{processed.reason}"
            )

    @precondition(lambda self: self._unfinished())
    @rule(data=st.data())
    def work_one(self, data: st.DataObject) -> None:
        self.tick += 1
        self._work(data.draw(st.sampled_from(self._unfinished()), label="worked"))

    @precondition(lambda self: self._unfinished())
    @rule(order=st.randoms(use_true_random=False))
    def work_all(self, order) -> None:
        self.tick += 1
        pending = self._unfinished()
        order.shuffle(pending)
        for pk in pending:
            self._work(pk)

    @precondition(lambda self: any(s == DeliveryStatus.QUEUED for s in self.statuses.values()))
    @rule(data=st.data())
    def worker_dies_after_the_insert(self, data: st.DataObject) -> None:
        self.tick += 1
        queued = sorted(pk for pk, s in self.statuses.items() if s == DeliveryStatus.QUEUED)
        pk = data.draw(st.sampled_from(queued), label="crashed")
        self._work(pk, Seams(after_insert=crash_after_insert))

    # --- the operator -------------------------------------------------------------------

    def _holder(self, item: int) -> Task:
        """The task that holds the item's identity: the one the model says."""
        with self.store.sessions() as session:
            holder = session.scalar(
                select(Task).where(
                    Task.workspace_id == self.feed.workspace_id,
                    Task.external_id.in_(
                        [name for name, named in self.names.items() if named == item]
                    ),
                )
            )
        assert holder is not None and holder.id == self.items[item].task_id, (item, holder)
        return holder

    def _live_items(self) -> list[int]:
        return [item for item in ITEMS if self.items[item].task_id is not None]

    def _removed(self, item: int, how: str, name: str) -> None:
        self.items[item].removed_tick = self.tick
        self.items[item].removed_by = how
        self.items[item].removed_name = name
        self.items[item].task_id = None

    @precondition(lambda self: self._live_items())
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        self.tick += 1
        item = data.draw(st.sampled_from(self._live_items()), label="item")
        holder = self._holder(item)
        with session_scope(self.store.sessions) as session:
            delete_task(session=session, caller=TRUSTED, task_id=holder.id)
        self._removed(item, "delete", holder.external_id)

    @precondition(lambda self: self._live_items())
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.tick += 1
        item = data.draw(st.sampled_from(self._live_items()), label="item")
        holder = self._holder(item)
        with session_scope(self.store.sessions) as session:
            release_external_id(
                session=session,
                workspace_id=self.feed.workspace_id,
                external_id=holder.external_id,
                operator="ops",
                reason="stateful",
                expected_task_id=holder.id,
            )
        self._removed(item, "release", holder.external_id)

    @precondition(lambda self: self._live_items())
    @rule(data=st.data())
    def archive(self, data: st.DataObject) -> None:
        self.tick += 1
        item = data.draw(st.sampled_from(self._live_items()), label="item")
        holder = self._holder(item)
        with session_scope(self.store.sessions) as session:
            archive_task(session=session, caller=TRUSTED, task_id=holder.id)

    @rule()
    def prune_finished_rows(self) -> None:
        self.tick += 1
        with session_scope(self.store.sessions) as session:
            prune(session=session, policy=PRUNE, now=utcnow() + timedelta(days=2))

    def _replayable(self) -> list[int]:
        return sorted(pk for pk, s in self.statuses.items() if s in REPLAYABLE)

    @precondition(lambda self: self._replayable())
    @rule(data=st.data())
    def replay_one(self, data: st.DataObject) -> None:
        self.tick += 1
        pk = data.draw(st.sampled_from(self._replayable()), label="replayed")
        with session_scope(self.store.sessions) as session:
            replay(session=session, delivery_pk=pk)
        self.sent[pk].replayed_tick = self.tick

    @precondition(
        lambda self: any(
            s in (DeliveryStatus.NEEDS_OPERATOR, DeliveryStatus.DEAD)
            for s in self.statuses.values()
        )
    )
    @rule(name_the_left_out=st.booleans())
    def replay_in_bulk(self, name_the_left_out: bool) -> None:
        """The parked deliveries again. Those whose task was deleted before
        their creation settled stay out unless the operator names them; only
        a named one is their word, received anew (models.inbox.replay_delivery):
        the others keep their receipt."""
        self.tick += 1
        scope = DeliveryFilter(workspace_ids=frozenset({self.feed.workspace_id}))
        with self.store.sessions() as session:
            dry_run = count_replayable(session=session, filter=scope)
        named = frozenset(dry_run.task_deleted_ids) if name_the_left_out else frozenset()
        queued: list[int] = []
        bulk_replay(
            sessions=self.store.sessions,
            filter=scope,
            name=f"stateful {self.tick}",
            operator="ops",
            expected=None,
            send=queued.extend,
            named=named,
        )
        assert len(queued) == dry_run.replayable + len(named), (dry_run, named, queued)
        for pk in named:
            self.sent[pk].replayed_tick = self.tick

    # --- after every step ---------------------------------------------------------------

    @invariant()
    def one_task_per_item_and_nothing_comes_back(self) -> None:
        workspace_id = self.feed.workspace_id
        with self.store.sessions() as session:
            tasks = session.scalars(select(Task).where(Task.workspace_id == workspace_id)).all()
            live_rows = [
                (row.kind, row.name, row.task_id)
                for row in list_names(session, workspace_id=workspace_id, limit=1_000_000)
                if IdentityState(row.state).live
            ]
            created_events = Counter(
                session.scalars(
                    select(TaskEvent.task_id).where(
                        TaskEvent.workspace_id == workspace_id,
                        TaskEvent.type == EventType.CREATED.value,
                    )
                )
            )
            sequence = session.scalar(
                select(Workspace.task_sequence).where(Workspace.id == workspace_id)
            )
            rows = dict(
                session.execute(
                    select(Delivery.id, Delivery.status).where(
                        Delivery.source_id == self.feed.github_source_id
                    )
                ).all()
            )
        self.statuses = rows

        # No two tasks answer to one item, and the ledger says who does: each
        # task's own name is live, and every live name (an alias a transfer
        # gave, a stable key) names the one task of its item.
        holders = {task.external_id: task.id for task in tasks if task.external_id is not None}
        by_item = Counter(self.names[name] for name in holders)
        assert all(n == 1 for n in by_item.values()), f"two tasks for one item: {holders}"
        task_of_item = {self.names[name]: task_id for name, task_id in holders.items()}
        live_names = {
            name: task_id for kind, name, task_id in live_rows if kind == NameKind.EXTERNAL
        }
        assert all(live_names.get(name) == task_id for name, task_id in holders.items()), (
            f"the ledger's live names {live_names} miss the tasks' {holders}"
        )
        assert all(task_of_item.get(self.names[n]) == t for n, t in live_names.items()), (
            f"a live name names no task of its item: {live_names}, tasks {holders}"
        )
        # A stable key (models/names.py) names a task that holds its item's identity.
        assert {task_id for *_, task_id in live_rows} <= set(holders.values()), live_rows

        # A task the model has not seen yet was created in this step.
        for task in sorted(tasks, key=lambda t: t.id):
            if task.id in self.tasks_seen:
                continue
            self.tasks_seen.add(task.id)
            sent = self.sent[task.created_by_delivery]
            item = self.items[sent.item]
            assert self.names.get(task.external_id) == sent.item, (task.external_id, sent)
            assert item.task_id is None, f"item {sent.item} already has task {item.task_id}"
            assert item.may_be_created_by(sent), (
                f"item {sent.item}, removed at tick {item.removed_tick}, came back as task "
                f"{task.identifier} from delivery {task.created_by_delivery} ({sent})"
            )
            item.task_id = task.id
            item.creators.add(sent.delivery_id)
            if item.removed_tick is not None:
                event("a removed item's new task")

        # task.created once per task that settled or was removed; none burned.
        unsettled = {
            task.id
            for task in tasks
            if task.external_id is not None and task.external_id_settled_at is None
        }
        expected = {task_id: 1 for task_id in self.tasks_seen - unsettled}
        assert dict(created_events) == expected, (
            f"task.created events {dict(created_events)}, expected {expected}"
        )
        assert sequence == len(self.tasks_seen), (sequence, sorted(self.tasks_seen))

        # Processing only while its worker died or it waits for an unsettled task.
        processing = {pk for pk, s in rows.items() if s == DeliveryStatus.PROCESSING}
        assert processing <= self.in_flight, f"stuck processing: {processing - self.in_flight}"

    def teardown(self) -> None:
        """Drain the inbox as the sweeper would; then nothing is left unfinished."""
        for _ in range(DRAIN_ROUNDS):
            self.one_task_per_item_and_nothing_comes_back()
            if not self._unfinished():
                break
            for pk in self._unfinished():
                self._work(pk)
        self.one_task_per_item_and_nothing_comes_back()
        assert not self._unfinished(), f"left unfinished: {self._unfinished()}"


def _delete_the_task(store: Store, feed) -> None:
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=task.id)


def test_a_delivery_received_before_a_delete_never_creates_after_its_row_was_pruned(
    store: Store,
):
    """The machine's first find, shrunk: a second create of an item arrives
    while its task lives (Found), the retention policy deletes both rows, an
    operator deletes the task, and the sender sends that second delivery
    again (same id, same bytes). It was received before the delete, so it
    must create nothing (docs/contract.md §15, item 8: "received before the
    change"); but its row is gone, the ledger remembers only the delivery
    that created the task, and the redelivery's row is received now."""
    feed = make_feed(store.sessions)
    first = store_github_issue(store.sessions, feed, 1)
    assert run(store, first).outcome == "created"
    second_id, second_body = str(uuid.uuid4()), github_issue_body(1)
    second = store_github_issue(store.sessions, feed, 1, delivery_id=second_id, body=second_body)
    assert run(store, second).outcome == "found_settled"
    with session_scope(store.sessions) as session:
        prune(session=session, policy=PRUNE, now=utcnow() + timedelta(days=2))
    _delete_the_task(store, feed)

    again = store_github_issue(store.sessions, feed, 1, delivery_id=second_id, body=second_body)
    processed = run(store, again)

    assert processed.status is DeliveryStatus.IGNORED, processed
    assert tasks_of(store.sessions, feed.workspace_id) == []


def test_the_delivery_that_created_an_earlier_task_never_creates_again_after_pruning(
    store: Store,
):
    """The machine's second find, shrunk: an item's first task is deleted, a
    new delivery creates its second (as the contract says), that one is
    deleted too, the retention policy deletes the rows, and the sender sends
    the FIRST creating delivery again. A delivery creates once, even after
    its row was pruned (docs/contract.md §14, §15 item 8); but the ledger's
    one row per name now names only the second creator: taking the freed
    name over (models/identities.py, record_statement) overwrote the first."""
    feed = make_feed(store.sessions)
    first_id, first_body = str(uuid.uuid4()), github_issue_body(1)
    first = store_github_issue(store.sessions, feed, 1, delivery_id=first_id, body=first_body)
    assert run(store, first).outcome == "created"
    _delete_the_task(store, feed)
    second = store_github_issue(store.sessions, feed, 1)
    assert run(store, second).outcome == "created"
    _delete_the_task(store, feed)
    with session_scope(store.sessions) as session:
        prune(session=session, policy=PRUNE, now=utcnow() + timedelta(days=2))

    again = store_github_issue(store.sessions, feed, 1, delivery_id=first_id, body=first_body)
    processed = run(store, again)

    assert processed.status is DeliveryStatus.IGNORED, processed
    assert tasks_of(store.sessions, feed.workspace_id) == []


def test_one_task_per_real_item_whatever_comes_in(store: Store):
    run_state_machine_as_test(lambda: LedgerMachine(store), settings=EXPLORATION)
