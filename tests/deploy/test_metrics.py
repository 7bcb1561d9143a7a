"""The gauges the alerts need, scraped from a real ingress on SQLite and PostgreSQL:
the inbox by status, the backlog's age, each backed-up workspace's backlog, the
sweeper's lag, each source's last delivery, the relay's pending keys and the
webhook routes' unexpected errors."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

from sqlalchemy import delete, func, select, update

from ingest import webhooks
from ingest.metrics import BACKLOG_WORKSPACES, COUNTED_STATUSES, OTHER_WORKSPACES
from models.db import session_scope
from models.inbox import DeliveryStatus
from models.sources import set_source_enabled
from models.tables import Delivery, WebhookSource, utcnow
from tests.support.metrics import post, scraped, value
from tests.support.scenarios import a_backlog, a_source
from tests.support.stores import Store

GITHUB_CREATES = ["issues__opened", "pull_request__opened", "issues__opened_with_organization"]
JIRA_CREATE = "jira_issue_created__cloud"


def keys(store: Store) -> list[int]:
    with store.sessions() as session:
        return list(session.scalars(select(Delivery.id).order_by(Delivery.id)))


def change(store: Store, pk: int, **values: object) -> None:
    with session_scope(store.sessions) as session:
        session.execute(update(Delivery).where(Delivery.id == pk).values(**values))


def last_received(store: Store, slug: str) -> float:
    with store.sessions() as session:
        return session.scalar(
            select(func.max(Delivery.received_at))
            .join(WebhookSource, WebhookSource.id == Delivery.source_id)
            .where(WebhookSource.slug == slug, Delivery.origin == "webhook")
        ).timestamp()


def created(store: Store, slug: str) -> float:
    with store.sessions() as session:
        return session.scalar(
            select(WebhookSource.created_at).where(WebhookSource.slug == slug)
        ).timestamp()


def test_the_inbox_by_status_the_backlog_age_and_the_sweeper_lag(ingress, sourced: Store):
    with ingress() as client:
        for name in GITHUB_CREATES:
            assert post(client, "github", name).status_code == 202
        parked, died, waiting = keys(sourced)
        now = utcnow()
        change(sourced, parked, status=DeliveryStatus.NEEDS_OPERATOR.value)
        change(sourced, died, status=DeliveryStatus.DEAD.value)
        # Received an hour ago; the sweeper last sent it again 10 minutes ago.
        change(
            sourced,
            waiting,
            received_at=now - timedelta(hours=1),
            updated_at=now - timedelta(minutes=10),
        )
        families = scraped(client)
        counts = {
            status.value: value(families, "taskhook_inbox_deliveries", status=status.value)
            for status in DeliveryStatus
        }
        assert counts == {
            "queued": 1,
            "processing": 0,
            "done": None,  # never counted: it grows with every delivery
            "ignored": None,
            "needs_operator": 1,
            "dead": 1,
            "replay": 0,
            "mismatch": 0,
        }
        assert {status.value for status in COUNTED_STATUSES} == {
            status for status, count in counts.items() if count is not None
        }
        age = value(families, "taskhook_inbox_oldest_queued_age_seconds")
        assert 3600 <= age < 3600 + 60
        # Ten minutes since its last send, minus the 60 s grace (the default).
        lag = value(families, "taskhook_sweeper_lag_seconds")
        assert 540 <= lag < 540 + 60

        change(sourced, waiting, status=DeliveryStatus.DONE.value)
        families = scraped(client)
    assert value(families, "taskhook_inbox_deliveries", status="queued") == 0
    assert value(families, "taskhook_inbox_oldest_queued_age_seconds") == 0
    assert value(families, "taskhook_sweeper_lag_seconds") == 0


BACKLOG = "taskhook_workspace_backlog"
OLDEST = "taskhook_workspace_oldest_queued_seconds"


def backlog_series(families) -> dict[str, tuple[float, float]]:
    """Each workspace label's backlog and oldest queued wait, as scraped."""
    ages = {sample.labels["workspace"]: sample.value for sample in families[OLDEST].samples}
    return {
        sample.labels["workspace"]: (sample.value, ages.pop(sample.labels["workspace"]))
        for sample in families[BACKLOG].samples
    } | {workspace: (None, age) for workspace, age in ages.items()}


def test_the_largest_workspace_backlogs_have_series_and_the_rest_one(ingress, sourced: Store):
    """Twelve backed-up workspaces: the ten largest have series of their own,
    the last two are summed into _other; a workspace whose backlog drains, or
    drops out of the ten, loses its series."""
    assert BACKLOG_WORKSPACES == 10
    now = utcnow()
    keys_of, workspace_of = {}, {}
    for number in range(1, 13):
        slug = f"w{number:02}"
        workspace_of[slug] = sourced.workspace(slug, f"W{number}").id
        source = a_source(sourced, workspace_of[slug], f"{slug}-github")
        # w01 the largest backlog (13), w12 the smallest (2); w12 waited longest.
        keys_of[slug] = a_backlog(
            sourced, source, queued=14 - number, received_at=now - timedelta(minutes=number)
        )
    a_backlog(sourced, a_source(sourced, workspace_of["w05"], "w05-jira"), processing=2)

    with ingress() as client:
        shown = backlog_series(scraped(client))
        assert set(shown) == {f"w{n:02}" for n in range(1, 11)} | {OTHER_WORKSPACES}
        assert shown["w01"][0] == 13
        assert shown["w05"][0] == 9 + 2  # processing ones count: received, not finished
        assert 60 <= shown["w01"][1] < 60 + 30
        assert 5 * 60 <= shown["w05"][1] < 5 * 60 + 30
        # w11's 3 and w12's 2; w12's 12 minutes, the longest wait of the two.
        assert shown[OTHER_WORKSPACES][0] == 3 + 2
        assert 12 * 60 <= shown[OTHER_WORKSPACES][1] < 12 * 60 + 30

        # w03 drains: its series goes, w11 has one of its own now.
        with session_scope(sourced.sessions) as session:
            session.execute(
                update(Delivery)
                .where(Delivery.id.in_(keys_of["w03"]))
                .values(status=DeliveryStatus.DONE.value)
            )
        shown = backlog_series(scraped(client))
        assert "w03" not in shown
        assert shown["w11"][0] == 3 and 11 * 60 <= shown["w11"][1] < 11 * 60 + 30
        assert shown[OTHER_WORKSPACES][0] == 2

        # Everything drains: only _other remains, at 0.
        with session_scope(sourced.sessions) as session:
            session.execute(update(Delivery).values(status=DeliveryStatus.DONE.value))
        families = scraped(client)
    assert backlog_series(families) == {OTHER_WORKSPACES: (0, 0)}


def test_a_workspace_with_only_processing_deliveries_waits_for_nothing(ingress, sourced: Store):
    with ingress() as client:
        assert backlog_series(scraped(client)) == {OTHER_WORKSPACES: (0, 0)}
        assert post(client, "github", "issues__opened").status_code == 202
        (key,) = keys(sourced)
        change(sourced, key, received_at=utcnow() - timedelta(minutes=2))
        shown = backlog_series(scraped(client))
        assert set(shown) == {"acme", OTHER_WORKSPACES}
        assert shown["acme"][0] == 1 and 120 <= shown["acme"][1] < 150
        change(sourced, key, status=DeliveryStatus.PROCESSING.value)
        shown = backlog_series(scraped(client))
    assert shown == {"acme": (1, 0), OTHER_WORKSPACES: (0, 0)}


def test_a_queued_delivery_within_its_grace_is_no_sweeper_lag(ingress, sourced: Store):
    with ingress(queued_grace_seconds=600) as client:
        assert post(client, "github", "issues__opened").status_code == 202
        (waiting,) = keys(sourced)
        change(sourced, waiting, updated_at=utcnow() - timedelta(minutes=5))
        families = scraped(client)
    assert value(families, "taskhook_sweeper_lag_seconds") == 0
    assert value(families, "taskhook_inbox_oldest_queued_age_seconds") >= 0


def test_each_source_shows_its_last_webhook_delivery(ingress, sourced: Store):
    stamp = "taskhook_source_last_delivery_timestamp_seconds"
    with ingress(metrics_source_labels=True) as client:
        assert post(client, "github", "issues__opened").status_code == 202
        assert post(client, "jira", JIRA_CREATE).status_code == 202
        # A catch-up's row is not the webhook's: the source is still silent.
        change(sourced, keys(sourced)[-1], origin="catch-up")
        families = scraped(client)
        assert value(families, stamp, source="acme-github") == last_received(sourced, "acme-github")
        # No webhook delivery yet: the source's creation.
        assert value(families, stamp, source="acme-jira") == created(sourced, "acme-jira")

        # Later ones are read by the next scrape (only rows above the last keys).
        time.sleep(0.01)
        assert post(client, "github", "pull_request__opened").status_code == 202
        assert post(client, "jira", "jira_issue_created__cloud_many_fields").status_code == 202
        families = scraped(client)
        github = value(families, stamp, source="acme-github")
        assert github == last_received(sourced, "acme-github")
        assert value(families, stamp, source="acme-jira") == last_received(sourced, "acme-jira")
        assert github > created(sourced, "acme-github")

        # A disabled source is nobody's concern.
        with session_scope(sourced.sessions) as session:
            set_source_enabled(session=session, slug="acme-jira", enabled=False)
        families = scraped(client)
    assert value(families, stamp, source="acme-jira") is None
    assert value(families, stamp, source="acme-github") == github


def test_a_delivery_committed_after_a_scrape_under_a_smaller_key_is_seen(ingress, sourced: Store):
    """A transaction takes its key, another one's higher key commits first and
    a scrape reads it: the next scrape still reads the rows from the one before."""
    stamp = "taskhook_source_last_delivery_timestamp_seconds"
    with ingress(metrics_source_labels=True) as client:
        assert post(client, "github", "issues__opened").status_code == 202
        scraped(client)
        assert post(client, "jira", JIRA_CREATE).status_code == 202
        assert post(client, "github", "pull_request__opened").status_code == 202
        late = keys(sourced)[1]
        table = Delivery.__table__
        with session_scope(sourced.sessions) as session:
            row = dict(session.execute(select(table).where(table.c.id == late)).one()._mapping)
            session.execute(delete(Delivery).where(Delivery.id == late))
        families = scraped(client)
        assert value(families, stamp, source="acme-jira") == created(sourced, "acme-jira")

        with session_scope(sourced.sessions) as session:
            session.execute(table.insert().values(**row))
        families = scraped(client)
    assert value(families, stamp, source="acme-jira") == last_received(sourced, "acme-jira")


def test_without_source_labels_one_series_says_the_most_silent_source(ingress, sourced: Store):
    stamp = "taskhook_source_last_delivery_timestamp_seconds"
    with ingress() as client:
        assert post(client, "github", "issues__opened").status_code == 202
        families = scraped(client)
    assert [sample.labels for sample in families[stamp].samples] == [{"source": "-"}]
    silent = min(last_received(sourced, "acme-github"), created(sourced, "acme-jira"))
    assert value(families, stamp, source="-") == silent


def test_the_relay_s_pending_keys(ingress):
    inside, release = threading.Event(), threading.Event()

    def publish(keys, lane) -> None:  # a broker that hangs
        inside.set()
        release.wait(10)

    with ingress(publish=publish) as client:
        try:
            assert post(client, "github", "issues__opened").status_code == 202
            assert inside.wait(5)
            # The relay's thread is stuck on the first key: these two wait.
            assert post(client, "github", "pull_request__opened").status_code == 202
            assert post(client, "jira", JIRA_CREATE).status_code == 202
            assert value(scraped(client), "taskhook_relay_pending") == 2
        finally:
            release.set()
        deadline = time.monotonic() + 5
        while value(scraped(client), "taskhook_relay_pending") != 0:
            assert time.monotonic() < deadline, "the relay never drained"
            time.sleep(0.02)
        assert value(scraped(client), "taskhook_relay_published_total") == 3


def test_an_unexpected_error_on_a_webhook_route_is_counted(ingress, monkeypatch):
    async def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    with ingress() as client:
        families = scraped(client)
        # Every provider's series from the start, so that increase() sees the first.
        assert value(families, "taskhook_ingress_unexpected_errors_total", provider="jira") == 0
        monkeypatch.setattr(webhooks, "_verify_and_store", broken)
        answer = post(client, "github", "issues__opened")
        assert answer.status_code == 503
        monkeypatch.undo()
        assert post(client, "github", "issues__opened").status_code == 202
        assert post(client, "jira", JIRA_CREATE).status_code == 202
        families = scraped(client)
    errors = "taskhook_ingress_unexpected_errors_total"
    assert value(families, errors, provider="github") == 1
    assert value(families, errors, provider="jira") == 0
    assert value(families, errors, provider="gitlab") == 0
    assert value(families, "taskhook_ingress_seconds_count", provider="github") == 2


def compact_deliveries(store: Store) -> None:
    """Give the deliveries table's free space back to the file system.

    Between tests the PostgreSQL store is emptied with DELETE (tests/conftest.py),
    which keeps the pages earlier tests filled: new rows land in their free
    space, and autovacuum may cut empty pages off the end while this test runs,
    so the size need not grow (a CI run saw 573,440 bytes before and after).
    VACUUM FULL rewrites the table, its TOAST and its indexes at their least.
    SQLite's store is a fresh copy of a template each test."""
    if store.dialect != "postgresql":
        return
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("VACUUM FULL deliveries")


def test_the_inbox_s_disk_as_the_database_measures_it(ingress, sourced: Store):
    compact_deliveries(sourced)
    with ingress() as client:
        before = value(scraped(client), "taskhook_inbox_storage_bytes")
        assert before > 0  # a table and its indexes take pages even when empty
        for name in GITHUB_CREATES:
            assert post(client, "github", name).status_code == 202
        with session_scope(sourced.sessions) as session:
            # Bodies too large for a page, and random so that compression cannot
            # shrink them back into one: PostgreSQL keeps them in TOAST, SQLite
            # in overflow pages; either way the storage grows by about 900 KB.
            for pk in keys(sourced):
                session.execute(
                    update(Delivery).where(Delivery.id == pk).values(body=os.urandom(300_000))
                )
        after = value(scraped(client), "taskhook_inbox_storage_bytes")
        assert after - before >= len(GITHUB_CREATES) * 300_000
