"""A paused source's deliveries wait in the inbox until it resumes.

An operator pauses a source in a storm (docs/runbook.md, "A storm"): the
ingress stores its deliveries and sends none, but messages sent before the
pause are already in the broker, and the sweeper would send the rest. So the
claim itself leaves a paused source's delivery as it is -- on the general
path and the fast path, on each database -- and the sweeper passes it by;
once the source resumes, its backlog is sent and processed to the end.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from models.db import session_scope
from models.sources import pause_source, resume_source
from models.tables import Delivery, WebhookSource, utcnow
from tests.support.feeds import delivery, make_feed, store_fixture, tasks_of
from tests.support.runs import crashed_create, expire_lease, run
from tests.support.stores import Store
from worker.sweeper import send_backlog, sweep


def slug_of(store: Store, source_id: int) -> str:
    with session_scope(store.sessions) as session:
        return session.get(WebhookSource, source_id).slug


def pause(store: Store, source_id: int) -> None:
    with session_scope(store.sessions) as session:
        pause_source(session=session, slug=slug_of(store, source_id))


def age(store: Store, *pks: int) -> None:
    """Make queued rows old enough for the sweeper."""
    with session_scope(store.sessions) as session:
        session.execute(
            update(Delivery)
            .where(Delivery.id.in_(pks))
            .values(updated_at=utcnow() - timedelta(minutes=5))
        )


def swept(store: Store) -> list[int]:
    sent: list[int] = []
    with session_scope(store.sessions) as session:
        sweep(session=session, queued_grace_seconds=60, send=sent.append)
    return sent


def backlog(store: Store, source_id: int) -> list[int]:
    sent: list[int] = []
    with session_scope(store.sessions) as session:
        send_backlog(session=session, source_id=source_id, send=sent.append)
    return sent


def test_a_paused_source_is_not_claimed_nor_swept_until_it_resumes(store: Store):
    feed = make_feed(store.sessions)
    held = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    other = store_fixture(store.sessions, feed, "github", "issues__opened")
    pause(store, feed.jira_source_id)

    # A message sent before the pause: the worker leaves the row queued.
    assert run(store, held).status is None
    assert delivery(store.sessions, held).status == "queued"
    assert delivery(store.sessions, held).attempts == 0
    # The workspace's other source goes on.
    assert run(store, other).status == "done"

    age(store, held)
    assert swept(store) == []

    with session_scope(store.sessions) as session:
        resume_source(session=session, slug=slug_of(store, feed.jira_source_id))
    # The resumed source's backlog, with no grace: all of it, at once.
    assert backlog(store, feed.jira_source_id) == [held]
    assert run(store, held).status == "done"
    assert len(tasks_of(store.sessions, feed.workspace_id)) == 2


def test_a_dead_workers_delivery_of_a_paused_source_waits_too(store: Store):
    feed = make_feed(store.sessions)
    dead_worker = crashed_create(store, feed)
    expire_lease(store, dead_worker)
    source_id = store_source_of(store, dead_worker)
    pause(store, source_id)

    assert swept(store) == []
    assert run(store, dead_worker).status is None

    with session_scope(store.sessions) as session:
        resume_source(session=session, slug=slug_of(store, source_id))
    assert backlog(store, source_id) == [dead_worker]
    assert run(store, dead_worker).status == "done"


def store_source_of(store: Store, pk: int) -> int:
    return delivery(store.sessions, pk).source_id
