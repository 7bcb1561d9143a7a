"""Retry-safe changes in the task store, on SQLite and PostgreSQL
(models/idempotency.py, models/retry_safe.py; docs/contract.md, "Retries of
everything that is not a create"): a retry under the same key replays the
receipt and changes nothing twice, another request under it is refused, a
stale guard changes nothing, a key past its window is a new request, and of
two concurrent retries one acts."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from models import idempotency, merges, retry_safe
from models.access import Caller
from models.db import session_scope
from models.errors import (
    IdempotencyKeyReused,
    InvalidIdempotencyKey,
    MergeRefused,
    StaleRevision,
    TaskNotFound,
)
from models.idempotency import (
    KeyedRequest,
    Receipt,
    prune_expired,
    run_once,
    task_revision,
)
from models.inbox import DeliveryStatus
from models.operations import DeliveryFilter, bulk_replay, started_under_key
from models.tables import IdempotencyKey, TaskEvent, utcnow
from models.tasks import NewTask, create_task, get_task
from tests.support.scenarios import a_delivery, a_source, settle_as
from tests.support.stores import Store

OPERATOR = Caller.trusted("ops")


def _task(store: Store, workspace_id: int, external_id: str | None = None) -> int:
    with session_scope(store.sessions) as session:
        return create_task(
            session=session,
            caller=OPERATOR,
            workspace_id=workspace_id,
            new=NewTask(title="Fix the login page", external_id=external_id),
        ).task.id


def _events(store: Store, type: str) -> int:
    return store.scalar("SELECT count(*) FROM task_events WHERE type = :type", type=type)


def _retry(key: str = "k-1", actor: str = "token:1", **kwargs) -> idempotency.Retry:
    return idempotency.Retry.of(actor, key, **kwargs)


# --- the key itself -------------------------------------------------------------------------


def _counting(store: Store):
    ran = []

    def once(request: KeyedRequest, *, now=None, window=timedelta(hours=24)) -> Receipt:
        def change() -> Receipt:
            ran.append(request)
            return Receipt(status=201, answer={"n": len(ran)})

        with session_scope(store.sessions) as session:
            return run_once(session=session, request=request, change=change, window=window, now=now)

    return once, ran


def _request(**changes) -> KeyedRequest:
    fields = {"actor": "token:1", "key": "k-1", "action": "test.poke", "target": "thing 1"}
    return KeyedRequest(**(fields | changes))


def test_same_key_same_request_replays_the_receipt_and_acts_once(store: Store):
    once, ran = _counting(store)
    first, again = once(_request()), once(_request())
    assert (first.status, first.answer, first.replayed) == (201, {"n": 1}, False)
    assert (again.status, again.answer, again.replayed) == (201, {"n": 1}, True)
    assert len(ran) == 1


@pytest.mark.parametrize(
    "other",
    [
        {"body": {"reason": "other"}},
        {"target": "thing 2"},
        {"guard": '"r1-00"'},
        {"action": "test.prod"},
        {"actor": "token:2"},
    ],
    ids=["body", "target", "guard", "action", "actor"],
)
def test_same_key_with_a_different_request_is_refused(store: Store, other):
    once, ran = _counting(store)
    once(_request())
    with pytest.raises(IdempotencyKeyReused):
        once(_request(**other))
    assert len(ran) == 1


def test_a_key_past_its_window_is_a_new_request_not_an_error(store: Store):
    once, ran = _counting(store)
    once(_request(), window=timedelta(hours=1))
    later = utcnow() + timedelta(hours=2)
    # Even another request under the old key: the key is forgotten.
    fresh = once(_request(body={"reason": "new"}), now=later)
    assert (fresh.replayed, fresh.answer, len(ran)) == (False, {"n": 2}, 2)
    assert store.scalar("SELECT count(*) FROM idempotency_keys") == 1
    assert once(_request(body={"reason": "new"}), now=later).replayed is True


def test_prune_deletes_only_keys_past_their_window(store: Store):
    once, _ran = _counting(store)
    once(_request(key="short"), window=timedelta(minutes=1))
    once(_request(key="long"))
    with session_scope(store.sessions) as session:
        assert prune_expired(session=session, now=utcnow() + timedelta(hours=1)) == 1
    assert store.scalar("SELECT key FROM idempotency_keys") == "long"


def test_a_refused_change_keeps_no_key(store: Store):
    def refused() -> Receipt:
        raise TaskNotFound()

    with pytest.raises(TaskNotFound), session_scope(store.sessions) as session:
        run_once(session=session, request=_request(), change=refused)
    assert store.scalar("SELECT count(*) FROM idempotency_keys") == 0


@pytest.mark.parametrize("key", ["", " ", "x" * 256, "with space", "caf\u00e9", 7])
def test_a_key_no_row_can_keep_is_refused_plainly(key):
    with pytest.raises(InvalidIdempotencyKey):
        idempotency.Retry.of("token:1", key)


# --- archive, delete, release ------------------------------------------------------------


def test_an_archive_retried_replays_and_appends_one_event(store: Store):
    workspace = store.workspace()
    task_id = _task(store, workspace.id, "jira:A-1")
    for _ in range(2):
        with session_scope(store.sessions) as session:
            task, receipt = retry_safe.archive(
                session=session, caller=OPERATOR, task_id=task_id, retry=_retry()
            )
            assert task.archived_at is not None
    assert receipt.replayed and receipt.event is not None
    assert receipt.event.type == "task.archived"
    assert _events(store, "task.archived") == 1


def test_a_stale_revision_changes_nothing(store: Store):
    workspace = store.workspace()
    task_id = _task(store, workspace.id, "jira:A-2")
    with store.sessions() as session:
        seen = task_revision(get_task(session=session, caller=OPERATOR, task_id=task_id))
    with session_scope(store.sessions) as session:
        retry_safe.archive(session=session, caller=OPERATOR, task_id=task_id, if_match=seen)
    # The archive changed the revision: a delete guarded by the old one is refused.
    with pytest.raises(StaleRevision), session_scope(store.sessions) as session:
        retry_safe.delete(
            session=session, caller=OPERATOR, task_id=task_id, if_match=seen, retry=_retry()
        )
    assert store.scalar("SELECT count(*) FROM tasks") == 1
    assert store.scalar("SELECT count(*) FROM idempotency_keys") == 0


def test_a_delete_replays_only_while_the_caller_sees_the_workspace(store: Store):
    workspace = store.workspace()
    task_id = _task(store, workspace.id, "jira:D-1")
    member = Caller.of_workspaces("member", workspace.id)
    with session_scope(store.sessions) as session:
        retry_safe.delete(session=session, caller=member, task_id=task_id, retry=_retry())
    with session_scope(store.sessions) as session:
        again = retry_safe.delete(session=session, caller=member, task_id=task_id, retry=_retry())
    assert again.replayed and again.status == 204 and again.event.type == "task.deleted"
    # The same actor, its token now scoped elsewhere: a fresh delete's answer.
    moved = Caller.of_workspaces("member", workspace.id + 1000)
    with pytest.raises(TaskNotFound), session_scope(store.sessions) as session:
        retry_safe.delete(session=session, caller=moved, task_id=task_id, retry=_retry())
    assert _events(store, "task.deleted") == 1


def test_an_archive_replayed_after_a_delete_is_not_found(store: Store):
    workspace = store.workspace()
    task_id = _task(store, workspace.id, "jira:A-3")
    with session_scope(store.sessions) as session:
        retry_safe.archive(session=session, caller=OPERATOR, task_id=task_id, retry=_retry())
    with session_scope(store.sessions) as session:
        retry_safe.delete(session=session, caller=OPERATOR, task_id=task_id)
    with pytest.raises(TaskNotFound), session_scope(store.sessions) as session:
        retry_safe.archive(session=session, caller=OPERATOR, task_id=task_id, retry=_retry())


def _release(store: Store, workspace_id: int, external_id: str, **kwargs) -> Receipt:
    with session_scope(store.sessions) as session:
        return retry_safe.release(
            session=session,
            caller=OPERATOR,
            workspace_id=workspace_id,
            external_id=external_id,
            operator="ops",
            reason=kwargs.pop("reason", "abandoned"),
            retry=_retry(),
            **kwargs,
        )


def test_a_release_retried_after_the_identity_was_claimed_again_replays(store: Store):
    workspace = store.workspace()
    first = _task(store, workspace.id, "jira:R-1")
    assert _release(store, workspace.id, "jira:R-1", expected_task_id=first).replayed is False
    second = _task(store, workspace.id, "jira:R-1")  # the freed identity, claimed anew
    # Another spelling of the same identity (outer white space) is the same request.
    again = _release(store, workspace.id, "  jira:R-1 ", expected_task_id=first)
    assert again.replayed and again.task_id == first
    assert _events(store, "task.identity_released") == 1
    assert store.scalar("SELECT external_id FROM tasks WHERE id = :id", id=second) == "jira:R-1"
    with pytest.raises(IdempotencyKeyReused):
        _release(store, workspace.id, "jira:R-1", expected_task_id=second)


def test_a_release_retried_after_its_name_became_an_alias_replays(store: Store):
    # Released; then a new task claims the name and is merged into another,
    # so the name is that task's alias now. The retry still replays the
    # first release and frees nothing.
    workspace = store.workspace()
    first = _task(store, workspace.id, "jira:M-1")
    assert _release(store, workspace.id, "jira:M-1", expected_task_id=first).replayed is False
    claimed, keeper = _task(store, workspace.id, "jira:M-1"), _task(store, workspace.id, "jira:N-1")
    with session_scope(store.sessions) as session:
        merges.merge(
            session=session,
            caller=OPERATOR,
            into_task_id=keeper,
            from_task_id=claimed,
            operator="ana",
            reason="one item",
        )
    again = _release(store, workspace.id, "jira:M-1", expected_task_id=first)
    assert again.replayed and again.task_id == first
    assert _events(store, "task.identity_released") == 1
    assert store.scalar("SELECT count(*) FROM identity_merges WHERE undone_at IS NULL") == 1


def test_a_lost_answer_is_replayed_and_its_event_is_on_the_stream_once(store: Store):
    workspace = store.workspace()
    task_id = _task(store, workspace.id, "jira:L-1")
    with session_scope(store.sessions) as session:
        retry_safe.archive(session=session, caller=OPERATOR, task_id=task_id, retry=_retry())
    # The commit happened; the caller never saw the answer, and retries.
    with session_scope(store.sessions) as session:
        _task_now, receipt = retry_safe.archive(
            session=session, caller=OPERATOR, task_id=task_id, retry=_retry()
        )
    with store.sessions() as session:
        archived = session.scalars(select(TaskEvent).where(TaskEvent.type == "task.archived")).all()
        row = session.scalars(select(IdempotencyKey)).one()
    assert [event.id for event in archived] == [receipt.event.id] == [row.event_id]


def test_two_concurrent_retries_make_one_change(store: Store):
    # A delete: without the key the second would answer 404, not the receipt.
    workspace = store.workspace()
    task_id = _task(store, workspace.id, "jira:C-1")
    start = threading.Barrier(2, timeout=30)

    def delete_once() -> bool:
        start.wait()
        with session_scope(store.sessions) as session:
            return retry_safe.delete(
                session=session, caller=OPERATOR, task_id=task_id, retry=_retry()
            ).replayed

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(delete_once), pool.submit(delete_once)]
        replayed = sorted(future.result(timeout=60) for future in futures)
    assert replayed == [False, True]
    assert _events(store, "task.deleted") == 1
    assert store.scalar("SELECT count(*) FROM task_deletions") == 1


# --- the changes whose receipt is their answer ---------------------------------------------


def _concurrently(change) -> list[bool]:
    """``change()`` on two threads at once; whether each was a retry."""
    start = threading.Barrier(2, timeout=30)

    def run() -> bool:
        start.wait()
        return change()

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(run), pool.submit(run)]
        return sorted(future.result(timeout=60) for future in futures)


def test_two_concurrent_unmerges_under_one_key_undo_once(store: Store):
    workspace = store.workspace()
    into, from_ = (_task(store, workspace.id, f"jira:U-{n}") for n in (1, 2))
    with session_scope(store.sessions) as session:
        merge_id = merges.merge(
            session=session,
            caller=OPERATOR,
            into_task_id=into,
            from_task_id=from_,
            operator="ana",
            reason="one item",
        ).id

    def unmerge_once() -> bool:
        with session_scope(store.sessions) as session:
            return retry_safe.unmerge(
                session=session,
                caller=OPERATOR,
                merge_id=merge_id,
                operator="ana",
                reason="two items",
                retry=_retry("k-undo"),
            )[1]

    assert _concurrently(unmerge_once) == [False, True]
    assert store.scalar("SELECT count(*) FROM identity_merges WHERE undone_at IS NOT NULL") == 1
    # Without the key a second undo is refused: the key is what made the retry safe.
    with pytest.raises(MergeRefused), session_scope(store.sessions) as session:
        retry_safe.unmerge(
            session=session, caller=OPERATOR, merge_id=merge_id, operator="ana", reason="again"
        )


def test_two_concurrent_bulk_replays_under_one_key_start_one_run(store: Store):
    source_id = a_source(store, store.workspace().id)
    keys = [a_delivery(store, source_id, f"d-{n}") for n in range(3)]
    for key in keys:
        settle_as(store, key, DeliveryStatus.DEAD, error="database went away")
    sent: list[int] = []

    def bulk_once() -> int:
        return bulk_replay(
            sessions=store.sessions,
            filter=DeliveryFilter(status="dead"),
            name="after the outage",
            operator="ana",
            expected=3,
            send=sent.extend,
            retry=_retry("k-bulk", actor="cli:ana"),
        ).id

    ids = _concurrently(bulk_once)
    assert ids[0] == ids[1]
    assert store.scalar("SELECT count(*) FROM operations WHERE kind = 'bulk-replay'") == 1
    assert sorted(sent) == sorted(keys)  # each sent once, by the run that started
    with store.sessions() as session:
        again = started_under_key(
            session=session,
            retry=_retry("k-bulk", actor="cli:ana"),
            filter=DeliveryFilter(status="dead"),
            name="after the outage",
            expected=3,
        )
        with pytest.raises(IdempotencyKeyReused):
            started_under_key(
                session=session,
                retry=_retry("k-bulk", actor="cli:ana"),
                filter=DeliveryFilter(status="dead"),
                name="another run",
                expected=3,
            )
    assert again is not None and again.id == ids[0] and again.done == 3


def test_an_answered_change_past_its_window_runs_again(store: Store):
    answers = []

    def answered() -> tuple[dict, bool]:
        with session_scope(store.sessions) as session:
            return idempotency.answered_once(
                session,
                _retry("k-old"),
                action=idempotency.Action.REVOKE_TOKEN,
                target="token 1",
                body={},
                work=lambda: answers.append(1) or {"n": len(answers)},
            )

    first, again = answered(), answered()
    with store.engine.begin() as connection:
        connection.execute(
            update(IdempotencyKey).values(expires_at=utcnow() - timedelta(seconds=1))
        )
    later = answered()
    assert (first, again, later) == (({"n": 1}, False), ({"n": 1}, True), ({"n": 2}, False))
