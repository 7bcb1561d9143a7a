"""The operators' read-only reports, on both databases.

Scenarios are built with ``tests/support/scenarios.py``, as in
the CLI's tests (tests/integration/cli/).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete, update

from models import reports
from models.db import session_scope
from models.errors import (
    DeliveryNotFound,
    InvalidExternalId,
    InvalidFilter,
    TokenNotFound,
    WorkspaceNotAccessible,
)
from models.inbox import DeliveryStatus, IncomingDelivery, first_received_since, record_delivery
from models.reports import (
    LastDeliveries,
    deliveries_per_minute,
    inbox_stats,
    known_events,
    list_deliveries,
    list_source_summaries,
    list_workspaces,
    show_delivery,
    timeline,
    workspace_backlogs,
)
from models.sources import add_secret
from models.tables import Delivery, utcnow
from models.tasks import (
    delete_task,
)
from models.tokens import issue_token, list_tokens, revoke_token
from tests.support.scenarios import (
    EXTERNAL_ID,
    SECRET,
    a_backlog,
    a_delivery,
    a_source,
    create_by,
    lineage_of,
    park,
    release,
    settle_as,
)
from tests.support.stores import TRUSTED, Store

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)

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


def test_lineage_after_a_release_keeps_the_former_holders_settlement(store: Store):
    acme = store.workspace()
    source_id = a_source(store, acme.id)
    settled_task = create_by(store, acme.id, a_delivery(store, source_id, "d-1"))
    release(store, acme.id)
    unsettled_task = create_by(
        store, acme.id, a_delivery(store, source_id, "d-2"), crash_before_settle=True
    )
    release(store, acme.id)

    found = lineage_of(store)

    settled, unsettled = found.former_holders
    assert (settled.id, unsettled.id) == (settled_task, unsettled_task)
    # The release cleared the row's stamp; the history still says it settled.
    assert settled.settled and settled.settled_at >= settled.created_at
    assert settled.released_at == found.releases[0].released_at
    assert settled.state == "settled, then released"
    # Released before its create settled: the late task.created says nothing else.
    assert not unsettled.settled
    assert unsettled.state == "not settled, then released"
    assert [event.what for event in timeline(found)] == [
        "delivery 1 received",
        "task ACME-1 created",
        "task ACME-1 settled",
        "delivery 1 done",
        "identity released from ACME-1",
        "delivery 2 received",
        "task ACME-2 created",
        "delivery 2 processing",
        "identity released from ACME-2",
    ]


def test_lineage_shows_the_deliveries_that_named_an_identity_no_task_ever_held(store: Store):
    acme = store.workspace()
    source_id = a_source(store, acme.id)
    parked = a_delivery(store, source_id, "d-1", external_id=EXTERNAL_ID)
    settle_as(
        store,
        parked,
        DeliveryStatus.NEEDS_OPERATOR,
        reason="workspace 1: step 'Inbox' is at its WIP limit of 0",
    )
    waiting = a_delivery(store, source_id, "d-2", external_id=EXTERNAL_ID)
    a_delivery(store, source_id, "d-other", external_id="gh-issue/acme/api#13")
    beta = store.workspace("beta", "BETA")
    a_delivery(store, a_source(store, beta.id, "beta-github"), "d-1", external_id=EXTERNAL_ID)

    found = lineage_of(store)

    assert found.known and found.holder is None
    assert [(d.id, d.delivery_id, d.status) for d in found.without_task] == [
        (parked, "d-1", "needs_operator"),
        (waiting, "d-2", "queued"),
    ]
    assert found.deliveries == found.without_task
    assert [event.what for event in timeline(found)] == [
        f"delivery {parked} received",
        f"delivery {parked} needs_operator",
        f"delivery {waiting} received",
        f"delivery {waiting} queued",
    ]

    # Once a task holds it, the parked delivery is still in its lineage, apart.
    holder = create_by(store, acme.id, waiting)
    again = lineage_of(store)
    assert again.holder.id == holder
    assert [d.id for d in again.deliveries] == [parked, waiting]
    assert [d.id for d in again.without_task] == [parked]


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


# --- sources: last delivery, scope ------------------------------------------------------------


def _received(store: Store, pk: int, at: datetime) -> None:
    with session_scope(store.sessions) as session:
        session.execute(update(Delivery).where(Delivery.id == pk).values(received_at=at))


def _recovered(store: Store, source_id: int, delivery_id: str) -> int:
    incoming = IncomingDelivery(
        source_id=source_id,
        delivery_id=delivery_id,
        body=b'{"recovered": "%s"}' % delivery_id.encode(),
        event="issues.opened",
        action="opened",
        headers={},
        content_type="application/json",
        origin="catch-up",
    )
    with session_scope(store.sessions) as session:
        return record_delivery(session=session, incoming=incoming).pk


def test_sources_show_their_last_webhook_delivery_and_only_their_workspaces(store: Store):
    acme, beta = store.workspace("acme", "ACME"), store.workspace("beta", "BETA")
    acme_source = a_source(store, acme.id, "acme-github")
    beta_source = a_source(store, beta.id, "beta-github")
    a_source(store, beta.id, "beta-silent")
    _received(store, a_delivery(store, acme_source, "d-1"), T0)
    _received(store, a_delivery(store, acme_source, "d-2"), T0 + timedelta(minutes=1))
    _received(store, a_delivery(store, beta_source, "d-3"), T0 + timedelta(minutes=2))
    # A catch-up's row says the webhook did not get through: it does not count.
    _received(store, _recovered(store, acme_source, "d-4"), T0 + timedelta(minutes=3))
    with session_scope(store.sessions) as session:
        add_secret(session=session, slug="beta-github", new_secret="another-secret-9c1")

    with store.sessions() as session:
        every = list_source_summaries(session=session)
        only_beta = list_source_summaries(session=session, workspace_ids=frozenset({beta.id}))
        none = list_source_summaries(session=session, workspace_ids=frozenset())

    assert [(s.slug, s.last_delivery_at, s.rotating) for s in every] == [
        ("acme-github", T0 + timedelta(minutes=1), False),
        ("beta-github", T0 + timedelta(minutes=2), True),
        ("beta-silent", None, False),
    ]
    assert [s.slug for s in only_beta] == ["beta-github", "beta-silent"]
    assert none == []


def test_kept_last_deliveries_take_in_what_arrived_since_the_last_read(store: Store):
    source_id = a_source(store, store.workspace().id)
    kept = LastDeliveries()

    def last_delivery() -> datetime | None:
        with store.sessions() as session:
            (found,) = list_source_summaries(session=session, last_deliveries=kept)
        return found.last_delivery_at

    assert last_delivery() is None
    _received(store, a_delivery(store, source_id, "d-1"), T0)
    assert last_delivery() == T0
    _received(store, a_delivery(store, source_id, "d-2"), T0 + timedelta(seconds=30))
    assert last_delivery() == T0 + timedelta(seconds=30)
    assert last_delivery() == T0 + timedelta(seconds=30)


def test_stats_are_scoped_to_the_workspaces_given(store: Store):
    acme, beta = store.workspace("acme", "ACME"), store.workspace("beta", "BETA")
    acme_source = a_source(store, acme.id, "acme-github")
    beta_source = a_source(store, beta.id, "beta-github")
    old = a_delivery(store, acme_source, "d-1")
    _received(store, old, T0)
    settle_as(store, a_delivery(store, beta_source, "d-2"), DeliveryStatus.DEAD, error="bad")
    a_delivery(store, beta_source, "d-3")

    with store.sessions() as session:
        every = inbox_stats(session=session)
        only_beta = inbox_stats(session=session, workspace_ids=frozenset({beta.id}))
        only_acme = inbox_stats(session=session, workspace_ids=frozenset({acme.id}))

    assert (every.counts["queued"], every.counts["dead"], every.oldest_queued_at) == (2, 1, T0)
    assert (only_beta.counts["queued"], only_beta.counts["dead"]) == (1, 1)
    assert only_beta.oldest_queued_at > T0
    assert (only_acme.counts["queued"], only_acme.counts["dead"], only_acme.oldest_queued_at) == (
        1,
        0,
        T0,
    )


# --- backed-up workspaces ---------------------------------------------------------------------


def test_a_workspace_s_backlog_is_its_queued_and_processing_deliveries(store: Store):
    acme, beta = store.workspace("acme", "ACME"), store.workspace("beta", "BETA")
    gamma, idle = store.workspace("gamma", "GAMMA"), store.workspace("idle", "IDLE")
    acme_github, acme_jira = (
        a_source(store, acme.id, "acme-github"),
        a_source(store, acme.id, "acme-jira"),
    )
    # Two sources of one workspace add up; the oldest queued is either one's.
    a_backlog(store, acme_github, queued=2, processing=1, finished=5, received_at=T0)
    a_backlog(store, acme_jira, queued=1, received_at=T0 - timedelta(minutes=3))
    # A processing delivery received earlier is no queued one: it does not age the backlog.
    a_backlog(store, acme_jira, processing=1, received_at=T0 - timedelta(hours=1))
    a_backlog(store, a_source(store, beta.id, "beta-github"), processing=2, received_at=T0)
    gamma_source = a_source(store, gamma.id, "gamma-github")
    a_backlog(store, gamma_source, queued=1, received_at=T0 + timedelta(minutes=1))
    settle_as(store, a_delivery(store, gamma_source, "d-dead"), DeliveryStatus.DEAD, error="x")
    settle_as(store, a_delivery(store, gamma_source, "d-parked"), DeliveryStatus.NEEDS_OPERATOR)
    a_backlog(store, a_source(store, idle.id, "idle-github"), finished=3)

    with store.sessions() as session:
        found = workspace_backlogs(session=session, top=10, now=T0 + timedelta(minutes=10))

    assert [
        (w.slug, w.backlog, w.oldest_queued_at, w.oldest_queued_age_seconds) for w in found.largest
    ] == [
        ("acme", 5, T0 - timedelta(minutes=3), 780.0),
        # Only processing ones: a backlog, but no queued delivery waits.
        ("beta", 2, None, None),
        # Its dead and parked deliveries are finished: no backlog.
        ("gamma", 1, T0 + timedelta(minutes=1), 540.0),
    ]
    assert (found.rest_workspaces, found.rest_backlog, found.rest_oldest_queued_at) == (0, 0, None)
    assert found.largest[0].workspace_id == acme.id


def test_equal_backlogs_list_the_longest_wait_first_then_by_slug(store: Store):
    slugs = ["delta", "alpha", "charlie", "bravo"]
    sources = {
        slug: a_source(store, store.workspace(slug, slug.upper()).id, f"{slug}-s") for slug in slugs
    }
    a_backlog(store, sources["delta"], queued=2, received_at=T0)
    a_backlog(store, sources["charlie"], queued=2, received_at=T0 - timedelta(seconds=1))
    a_backlog(store, sources["alpha"], processing=2)
    a_backlog(store, sources["bravo"], processing=2)

    with store.sessions() as session:
        found = workspace_backlogs(session=session, top=10, now=T0 + timedelta(minutes=1))

    assert [w.slug for w in found.largest] == ["charlie", "delta", "alpha", "bravo"]


def test_beyond_the_top_the_workspaces_are_folded_into_one(store: Store):
    waits = {"w1": 1, "w2": 7, "w3": 3, "w4": 9, "w5": 5}
    for number, (slug, minutes) in enumerate(waits.items(), start=1):
        source = a_source(store, store.workspace(slug, slug.upper()).id, f"{slug}-github")
        # w1 the largest backlog, w5 the smallest.
        a_backlog(store, source, queued=6 - number, received_at=T0 - timedelta(minutes=minutes))
    a_backlog(store, a_source(store, store.workspace("w6", "W6").id, "w6-github"), processing=1)

    with store.sessions() as session:
        top_two = workspace_backlogs(session=session, top=2, now=T0)
        none_listed = workspace_backlogs(session=session, top=0, now=T0)
        every = workspace_backlogs(session=session, top=100, now=T0)

    assert [(w.slug, w.backlog) for w in top_two.largest] == [("w1", 5), ("w2", 4)]
    # w3, w4, w5 and w6: 3 + 2 + 1 + 1, the longest wait w4's 9 minutes.
    assert (top_two.rest_workspaces, top_two.rest_backlog) == (4, 7)
    assert top_two.rest_oldest_queued_at == T0 - timedelta(minutes=9)
    assert top_two.rest_oldest_queued_age_seconds == 540.0
    assert none_listed.largest == []
    assert (none_listed.rest_workspaces, none_listed.rest_backlog) == (6, 16)
    assert none_listed.rest_oldest_queued_age_seconds == 540.0
    assert len(every.largest) == 6 and every.rest_workspaces == 0
    assert every.rest_oldest_queued_age_seconds is None


def test_the_folded_rest_has_no_wait_when_none_of_it_is_queued(store: Store):
    for slug, kind in (("big", "queued"), ("small", "processing")):
        source = a_source(store, store.workspace(slug, slug.upper()).id, f"{slug}-github")
        a_backlog(store, source, **{kind: 3 if slug == "big" else 1}, received_at=T0)

    with store.sessions() as session:
        found = workspace_backlogs(session=session, top=1, now=T0 + timedelta(seconds=30))

    assert [(w.slug, w.oldest_queued_age_seconds) for w in found.largest] == [("big", 30.0)]
    assert (found.rest_workspaces, found.rest_backlog) == (1, 1)
    assert (found.rest_oldest_queued_at, found.rest_oldest_queued_age_seconds) == (None, None)


def test_backlogs_are_scoped_to_the_workspaces_given(store: Store):
    acme, beta = store.workspace("acme", "ACME"), store.workspace("beta", "BETA")
    a_backlog(store, a_source(store, acme.id, "acme-github"), queued=1)
    a_backlog(store, a_source(store, beta.id, "beta-github"), queued=4)

    with store.sessions() as session:
        only_acme = workspace_backlogs(session=session, top=1, workspace_ids=frozenset({acme.id}))
        nobody = workspace_backlogs(session=session, top=1, workspace_ids=frozenset())

    assert [(w.slug, w.backlog) for w in only_acme.largest] == [("acme", 1)]
    # Another workspace is not even in the folded rest.
    assert (only_acme.rest_workspaces, only_acme.rest_backlog) == (0, 0)
    assert nobody == reports.Backlogs(largest=[])


def test_an_empty_inbox_has_no_backlog(store: Store):
    store.workspace()
    with store.sessions() as session:
        assert workspace_backlogs(session=session, top=10) == reports.Backlogs(largest=[])
        with pytest.raises(ValueError, match="top must be >= 0"):
            workspace_backlogs(session=session, top=-1)


# --- the chart: deliveries per minute ----------------------------------------------------------


def test_the_chart_counts_each_minute_by_status_and_fills_the_quiet_ones(store: Store):
    source_id = a_source(store, store.workspace().id)
    times = [
        T0 - timedelta(minutes=3),  # before the chart
        T0 + timedelta(seconds=10),
        T0 + timedelta(seconds=50),
        T0 + timedelta(minutes=2, seconds=1),
        T0 + timedelta(minutes=3, seconds=59),
        T0 + timedelta(minutes=9),  # after now
    ]
    pks = []
    for n, at in enumerate(times):
        pks.append(a_delivery(store, source_id, f"d-{n}"))
        _received(store, pks[-1], at)
    settle_as(store, pks[2], DeliveryStatus.DEAD, error="bad")

    with store.sessions() as session:
        rate = deliveries_per_minute(
            session=session, since=T0 + timedelta(seconds=30), now=T0 + timedelta(minutes=4)
        )

    assert rate.minutes == [T0 + timedelta(minutes=n) for n in range(5)]
    assert rate.counts == {"dead": [1, 0, 0, 0, 0], "queued": [1, 0, 1, 1, 0]}


def test_the_chart_of_an_empty_or_quiet_inbox_is_all_minutes_and_no_status(store: Store):
    with store.sessions() as session:
        empty = deliveries_per_minute(session=session, since=T0, now=T0 + timedelta(minutes=2))
    assert (empty.minutes, empty.counts) == ([T0 + timedelta(minutes=n) for n in range(3)], {})

    source_id = a_source(store, store.workspace().id)
    _received(store, a_delivery(store, source_id, "d-1"), T0 - timedelta(hours=1))
    with store.sessions() as session:
        quiet = deliveries_per_minute(session=session, since=T0, now=T0 + timedelta(minutes=2))
    assert (len(quiet.minutes), quiet.counts) == (3, {})


def test_the_chart_is_scoped_and_bounded(store: Store):
    acme, beta = store.workspace("acme", "ACME"), store.workspace("beta", "BETA")
    _received(store, a_delivery(store, a_source(store, acme.id, "acme-github"), "d-1"), T0)
    _received(store, a_delivery(store, a_source(store, beta.id, "beta-github"), "d-2"), T0)

    with store.sessions() as session:
        scoped = deliveries_per_minute(
            session=session, since=T0, now=T0, workspace_ids=frozenset({beta.id})
        )
        assert scoped.counts == {"queued": [1]}
        with pytest.raises(InvalidFilter, match="at most 7 days"):
            deliveries_per_minute(session=session, since=T0 - timedelta(days=8), now=T0)
        with pytest.raises(InvalidFilter, match="since must not be after now"):
            deliveries_per_minute(session=session, since=T0 + timedelta(minutes=1), now=T0)


def test_the_first_key_received_since_is_found_across_gaps(store: Store):
    with store.sessions() as session:
        assert first_received_since(session=session, since=T0) is None

    source_id = a_source(store, store.workspace().id)
    pks = []
    for n in range(40):
        pks.append(a_delivery(store, source_id, f"d-{n}"))
        _received(store, pks[-1], T0 + timedelta(minutes=n))
    # The retention policy deleted runs of rows: gaps in the keys.
    gone = [*pks[0:5], *pks[10:25], pks[26], *pks[30:39]]
    with session_scope(store.sessions) as session:
        session.execute(delete(Delivery).where(Delivery.id.in_(gone)))
    kept = [(pk, n) for n, pk in enumerate(pks) if pk not in gone]

    with store.sessions() as session:
        for minute in range(-1, 41):
            since = T0 + timedelta(minutes=minute, seconds=-1 if minute % 2 else 0)
            expected = next((pk for pk, n in kept if T0 + timedelta(minutes=n) >= since), None)
            assert first_received_since(session=session, since=since) == expected, minute
        rate = deliveries_per_minute(
            session=session, since=T0 + timedelta(minutes=8), now=T0 + timedelta(minutes=28)
        )
    alive = {pk for pk, _ in kept}
    assert rate.counts["queued"] == [int(pk in alive) for pk in pks[8:29]]


def test_known_events_are_the_newest_deliveries_events_sorted(store: Store, monkeypatch):
    acme, beta = store.workspace("acme", "ACME"), store.workspace("beta", "BETA")
    acme_source = a_source(store, acme.id, "acme-github")
    beta_source = a_source(store, beta.id, "beta-github")
    for n, (source_id, event) in enumerate(
        [
            (acme_source, "pull_request.opened"),
            (acme_source, "issues.opened"),
            (beta_source, "issue_comment.created"),
            (acme_source, "issues.edited"),
            (acme_source, "issues.opened"),
        ]
    ):
        with session_scope(store.sessions) as session:
            record_delivery(
                session=session,
                incoming=IncomingDelivery(
                    source_id=source_id,
                    delivery_id=f"d-{n}",
                    body=b'{"n": %d}' % n,
                    event=event,
                    action=None,
                    headers={},
                    content_type="application/json",
                ),
            )

    with store.sessions() as session:
        every = known_events(session=session)
        only_beta = known_events(session=session, workspace_ids=frozenset({beta.id}))
        monkeypatch.setattr(reports, "KNOWN_EVENTS_WINDOW", 3)
        newest = known_events(session=session)

    assert every == [
        "issue_comment.created",
        "issues.edited",
        "issues.opened",
        "pull_request.opened",
    ]
    assert only_beta == ["issue_comment.created"]
    assert newest == ["issue_comment.created", "issues.edited", "issues.opened"]


# --- tokens: scope and the revoke guard ------------------------------------------------------


def test_tokens_are_listed_and_revoked_only_within_the_callers_workspaces(store: Store):
    acme, beta = store.workspace("acme", "ACME"), store.workspace("beta", "BETA")
    with session_scope(store.sessions) as session:
        only_acme = issue_token(session=session, name="a", role="member", workspace_ids=[acme.id])
        both = issue_token(
            session=session, name="ab", role="member", workspace_ids=[acme.id, beta.id]
        )
        only_beta = issue_token(session=session, name="b", role="member", workspace_ids=[beta.id])
    ids = only_acme.record.id, both.record.id, only_beta.record.id

    with store.sessions() as session:
        every = [(t.id, w) for t, w in list_tokens(session=session)]
        seen_from_acme = [
            (t.id, w) for t, w in list_tokens(session=session, workspace_ids={acme.id})
        ]
        seen_from_none = list_tokens(session=session, workspace_ids=frozenset())

    assert every == [(ids[0], [acme.id]), (ids[1], [acme.id, beta.id]), (ids[2], [beta.id])]
    # Only the workspaces the caller may see are named.
    assert seen_from_acme == [(ids[0], [acme.id]), (ids[1], [acme.id])]
    assert seen_from_none == []

    scope = frozenset({acme.id})
    for token_id in (ids[1], ids[2], 999):
        with session_scope(store.sessions) as session, pytest.raises(TokenNotFound) as refused:
            revoke_token(session=session, token_id=token_id, workspace_ids=scope)
        # One answer for a token beyond the scope and for none at all.
        assert str(refused.value) == f"no token with id {token_id}"
    with session_scope(store.sessions) as session:
        assert revoke_token(session=session, token_id=ids[0], workspace_ids=scope).revoked_at
        assert revoke_token(session=session, token_id=ids[1]).revoked_at
    assert store.scalar("SELECT count(*) FROM api_tokens WHERE revoked_at IS NULL") == 1
