"""The operators' read-only reports, on both databases.

Scenarios are built with ``tests/integration/scenarios.py``, as in
``test_cli.py``.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta

import pytest
from sqlalchemy import update

from models.db import session_scope
from models.errors import DeliveryNotFound, InvalidExternalId, WorkspaceNotAccessible
from models.inbox import DeliveryStatus
from models.reports import (
    inbox_stats,
    list_deliveries,
    list_source_summaries,
    list_workspaces,
    show_delivery,
    timeline,
)
from models.sources import add_secret
from models.tables import Delivery, utcnow
from models.tasks import (
    delete_task,
)
from tests.conftest import TRUSTED, Store
from tests.integration.scenarios import (
    EXTERNAL_ID,
    SECRET,
    a_delivery,
    a_source,
    create_by,
    lineage_of,
    park,
    release,
    settle_as,
)

# --- reports --------------------------------------------------------------------------------


def test_workspaces_are_listed_with_their_task_and_source_counts(store: Store):
    acme = store.workspace("acme", "ACME")
    store.workspace("beta", "BETA")
    create_by(store, acme.id, a_delivery(store, a_source(store, acme.id), "d-1"))

    with store.sessions() as session:
        found = list_workspaces(session=session)

    assert [(w.slug, w.task_prefix, w.tasks, w.sources) for w in found] == [
        ("acme", "ACME", 1, 1),
        ("beta", "BETA", 0, 0),
    ]


def test_sources_count_active_secrets_and_never_carry_one(store: Store):
    acme = store.workspace()
    a_source(store, acme.id)
    with session_scope(store.sessions) as session:
        add_secret(session=session, slug="acme-github", new_secret="another-secret-9c1")

    with store.sessions() as session:
        (found,) = list_source_summaries(session=session)

    assert (found.slug, found.workspace, found.active_secrets, found.enabled) == (
        "acme-github",
        "acme",
        2,
        True,
    )
    assert SECRET not in repr(asdict(found))
    assert "another-secret-9c1" not in repr(asdict(found))


# --- deliveries ---------------------------------------------------------------------------


def test_deliveries_page_newest_first_by_key(store: Store):
    source_id = a_source(store, store.workspace().id)
    pks = [a_delivery(store, source_id, f"d-{n}") for n in range(5)]

    pages, before = [], None
    while True:
        with store.sessions() as session:
            page = list_deliveries(session=session, limit=2, before=before)
        pages.append([d.id for d in page.deliveries])
        if page.next_before is None:
            break
        before = page.next_before

    newest_first = pks[::-1]
    assert pages == [newest_first[0:2], newest_first[2:4], newest_first[4:]]


def test_deliveries_filter_by_status(store: Store):
    source_id = a_source(store, store.workspace().id)
    queued = a_delivery(store, source_id, "d-queued")
    dead = a_delivery(store, source_id, "d-dead")
    settle_as(store, dead, DeliveryStatus.DEAD, error="payload is not an issue")

    with store.sessions() as session:
        dead_page = list_deliveries(session=session, status="dead")
        queued_page = list_deliveries(session=session, status=DeliveryStatus.QUEUED)

    assert [(d.id, d.last_error) for d in dead_page.deliveries] == [
        (dead, "payload is not an issue")
    ]
    assert [d.id for d in queued_page.deliveries] == [queued]
    assert dead_page.next_before is None


def test_a_page_has_a_sane_size(store: Store):
    with store.sessions() as session, pytest.raises(ValueError):
        list_deliveries(session=session, limit=0)


def test_showing_a_delivery_never_shows_a_signature_or_credential(store: Store):
    source_id = a_source(store, store.workspace().id)
    # Stored headers are an allowlist at the ingress; the report filters again anyway.
    pk = a_delivery(
        store,
        source_id,
        "d-1",
        headers={
            "X-GitHub-Event": "issues",
            "X-Hub-Signature-256": "sha256=deadbeef",
            "Authorization": "Bearer abc",
        },
    )

    with store.sessions() as session:
        detail = show_delivery(session=session, delivery_pk=pk)

    assert detail.headers == {"X-GitHub-Event": "issues"}
    assert (detail.summary.source, detail.workspace, detail.body_bytes) == (
        "acme-github",
        "acme",
        len(b'{"action": "opened", "delivery": "d-1"}'),
    )
    assert "deadbeef" not in repr(asdict(detail))


def test_showing_an_unknown_delivery_is_not_found(store: Store):
    with store.sessions() as session, pytest.raises(DeliveryNotFound):
        show_delivery(session=session, delivery_pk=404)


# --- lineage ------------------------------------------------------------------------------


def test_lineage_of_a_settled_task_names_every_delivery_that_touched_it(store: Store):
    acme = store.workspace()
    source_id = a_source(store, acme.id)
    first = a_delivery(store, source_id, "d-1")
    task_id = create_by(store, acme.id, first)
    duplicate = a_delivery(store, source_id, "d-2")
    settle_as(store, duplicate, DeliveryStatus.DONE, outcome="found_settled", task_id=task_id)
    a_delivery(store, source_id, "d-unrelated")

    found = lineage_of(store)

    assert found.holder.id == task_id
    assert (found.holder.identifier, found.holder.settled, found.holder.archived) == (
        "ACME-1",
        True,
        False,
    )
    assert found.holder.source_url == "https://github.com/acme/api/issues/12"
    assert [(d.id, d.outcome) for d in found.deliveries] == [
        (first, "created"),
        (duplicate, "found_settled"),
    ]
    assert found.deliveries_of(task_id) == found.deliveries


def test_lineage_finds_the_creating_delivery_that_died_before_recording_its_outcome(store: Store):
    acme = store.workspace()
    source_id = a_source(store, acme.id)
    creator = a_delivery(store, source_id, "d-1")
    task_id = create_by(store, acme.id, creator, crash_before_settle=True)
    waiting = a_delivery(store, source_id, "d-2")
    park(store, waiting, task_id)

    found = lineage_of(store)

    assert found.holder.settled is False
    assert found.holder.created_by_delivery == creator
    # The creator's row names no task (it died first): tasks.created_by_delivery finds it.
    assert [(d.id, d.status, d.task_id) for d in found.deliveries] == [
        (creator, "processing", None),
        (waiting, "needs_operator", task_id),
    ]


def test_lineage_after_a_release_keeps_the_former_holder_and_the_audit(store: Store):
    acme = store.workspace()
    source_id = a_source(store, acme.id)
    old_task = create_by(
        store, acme.id, a_delivery(store, source_id, "d-1"), crash_before_settle=True
    )
    release(store, acme.id)

    released = lineage_of(store)
    assert released.holder is None
    assert released.known
    assert [t.id for t in released.former_holders] == [old_task]
    assert released.former_holders[0].external_id is None
    assert [(r.task_id, r.operator) for r in released.releases] == [(old_task, "alice")]
    assert [d.delivery_id for d in released.deliveries] == ["d-1"]

    new_task = create_by(store, acme.id, a_delivery(store, source_id, "d-2"))
    again = lineage_of(store)
    assert again.holder.id == new_task
    assert [t.id for t in again.former_holders] == [old_task]
    assert [d.delivery_id for d in again.deliveries] == ["d-1", "d-2"]
    assert [d.delivery_id for d in again.deliveries_of(new_task)] == ["d-2"]


def test_lineage_shows_a_holder_deleted_before_it_settled_and_the_deliveries_that_touched_it(
    store: Store,
):
    acme = store.workspace()
    source_id = a_source(store, acme.id)
    creator = a_delivery(store, source_id, "d-1")
    deleted = create_by(store, acme.id, creator, crash_before_settle=True)
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=deleted)

    found = lineage_of(store)

    assert found.known and found.holder is None
    assert [task.id for task in found.deleted_holders] == [deleted]
    assert [d.delivery_id for d in found.deliveries_of(deleted)] == ["d-1"]
    assert [event.what for event in timeline(found)] == [
        "delivery 1 received",
        f"task {deleted} created",
        "delivery 1 processing",
        f"task {deleted} deleted",
    ]

    holder = create_by(store, acme.id, a_delivery(store, source_id, "d-2"))
    again = lineage_of(store)
    assert again.holder.id == holder
    assert [task.id for task in again.deleted_holders] == [deleted]
    assert [d.delivery_id for d in again.deliveries] == ["d-1", "d-2"]


def test_lineage_is_scoped_to_its_workspace(store: Store):
    acme, beta = store.workspace("acme", "ACME"), store.workspace("beta", "BETA")
    create_by(store, acme.id, a_delivery(store, a_source(store, acme.id, "acme-github"), "d-1"))
    beta_task = create_by(
        store, beta.id, a_delivery(store, a_source(store, beta.id, "beta-github"), "d-1")
    )

    found = lineage_of(store, workspace="beta")

    assert found.holder.id == beta_task
    assert [d.source for d in found.deliveries] == ["beta-github"]


def test_lineage_of_an_identity_never_seen_is_unknown(store: Store):
    store.workspace()
    found = lineage_of(store, "jira:NOPE-1")
    assert (found.known, found.holder, found.deliveries) == (False, None, [])


def test_lineage_validates_the_external_id_and_the_workspace(store: Store):
    store.workspace()
    with pytest.raises(InvalidExternalId, match="control characters"):
        lineage_of(store, "jira:PROJ-1\n")
    with pytest.raises(InvalidExternalId, match="required"):
        lineage_of(store, "   ")
    with pytest.raises(WorkspaceNotAccessible):
        lineage_of(store, workspace="nope")


def test_lineage_matches_the_identity_byte_exactly_after_trimming(store: Store):
    acme = store.workspace()
    task_id = create_by(store, acme.id, a_delivery(store, a_source(store, acme.id), "d-1"))
    assert lineage_of(store, f"  {EXTERNAL_ID}\u3000").holder.id == task_id
    assert lineage_of(store, EXTERNAL_ID.upper()).holder is None


def test_the_timeline_reads_delivery_then_task_then_outcome_in_time_order(store: Store):
    acme = store.workspace()
    source_id = a_source(store, acme.id)
    creator = a_delivery(store, source_id, "d-1")
    task_id = create_by(store, acme.id, creator, crash_before_settle=True)
    waiting = a_delivery(store, source_id, "d-2")
    park(store, waiting, task_id)
    release(store, acme.id)

    events = timeline(lineage_of(store))

    assert [event.at for event in events] == sorted(event.at for event in events)
    assert [event.what for event in events] == [
        f"delivery {creator} received",
        "task ACME-1 created",
        # The insert's fence is the creator's last row update: it died after the insert.
        f"delivery {creator} processing",
        f"delivery {waiting} received",
        f"delivery {waiting} needs_operator",
        "identity released from ACME-1",
    ]
    assert "found_unsettled, ACME-1" in events[4].detail
    assert events[-1].detail == "by alice: creating worker died"


# --- stats --------------------------------------------------------------------------------


def test_stats_count_by_status_and_age_the_oldest_queued_delivery(store: Store):
    source_id = a_source(store, store.workspace().id)
    old = a_delivery(store, source_id, "d-old")
    a_delivery(store, source_id, "d-new")
    settle_as(store, a_delivery(store, source_id, "d-dead"), DeliveryStatus.DEAD, error="bad")
    received = utcnow() - timedelta(minutes=10)
    with session_scope(store.sessions) as session:
        session.execute(update(Delivery).where(Delivery.id == old).values(received_at=received))

    with store.sessions() as session:
        found = inbox_stats(session=session, now=received + timedelta(minutes=10, seconds=5))

    assert found.counts == {
        "queued": 2,
        "processing": 0,
        "done": 0,
        "ignored": 0,
        "replay": 0,
        "mismatch": 0,
        "needs_operator": 0,
        "dead": 1,
    }
    assert found.oldest_queued_at == received
    assert found.oldest_queued_age_seconds == 605.0


def test_stats_of_an_empty_inbox_have_no_age(store: Store):
    with store.sessions() as session:
        found = inbox_stats(session=session)
    assert (found.oldest_queued_at, found.oldest_queued_age_seconds) == (None, None)
    assert set(found.counts.values()) == {0}
