"""Which deliveries the fast path takes, and that it writes what the general path writes.

The fast path (models.fastpath) takes only the plain case: a create event for
an identity nobody holds, in a workspace whose intake step has no WIP limit,
stored with the draft the ingress read and no task from an earlier attempt.
Everything else goes to the general path. Each test runs on SQLite and on
PostgreSQL, with the fast path on and off: the rows a plain create leaves
are the same on all four, whichever executor wrote them.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select, update

from models.db import session_scope
from models.inbox import DeliveryStatus
from models.tables import Delivery, Task, TaskEvent, TaskSource, WebhookSource
from tests.support.feeds import Feed, make_feed, store_fixture
from tests.support.runs import crashed_create, expire_lease, run
from tests.support.stores import Store


def test_a_plain_create_leaves_the_same_rows_on_every_path(store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")

    processed = run(store, pk)

    assert processed.path == ("fast" if store.takes_fast_path else "general")
    with store.sessions() as session:
        task = session.scalars(select(Task)).one()
        source = session.scalars(select(TaskSource)).one()
        event = session.scalars(select(TaskEvent)).one()
        row = session.get(Delivery, pk)
    assert (task.identifier, task.external_id, task.created_by_delivery) == (
        "ACME-1",
        "jira:TES-41",
        pk,
    )
    assert task.title == row.draft_title and task.description == row.draft_description
    assert task.external_id_settled_at is not None and task.archived_at is None
    assert (source.task_id, source.provider, source.url, source.remote_key) == (
        task.id,
        "jira",
        "https://acme.atlassian.net/browse/TES-41",
        "TES-41",
    )
    assert (event.position, event.type, event.task_id, event.external_id) == (
        1,
        "task.created",
        task.id,
        "jira:TES-41",
    )
    assert (
        row.status,
        row.outcome,
        row.task_id,
        row.created_task_id,
        row.attempts,
        row.retries,
        row.status_reason,
        row.lease_expires_at,
        row.last_error,
    ) == ("done", "created", task.id, task.id, 1, 0, None, None, None)
    assert store.scalar("SELECT task_sequence FROM workspaces") == 1


# --- not the plain case: each goes to the general path, on every store ------------------


def _held(store: Store, feed: Feed) -> tuple[int, str]:
    first = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    run(store, first)
    return store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud"), "found_settled"


def _not_a_create_event(store: Store, feed: Feed) -> tuple[int, str | None]:
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    with session_scope(store.sessions) as session:  # the source changed after it was stored
        session.execute(
            update(WebhookSource)
            .where(WebhookSource.id == feed.jira_source_id)
            .values(create_events=["jira:issue_updated"])
        )
    return pk, None


def _limited_intake_step(store: Store, feed: Feed) -> tuple[int, str]:
    with store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE workflow_steps SET wip_limit = 5")
    return store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud"), "created"


def _an_earlier_attempts_task(store: Store, feed: Feed) -> tuple[int, str]:
    pk = crashed_create(store, feed)
    expire_lease(store, pk)
    return pk, "created"


def _a_blank_stored_identity(store: Store, feed: Feed) -> tuple[int, str]:
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    with session_scope(store.sessions) as session:  # as no ingress keeps it
        session.execute(update(Delivery).where(Delivery.id == pk).values(external_id=" \u3000 "))
    return pk, "created"  # from the body, read afresh


def _no_draft(store: Store, feed: Feed) -> tuple[int, str]:
    return store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud", read=False), (
        "created"
    )


NOT_PLAIN: dict[str, Callable[[Store, Feed], tuple[int, str | None]]] = {
    "identity-held": _held,
    "not-a-create-event": _not_a_create_event,
    "limited-intake-step": _limited_intake_step,
    "earlier-attempts-task": _an_earlier_attempts_task,
    "blank-stored-identity": _a_blank_stored_identity,
    "no-draft": _no_draft,
}


@pytest.mark.parametrize("case", list(NOT_PLAIN))
def test_what_is_not_the_plain_case_goes_to_the_general_path(store: Store, case: str):
    feed = make_feed(store.sessions)
    pk, outcome = NOT_PLAIN[case](store, feed)

    processed = run(store, pk)

    assert processed.path == "general"
    assert processed.outcome == outcome
    expected = DeliveryStatus.IGNORED if outcome is None else DeliveryStatus.DONE
    assert processed.status is expected
    assert store.scalar("SELECT count(*) FROM tasks WHERE external_id_settled_at IS NULL") == 0
