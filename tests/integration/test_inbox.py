"""The inbox's state machine and the sources that feed it, on both databases."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest
from sqlalchemy import update

from models.db import session_scope
from models.errors import InvalidSource, NotReplayable
from models.inbox import (
    DeliveryStatus,
    IncomingDelivery,
    claim,
    counts_by_status,
    defer,
    finish,
    record_delivery,
    replay,
    sweepable,
)
from models.sources import (
    add_secret,
    add_source,
    retire_older_secrets,
    set_source_enabled,
    verifying_source,
)
from models.tables import Delivery, utcnow
from tests.support.stores import Store

BODY = b'{"webhookEvent": "jira:issue_created", "note": "\\u0000 stays escaped"}'


def body_for(delivery_id: str) -> bytes:
    """Each delivery's own body: one body under two delivery ids is a replay."""
    return BODY[:-1] + b', "delivery": "' + delivery_id.encode() + b'"}'


def a_source(store: Store, slug: str = "acme-jira", secret: str = "s3cret") -> int:
    workspace = store.workspace()
    with session_scope(store.sessions) as session:
        return add_source(
            session=session,
            provider="jira",
            workspace_id=workspace.id,
            slug=slug,
            secret=secret,
            create_events=["jira:issue_created"],
        ).id


def record(
    store: Store, source_id: int, delivery_id: str = "1001", body: bytes | None = None, **extra
):
    incoming = IncomingDelivery(
        source_id=source_id,
        delivery_id=delivery_id,
        body=body_for(delivery_id) if body is None else body,
        event="jira:issue_created",
        action=None,
        headers={"User-Agent": "Atlassian Webhook HTTP Client"},
        content_type="application/json",
        **extra,
    )
    with session_scope(store.sessions) as session:
        return record_delivery(session=session, incoming=incoming)


def row(store: Store, pk: int) -> Delivery:
    with store.sessions() as session:
        return session.get(Delivery, pk)


def test_a_new_delivery_is_stored_queued_and_byte_exact(store: Store):
    source_id = a_source(store)
    body = b'{"a": "\x00 raw NUL and \xff invalid UTF-8"}'

    recorded = record(store, source_id, body=body)

    assert (recorded.is_new, recorded.status) == (True, DeliveryStatus.QUEUED)
    stored = row(store, recorded.pk)
    assert stored.body == body
    assert stored.status == "queued"
    assert stored.attempts == 0
    assert stored.headers == {"User-Agent": "Atlassian Webhook HTTP Client"}


def test_the_same_delivery_twice_is_one_row(store: Store):
    source_id = a_source(store)
    first = record(store, source_id)
    again = record(store, source_id)
    assert (again.pk, again.is_new, again.payload_mismatch) == (first.pk, False, False)
    assert store.scalar("SELECT count(*) FROM deliveries") == 1


def test_another_body_that_is_no_create_is_counted_and_kept_apart_unprocessed(store: Store):
    source_id = a_source(store)
    first = record(store, source_id)
    other = b'{"webhookEvent": "comment_created"}'
    not_a_create = {"status": DeliveryStatus.IGNORED, "status_reason": "not a create"}
    apart = record(store, source_id, body=other, **not_a_create)
    again = record(store, source_id, body=other, **not_a_create)

    assert (apart.is_new, apart.status, apart.payload_mismatch) == (
        True,
        DeliveryStatus.MISMATCH,
        True,
    )
    kept = row(store, apart.pk)
    assert kept.delivery_id == f"1001#{hashlib.sha256(other).hexdigest()[:16]}"
    assert kept.status_reason == (
        f"delivery id '1001' is stored (delivery {first.pk}) with another body; not processed"
    )
    assert (again.pk, again.is_new, again.payload_mismatch) == (first.pk, False, True)
    assert row(store, first.pk).body == body_for("1001")
    assert row(store, first.pk).payload_mismatches == 2


@pytest.mark.parametrize("stored_status", [DeliveryStatus.QUEUED, DeliveryStatus.IGNORED])
def test_another_create_under_a_stored_id_goes_through_on_its_own_whatever_the_row(
    store: Store, stored_status: DeliveryStatus
):
    """Jira: a comment body sent under 7002 first (ignored), or a create of
    another issue (queued: one id shared by two events), cannot make the
    genuine issue_created under 7002 disappear."""
    source_id = a_source(store)
    stored = record(store, source_id, "7002", status=stored_status, status_reason="x")
    genuine = record(store, source_id, "7002", body=body_for("genuine"))

    assert (genuine.is_new, genuine.status, genuine.payload_mismatch) == (
        True,
        DeliveryStatus.QUEUED,
        True,
    )
    assert genuine.pk != stored.pk
    assert row(store, genuine.pk).status_reason == (
        f"delivery id '7002' is stored (delivery {stored.pk}) with another body; "
        "a create, processed on its own record"
    )
    assert row(store, stored.pk).payload_mismatches == 1
    # Sent again, it is that record's duplicate: nothing more is queued.
    again = record(store, source_id, "7002", body=body_for("genuine"))
    assert again.is_new is False
    assert store.scalar("SELECT count(*) FROM deliveries") == 2


def test_other_bytes_of_the_same_payload_under_a_stored_id_are_a_duplicate(store: Store):
    """A catch-up copy, re-serialized from the provider's log: compared by its
    JSON, never its bytes, whichever of the two came first."""
    source_id = a_source(store)
    genuine = body_for("1001")
    copy = json.dumps(json.loads(genuine), indent=1, sort_keys=True).encode()
    first = record(store, source_id, body=genuine)
    again = record(store, source_id, body=copy, origin="catch-up")

    assert (again.pk, again.is_new, again.payload_mismatch) == (first.pk, False, False)
    assert row(store, first.pk).payload_mismatches == 0
    assert store.scalar("SELECT count(*) FROM deliveries") == 1


def test_the_same_body_under_another_delivery_id_is_a_replay_never_processed(store: Store):
    source_id = a_source(store)
    original = record(store, source_id, "guid-1", body=BODY)
    replayed = record(store, source_id, "attacker-guid-1", body=BODY)
    with session_scope(store.sessions) as session:
        other_source = add_source(
            session=session,
            provider="jira",
            workspace_id=store.scalar("SELECT id FROM workspaces"),
            slug="other-jira",
            secret="s3cret",
            create_events=["jira:issue_created"],
        ).id
    elsewhere = record(store, other_source, "guid-2", body=BODY)

    assert (replayed.is_new, replayed.status) == (True, DeliveryStatus.REPLAY)
    assert row(store, replayed.pk).status_reason == (
        f"the same body as delivery {original.pk} under another delivery id: "
        "a replay, never processed"
    )
    # Another source may send the same bytes: a replay is per source.
    assert elsewhere.status is DeliveryStatus.QUEUED
    with session_scope(store.sessions) as session:
        assert claim(session=session, delivery_pk=replayed.pk, lease_seconds=60) is None


def test_an_ignored_event_is_stored_as_ignored(store: Store):
    source_id = a_source(store)
    recorded = record(
        store, source_id, status=DeliveryStatus.IGNORED, status_reason="not a create event"
    )
    assert recorded.status is DeliveryStatus.IGNORED
    assert row(store, recorded.pk).status_reason == "not a create event"


def test_a_claim_is_exclusive_until_its_lease_expires(store: Store):
    pk = record(store, a_source(store)).pk
    with session_scope(store.sessions) as session:
        first = claim(session=session, delivery_pk=pk, lease_seconds=60)
    with session_scope(store.sessions) as session:
        assert claim(session=session, delivery_pk=pk, lease_seconds=60) is None
    assert first.attempt == 1
    assert row(store, pk).status == "processing"


def test_a_taken_over_lease_cannot_overwrite_the_newer_attempt(store: Store):
    pk = record(store, a_source(store)).pk
    with session_scope(store.sessions) as session:
        stale = claim(session=session, delivery_pk=pk, lease_seconds=0)
    with session_scope(store.sessions) as session:
        newer = claim(session=session, delivery_pk=pk, lease_seconds=60)
        assert finish(session=session, lease=newer, status=DeliveryStatus.DONE, outcome="created")
    with session_scope(store.sessions) as session:
        assert not finish(session=session, lease=stale, status=DeliveryStatus.DEAD, error="late")
        assert not defer(session=session, lease=stale, until=utcnow())
    stored = row(store, pk)
    assert (stored.status, stored.outcome, stored.last_error, stored.attempts) == (
        "done",
        "created",
        None,
        2,
    )


def test_a_finished_delivery_is_never_claimed_again(store: Store):
    pk = record(store, a_source(store)).pk
    with session_scope(store.sessions) as session:
        lease = claim(session=session, delivery_pk=pk, lease_seconds=60)
        finish(session=session, lease=lease, status=DeliveryStatus.DONE)
    with session_scope(store.sessions) as session:
        assert claim(session=session, delivery_pk=pk, lease_seconds=60) is None


def test_the_sweeper_finds_lost_queued_rows_and_expired_leases_only(store: Store):
    source_id = a_source(store)
    fresh = record(store, source_id, "fresh").pk
    lost = record(store, source_id, "lost").pk
    dead_worker = record(store, source_id, "dead-worker").pk
    working = record(store, source_id, "working").pk
    deferred = record(store, source_id, "deferred").pk
    long_ago = utcnow() - timedelta(minutes=5)
    with session_scope(store.sessions) as session:
        session.execute(update(Delivery).where(Delivery.id != fresh).values(updated_at=long_ago))
        claim(session=session, delivery_pk=dead_worker, lease_seconds=0)
        claim(session=session, delivery_pk=working, lease_seconds=60)
        lease = claim(session=session, delivery_pk=deferred, lease_seconds=0)
        defer(session=session, lease=lease, until=utcnow() + timedelta(minutes=1))

    with session_scope(store.sessions) as session:
        found = sweepable(session=session, queued_grace_seconds=30)
    assert sorted(found) == sorted([lost, dead_worker])

    # A swept queued row waits another grace period before the next sweep.
    with session_scope(store.sessions) as session:
        assert sweepable(session=session, queued_grace_seconds=30) == [dead_worker]


def test_replay_sends_parked_and_dead_deliveries_back_only(store: Store):
    pk = record(store, a_source(store)).pk
    with session_scope(store.sessions) as session:
        with pytest.raises(NotReplayable):
            replay(session=session, delivery_pk=pk)
        lease = claim(session=session, delivery_pk=pk, lease_seconds=60)
        finish(session=session, lease=lease, status=DeliveryStatus.NEEDS_OPERATOR)
    with session_scope(store.sessions) as session:
        replay(session=session, delivery_pk=pk)
    with session_scope(store.sessions) as session:
        assert claim(session=session, delivery_pk=pk, lease_seconds=60).attempt == 2
        assert counts_by_status(session=session)["processing"] == 1


def test_a_source_verifies_with_any_active_secret_and_rotates(store: Store):
    a_source(store, secret="old")
    with session_scope(store.sessions) as session:
        add_secret(session=session, slug="acme-jira", new_secret="new")
    with store.sessions() as session:
        source = verifying_source(session=session, provider="jira", slug="acme-jira")
        assert sorted(source.secrets) == ["new", "old"]
        assert source.create_events == {"jira:issue_created"}
    with session_scope(store.sessions) as session:
        assert retire_older_secrets(session=session, slug="acme-jira") == 1
    with store.sessions() as session:
        assert verifying_source(session=session, provider="jira", slug="acme-jira").secrets == (
            "new",
        )


def test_unknown_disabled_and_wrong_provider_sources_look_the_same(store: Store):
    a_source(store)
    with store.sessions() as session:
        assert verifying_source(session=session, provider="github", slug="acme-jira") is None
        assert verifying_source(session=session, provider="jira", slug="nope") is None
    with session_scope(store.sessions) as session:
        set_source_enabled(session=session, slug="acme-jira", enabled=False)
    with store.sessions() as session:
        assert verifying_source(session=session, provider="jira", slug="acme-jira") is None


@pytest.mark.parametrize(
    "change",
    [
        {"provider": "bitbucket"},
        {"slug": "Not A Slug"},
        {"secret": "  "},
        {"create_events": []},
        {"workspace_id": 9999},
    ],
)
def test_a_bad_source_is_refused_with_a_reason(store: Store, change):
    workspace = store.workspace()
    arguments = (
        dict(
            provider="jira",
            workspace_id=workspace.id,
            slug="acme-jira",
            secret="s",
            create_events=["jira:issue_created"],
        )
        | change
    )
    with session_scope(store.sessions) as session, pytest.raises(InvalidSource):
        add_source(session=session, **arguments)
