"""What replaying one delivery will do (``models.replay_plan``), on both
databases: each sentence of the plan, then the replay run through the real
worker, which does what the plan said."""

from __future__ import annotations

import re

import pytest

from models.db import session_scope
from models.errors import DeliveryNotFound, NotReplayable
from models.inbox import DeliveryStatus
from models.replay_plan import ReplayPlan, plan_replay
from models.tasks import NewTask, create_task, delete_task
from tests.support.feeds import Feed, delivery, make_feed, store_fixture, tasks_of
from tests.support.runs import (
    a_create_deleted_before_it_settled,
    crashed_create,
    expire_lease,
    replay_delivery,
    run,
)
from tests.support.scenarios import release, settle_as
from tests.support.stores import TRUSTED, Store

ISSUE = "gh-issue/Codertocat/Hello-World#1"
WHEN = "[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} UTC"


def plan_of(store: Store, pk: int) -> ReplayPlan:
    with store.sessions() as session:
        return plan_replay(session=session, delivery_pk=pk)


def a_dead_issue(store: Store, feed: Feed) -> int:
    """GitHub's issues.opened for ISSUE, dead of database errors before its lookup."""
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")
    settle_as(store, pk, DeliveryStatus.DEAD, reason="database errors, 2 retries spent")
    return pk


def created_over_rest(store: Store, feed: Feed, external_id: str = ISSUE) -> int:
    with session_scope(store.sessions) as session:
        return create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=feed.workspace_id,
            new=NewTask(title="Made over REST", external_id=external_id),
        ).task.id


def replayed(store: Store, pk: int):
    replay_delivery(store, pk)
    return run(store, pk)


def test_a_create_whose_task_was_deleted_before_it_settled_creates_it_again(store: Store):
    feed = make_feed(store.sessions)
    pk, deleted = a_create_deleted_before_it_settled(store, feed)

    plan = plan_of(store, pk)

    assert (plan.delivery, plan.status, plan.workspace, plan.external_id) == (
        pk,
        "needs_operator",
        "acme",
        "jira:TES-41",
    )
    assert plan.reason.startswith("the task for 'jira:TES-41' was deleted before its creation")
    assert re.fullmatch(
        rf"its task \(id {deleted}\) was deleted on {WHEN} before its creation settled: "
        "replaying creates a new task for 'jira:TES-41'",
        plan.will,
    )
    assert plan.warning == "someone deleted that task: replay only if the task should exist"
    assert plan.needs_consent
    assert (replayed(store, pk).outcome, len(tasks_of(store.sessions, feed.workspace_id))) == (
        "created",
        1,
    )


def test_a_create_whose_task_is_gone_but_whose_identity_is_held_again_finds_it(store: Store):
    feed = make_feed(store.sessions)
    pk, _ = a_create_deleted_before_it_settled(store, feed)
    holder = created_over_rest(store, feed, "jira:TES-41")

    plan = plan_of(store, pk)

    assert plan.will.endswith(
        "and 'jira:TES-41' is held by ACME-2 now: replaying finds it, no new task"
    )
    assert not plan.needs_consent
    again = replayed(store, pk)
    assert (again.outcome, again.task_id) == ("found_settled", holder)


def test_a_dead_create_whose_task_is_unsettled_finishes_it(store: Store):
    feed = make_feed(store.sessions)
    pk = crashed_create(store, feed)
    expire_lease(store, pk)
    settle_as(store, pk, DeliveryStatus.DEAD, reason="database errors, 2 retries spent")

    plan = plan_of(store, pk)

    assert plan.will == "it finishes its own create of ACME-1 and settles it: no new task"
    assert not plan.needs_consent
    assert replayed(store, pk).outcome == "created"
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert task.external_id_settled_at is not None


def test_a_delivery_whose_identity_is_held_finds_its_task(store: Store):
    feed = make_feed(store.sessions)
    holder = created_over_rest(store, feed)
    pk = a_dead_issue(store, feed)

    plan = plan_of(store, pk)

    assert plan.will == f"{ISSUE!r} is held by ACME-1: replaying finds it, no new task"
    assert not plan.needs_consent
    again = replayed(store, pk)
    assert (again.outcome, again.task_id) == ("found_settled", holder)


def test_after_a_release_it_creates_a_new_task_without_asking(store: Store):
    feed = make_feed(store.sessions)
    released = created_over_rest(store, feed)
    release(store, feed.workspace_id, ISSUE)
    pk = a_dead_issue(store, feed)

    plan = plan_of(store, pk)

    assert re.fullmatch(
        rf"no task holds {ISSUE!r} since its release from task {released} on {WHEN}: "
        "replaying creates a new task",
        plan.will,
    )
    assert not plan.needs_consent
    assert replayed(store, pk).outcome == "created"


def test_after_its_task_was_deleted_it_creates_a_new_one_and_warns(store: Store):
    feed = make_feed(store.sessions)
    deleted = created_over_rest(store, feed)
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=deleted)
    pk = a_dead_issue(store, feed)

    plan = plan_of(store, pk)

    assert re.fullmatch(
        rf"no task holds {ISSUE!r}: its task \(id {deleted}\) was deleted on {WHEN}; "
        "replaying creates a new task",
        plan.will,
    )
    assert plan.warning == (
        "someone deleted the task for this item: replay only if it should exist again"
    )
    assert replayed(store, pk).outcome == "created"


def test_an_identity_never_held_is_created_and_an_unread_body_is_read_afresh(store: Store):
    feed = make_feed(store.sessions)
    read = a_dead_issue(store, feed)
    unread = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud", read=False)
    settle_as(store, unread, DeliveryStatus.DEAD, reason="database errors, 2 retries spent")

    assert plan_of(store, read).will == f"no task holds {ISSUE!r}: replaying creates one"
    assert plan_of(store, unread).will == (
        "the worker reads its body afresh: it creates the task the body describes, or finds "
        "the one holding its identity"
    )
    assert plan_of(store, unread).external_id is None


def test_a_delivery_that_cannot_be_replayed_or_does_not_exist_is_refused(store: Store):
    feed = make_feed(store.sessions)
    done = store_fixture(store.sessions, feed, "github", "issues__opened")
    run(store, done)

    with pytest.raises(NotReplayable, match=f"delivery {done} is done; only dead, mismatch"):
        plan_of(store, done)
    with pytest.raises(DeliveryNotFound, match="delivery 999 not found"):
        plan_of(store, 999)
    assert delivery(store.sessions, done).status == "done"
