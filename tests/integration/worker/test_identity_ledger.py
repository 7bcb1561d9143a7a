"""Every entrance asks the identity ledger the same question, when the worker runs it.

One real item, one task -- except where an operator released or deleted it,
and then nothing brings it back that may not (docs/contract.md §15, "The
identity ledger"): a scan or search, the very delivery that created it (after
its row was pruned, too), a delivery received before the change. A genuine
new delivery after a release or a delete makes a new task, as the contract
says. Each case runs on SQLite and PostgreSQL, on the fast path and the
general path (tests/integration/worker/conftest.py).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from models.access import Caller
from models.db import session_scope
from models.identities import IdentityState, list_names
from models.inbox import DeliveryStatus, replay
from models.operations import DeliveryFilter, bulk_replay
from models.retention import Policy, prune
from models.tables import Delivery, Identity, Task, utcnow
from models.tasks import NewTask, create_task, delete_task, release_external_id
from tests.support.feeds import delivery, make_feed, store_fixture, tasks_of
from tests.support.runs import run
from tests.support.stores import Store

JIRA_CREATED = "jira_issue_created__cloud"
EXTERNAL_ID = "jira:TES-41"
SCAN = "scan"


def _created(store: Store, feed) -> tuple[int, Task]:
    pk = store_fixture(store.sessions, feed, "jira", JIRA_CREATED)
    processed = run(store, pk)
    assert (processed.status, processed.outcome) == (DeliveryStatus.DONE, "created")
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    return pk, task


def _delete(store: Store, task: Task) -> None:
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=Caller.trusted("test"), task_id=task.id)


def _release(store: Store, feed, task: Task) -> None:
    with session_scope(store.sessions) as session:
        release_external_id(
            session=session,
            workspace_id=feed.workspace_id,
            external_id=EXTERNAL_ID,
            operator="ops",
            reason="test",
            expected_task_id=task.id,
        )


def _states(store: Store, feed) -> dict[str, str]:
    """Each external id's state in the ledger; of two rows for one name (a
    task holding it, an earlier one that gave it up), the later task's."""
    with store.sessions() as session:
        rows = list_names(session, workspace_id=feed.workspace_id, limit=10_000)
    return {row.name: row.state for row in rows if row.kind == "external"}


def _ignored(store: Store, pk: int) -> str:
    processed = run(store, pk)
    assert processed.status is DeliveryStatus.IGNORED, processed
    return processed.reason or ""


def test_a_create_records_its_identity_and_each_change_of_it(store: Store):
    feed = make_feed(store.sessions)
    _, task = _created(store, feed)
    assert _states(store, feed) == {EXTERNAL_ID: IdentityState.HELD}
    _release(store, feed, task)
    assert _states(store, feed) == {EXTERNAL_ID: IdentityState.RELEASED}


def test_a_scan_never_brings_back_a_deleted_task(store: Store):
    feed = make_feed(store.sessions)
    _, task = _created(store, feed)
    _delete(store, task)

    scan = store_fixture(store.sessions, feed, "jira", JIRA_CREATED, origin=SCAN)

    assert "never brings one back" in _ignored(store, scan)
    assert tasks_of(store.sessions, feed.workspace_id) == []
    assert _states(store, feed) == {EXTERNAL_ID: IdentityState.DELETED}


def test_a_scan_stored_before_a_release_creates_nothing_after_it(store: Store):
    feed = make_feed(store.sessions)
    _, task = _created(store, feed)
    scan = store_fixture(store.sessions, feed, "jira", JIRA_CREATED, origin=SCAN)
    _release(store, feed, task)

    assert "never brings one back" in _ignored(store, scan)
    (still,) = tasks_of(store.sessions, feed.workspace_id)
    assert still.id == task.id and still.external_id is None


def test_a_scan_of_an_item_a_webhook_created_is_found(store: Store):
    feed = make_feed(store.sessions)
    _, task = _created(store, feed)
    scan = store_fixture(store.sessions, feed, "jira", JIRA_CREATED, origin=SCAN)

    processed = run(store, scan)

    assert (processed.outcome, processed.task_id) == ("found_settled", task.id)


def test_a_webhook_received_before_a_release_creates_nothing_after_it(store: Store):
    feed = make_feed(store.sessions)
    _, task = _created(store, feed)
    earlier = store_fixture(store.sessions, feed, "jira", JIRA_CREATED)
    _release(store, feed, task)

    assert "received before" in _ignored(store, earlier)
    assert len(tasks_of(store.sessions, feed.workspace_id)) == 1


def test_an_operator_replay_of_a_delivery_received_before_a_release_creates_anew(store: Store):
    feed = make_feed(store.sessions)
    _, task = _created(store, feed)
    earlier = store_fixture(store.sessions, feed, "jira", JIRA_CREATED)
    _release(store, feed, task)
    _ignored(store, earlier)
    with session_scope(store.sessions) as session:
        row = session.get(Delivery, earlier)
        # A person's replay counts as the delivery received again
        # (models.inbox.replay sets it; the status here is not replayable).
        row.status, row.replayed_at = DeliveryStatus.QUEUED.value, utcnow()

    processed = run(store, earlier)

    assert processed.outcome == "created"
    assert len(tasks_of(store.sessions, feed.workspace_id)) == 2


def test_a_new_webhook_after_a_release_creates_a_new_task(store: Store):
    feed = make_feed(store.sessions)
    _, task = _created(store, feed)
    _release(store, feed, task)
    later = store_fixture(store.sessions, feed, "jira", JIRA_CREATED)

    processed = run(store, later)

    assert processed.outcome == "created" and processed.task_id != task.id
    assert _states(store, feed) == {EXTERNAL_ID: IdentityState.HELD}


def test_a_new_webhook_after_a_delete_creates_a_new_task(store: Store):
    feed = make_feed(store.sessions)
    _, task = _created(store, feed)
    _delete(store, task)
    later = store_fixture(store.sessions, feed, "jira", JIRA_CREATED)

    processed = run(store, later)

    assert processed.outcome == "created" and processed.task_id != task.id


def _pruned(store: Store, pk: int) -> None:
    with session_scope(store.sessions) as session:
        prune(
            session=session,
            policy=Policy(body_days=0, row_days=1, pause_seconds=0),
            now=utcnow() + timedelta(days=2),
        )
    assert delivery(store.sessions, pk) is None


def _delete_and_prune(store: Store, task: Task, pk: int, order: str) -> None:
    """The task deleted and its creating delivery's row pruned, in ``order``:
    pruned first, only retention's record keeps the creator."""
    if order == "delete, then prune":
        _delete(store, task)
        _pruned(store, pk)
    else:
        _pruned(store, pk)
        _delete(store, task)


ORDERS = pytest.mark.parametrize("order", ["delete, then prune", "prune, then delete"])


@ORDERS
def test_a_redelivery_after_its_row_was_pruned_never_creates_twice(store: Store, order: str):
    feed = make_feed(store.sessions)
    first, task = _created(store, feed)
    with store.sessions() as session:
        sent = session.get(Delivery, first)
        delivery_id, body = sent.delivery_id, sent.body
    _delete_and_prune(store, task, first, order)

    again = store_fixture(
        store.sessions, feed, "jira", JIRA_CREATED, delivery_id=delivery_id, body=body
    )

    assert "this same delivery created it before" in _ignored(store, again)
    assert tasks_of(store.sessions, feed.workspace_id) == []


@ORDERS
def test_the_same_body_under_a_new_id_after_pruning_is_still_a_replay(store: Store, order: str):
    feed = make_feed(store.sessions)
    first, task = _created(store, feed)
    with store.sessions() as session:
        body = session.get(Delivery, first).body
    _delete_and_prune(store, task, first, order)

    resent = store_fixture(store.sessions, feed, "jira", JIRA_CREATED, body=body)

    row = delivery(store.sessions, resent)
    assert row.status == DeliveryStatus.REPLAY.value
    assert EXTERNAL_ID in row.status_reason
    assert tasks_of(store.sessions, feed.workspace_id) == []


def _create(store: Store, feed, external_id: str, *, moved_from=()) -> tuple[int, str]:
    with session_scope(store.sessions) as session:
        result = create_task(
            session=session,
            caller=Caller.trusted("test"),
            workspace_id=feed.workspace_id,
            new=NewTask(title="moved", external_id=external_id, moved_from=moved_from),
        )
        return result.task.id, result.outcome.value


def test_a_create_under_a_name_the_item_had_is_found_and_burns_no_identifier(store: Store):
    feed = make_feed(store.sessions)
    task_id, _ = _create(store, feed, "gh-issue/old/repo#3")

    assert _create(store, feed, "gh-issue/new/repo#9", moved_from=("gh-issue/old/repo#3",)) == (
        task_id,
        "found_settled",
    )
    # The new name is now the task's alias: found directly.
    assert _create(store, feed, "gh-issue/new/repo#9") == (task_id, "found_settled")
    assert [t.identifier for t in tasks_of(store.sessions, feed.workspace_id)] == ["ACME-1"]
    with store.sessions() as session:
        alias = session.get(Identity, (feed.workspace_id, "external", "gh-issue/new/repo#9"))
    assert (alias.task_id, alias.is_alias) == (task_id, True)


def test_a_release_frees_a_task_s_aliases_with_its_identity(store: Store):
    feed = make_feed(store.sessions)
    task_id, _ = _create(store, feed, "gh-issue/old/repo#3")
    _create(store, feed, "gh-issue/new/repo#9", moved_from=("gh-issue/old/repo#3",))
    with session_scope(store.sessions) as session:
        release_external_id(
            session=session,
            workspace_id=feed.workspace_id,
            external_id="gh-issue/old/repo#3",
            operator="ops",
            reason="test",
        )

    new_id, outcome = _create(store, feed, "gh-issue/new/repo#9")

    assert outcome == "created" and new_id != task_id


def _dead_copy_of_the_item(store: Store, feed) -> int:
    """A second delivery of the item, dead (say, by a bug since fixed)."""
    pk = store_fixture(store.sessions, feed, "jira", JIRA_CREATED)
    with session_scope(store.sessions) as session:
        session.get(Delivery, pk).status = DeliveryStatus.DEAD.value
    return pk


def test_a_bulk_replay_never_brings_back_a_task_deleted_since(store: Store):
    feed = make_feed(store.sessions)
    _, task = _created(store, feed)
    dead = _dead_copy_of_the_item(store, feed)
    _delete(store, task)

    bulk_replay(
        sessions=store.sessions,
        filter=DeliveryFilter(status=DeliveryStatus.DEAD.value),
        name="after the fix",
        operator="ops",
        expected=None,
        send=lambda pks: None,
    )

    assert "received before" in _ignored(store, dead)
    assert tasks_of(store.sessions, feed.workspace_id) == []


def test_a_single_replay_is_the_operator_s_word_and_creates_anew(store: Store):
    feed = make_feed(store.sessions)
    _, task = _created(store, feed)
    dead = _dead_copy_of_the_item(store, feed)
    _delete(store, task)
    with session_scope(store.sessions) as session:
        replay(session=session, delivery_pk=dead)

    processed = run(store, dead)

    assert processed.outcome == "created"
    assert len(tasks_of(store.sessions, feed.workspace_id)) == 1


def test_a_found_delivery_redelivered_or_resent_after_pruning_never_brings_back_a_delete(
    store: Store,
):
    feed = make_feed(store.sessions)
    _, task = _created(store, feed)
    found = store_fixture(store.sessions, feed, "jira", JIRA_CREATED)
    assert run(store, found).outcome == "found_settled"
    with store.sessions() as session:
        sent = session.get(Delivery, found)
        delivery_id, body = sent.delivery_id, sent.body
    _pruned(store, found)
    _delete(store, task)

    again = store_fixture(
        store.sessions, feed, "jira", JIRA_CREATED, delivery_id=delivery_id, body=body
    )
    resent = store_fixture(store.sessions, feed, "jira", JIRA_CREATED, body=body)

    assert "received before" in _ignored(store, again)
    assert delivery(store.sessions, resent).status == DeliveryStatus.REPLAY.value
    assert tasks_of(store.sessions, feed.workspace_id) == []
