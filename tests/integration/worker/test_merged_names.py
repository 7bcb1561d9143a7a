"""Deliveries under a name an operator merged into another task, as the worker
runs them: on SQLite and PostgreSQL, on the fast path and the general path
(tests/integration/worker/conftest.py; docs/contract.md §15, item 10)."""

from __future__ import annotations

from models.access import Caller
from models.db import session_scope
from models.inbox import DeliveryStatus
from models.merges import merge, unmerge
from models.tasks import NewTask, create_task
from tests.support.feeds import make_feed, store_fixture, tasks_of
from tests.support.runs import run
from tests.support.stores import Store

JIRA_CREATED = "jira_issue_created__cloud"
#: The fixture's issue, as the Jira site migration renamed it...
EXTERNAL_ID = "jira:TES-41"
#: ...and as the old site knew it: a task of its own, made before.
OLD_SITE = "jira:OLD-41"
OPERATOR = Caller.trusted("test")


def _two_tasks_merged(store: Store, feed) -> tuple[int, int, int]:
    with session_scope(store.sessions) as session:
        old = create_task(
            session=session,
            caller=OPERATOR,
            workspace_id=feed.workspace_id,
            new=NewTask(title="from the old site", external_id=OLD_SITE),
        ).task.id
    first = run(store, store_fixture(store.sessions, feed, "jira", JIRA_CREATED))
    assert first.outcome == "created"
    with session_scope(store.sessions) as session:
        merge_id = merge(
            session=session,
            caller=OPERATOR,
            into_task_id=old,
            from_task_id=first.task_id,
            operator="ops",
            reason="the Jira site migration",
        ).id
    return old, first.task_id, merge_id


def test_a_webhook_under_a_merged_name_is_found_on_the_task_merged_into(store: Store):
    feed = make_feed(store.sessions)
    old, _, _ = _two_tasks_merged(store, feed)

    again = run(store, store_fixture(store.sessions, feed, "jira", JIRA_CREATED))

    assert (again.status, again.outcome, again.task_id) == (
        DeliveryStatus.DONE,
        "found_settled",
        old,
    )
    assert len(tasks_of(store.sessions, feed.workspace_id)) == 2


def test_a_search_under_a_merged_name_is_found_too(store: Store):
    feed = make_feed(store.sessions)
    old, _, _ = _two_tasks_merged(store, feed)

    scan = run(store, store_fixture(store.sessions, feed, "jira", JIRA_CREATED, origin="scan"))

    assert (scan.outcome, scan.task_id) == ("found_settled", old)


def test_after_an_undo_a_webhook_finds_the_task_merged_from_again(store: Store):
    feed = make_feed(store.sessions)
    _, merged_from, merge_id = _two_tasks_merged(store, feed)
    with session_scope(store.sessions) as session:
        unmerge(session=session, caller=OPERATOR, merge_id=merge_id, operator="ops", reason="wrong")

    again = run(store, store_fixture(store.sessions, feed, "jira", JIRA_CREATED))

    assert (again.outcome, again.task_id) == ("found_settled", merged_from)
