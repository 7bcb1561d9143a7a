"""Downtime windows from the ingress's heartbeats, and which a source's
catch-up has covered, on SQLite and PostgreSQL; the heartbeat of a real app."""

from __future__ import annotations

import json
from datetime import timedelta

from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import select

from ingest.app import create_app
from models.db import session_scope
from models.settings import Settings
from models.tables import CatchUpRun, IngressHeartbeat, utcnow
from models.uptime import Window, downtime, uncovered
from tests.support.processes import wait_until
from tests.support.scenarios import a_source
from tests.support.stores import Store
from worker.cli import cli

BEAT = 30.0  # seconds; a process counts as up until two beats after its last


def up(store: Store, start, end, *, stopped: bool = False) -> None:
    """A process up from ``start``, last seen at ``end``: stopped cleanly
    then, or (by default) gone without a word."""
    with session_scope(store.sessions) as session:
        session.add(
            IngressHeartbeat(
                host="h",
                pid=1,
                started_at=start,
                last_seen_at=end,
                stopped_at=end if stopped else None,
            )
        )


def test_no_heartbeat_ever_is_no_downtime(store: Store):
    with session_scope(store.sessions) as session:
        assert downtime(session=session, heartbeat_seconds=BEAT) == []


def test_a_stretch_no_process_covered_is_a_window_and_overlaps_are_not(store: Store):
    now = utcnow()
    t = now - timedelta(hours=3)
    up(store, t, t + timedelta(minutes=30))
    # A second process overlapping the first: no gap between them.
    up(store, t + timedelta(minutes=20), t + timedelta(minutes=60))
    # Down from 61 to 90 minutes, then up until now.
    up(store, t + timedelta(minutes=90), now)

    with session_scope(store.sessions) as session:
        windows = downtime(session=session, heartbeat_seconds=BEAT, now=now)

    # The process that died last beat at 60: a catch-up reads from there.
    assert windows == [
        Window(t + timedelta(minutes=61), t + timedelta(minutes=90), t + timedelta(minutes=60))
    ]


def test_a_clean_stop_ends_the_uptime_there(store: Store):
    now = utcnow()
    stop = now - timedelta(hours=2)
    up(store, now - timedelta(hours=3), stop, stopped=True)
    up(store, now - timedelta(hours=1), now)

    with session_scope(store.sessions) as session:
        (window,) = downtime(session=session, heartbeat_seconds=BEAT, now=now)

    assert window == Window(stop, now - timedelta(hours=1))
    assert window.since == stop


def test_a_window_still_open_ends_now(store: Store):
    now = utcnow()
    up(store, now - timedelta(hours=1), now - timedelta(minutes=10))
    with session_scope(store.sessions) as session:
        (window,) = downtime(session=session, heartbeat_seconds=BEAT, now=now)
    assert window.start == now - timedelta(minutes=9) and window.end == now


def test_a_window_is_covered_only_by_a_complete_run_that_read_it_whole(store: Store):
    workspace = store.workspace()
    source_id = a_source(store, workspace.id)
    now = utcnow()
    window = Window(now - timedelta(hours=2), now - timedelta(hours=1))

    def runs(*spans) -> dict:
        with session_scope(store.sessions) as session:
            for since, until in spans:
                session.add(
                    CatchUpRun(source_id=source_id, since=since, covered_until=until, dry_run=False)
                )
        with session_scope(store.sessions) as session:
            return uncovered(session=session, windows=[window])

    assert runs() == {"acme-github": [window]}
    # A dry run, or one that stopped, covers nothing; one that read half of it neither.
    assert runs((window.start, None), (window.start + timedelta(minutes=30), now)) == {
        "acme-github": [window]
    }
    assert runs((window.start - timedelta(minutes=10), now)) == {}


def test_after_a_process_died_a_run_covers_the_window_from_its_last_heartbeat(store: Store):
    workspace = store.workspace()
    source_id = a_source(store, workspace.id)
    now = utcnow()
    window = Window(now - timedelta(hours=2), now - timedelta(hours=1), now - timedelta(hours=3))

    def read_from(since) -> dict:
        with session_scope(store.sessions) as session:
            session.add(
                CatchUpRun(source_id=source_id, since=since, covered_until=now, dry_run=False)
            )
        with session_scope(store.sessions) as session:
            return uncovered(session=session, windows=[window])

    assert read_from(window.start) == {"acme-github": [window]}
    assert read_from(window.since) == {}


def test_a_running_ingress_records_its_start_and_beats(store: Store):
    settings = Settings(database_url=store.url, ingress_heartbeat_seconds=0.2)

    def beaten() -> bool:
        with session_scope(store.sessions) as session:
            beat = session.scalars(select(IngressHeartbeat)).first()
            return beat is not None and beat.last_seen_at > beat.started_at

    with TestClient(create_app(settings)):
        wait_until(beaten, timeout=10, what="a heartbeat after the start")

    # A clean shutdown says so: the downtime after it starts at once.
    with session_scope(store.sessions) as session:
        beat = session.scalars(select(IngressHeartbeat)).one()
        assert beat.stopped_at is not None and beat.stopped_at == beat.last_seen_at


def test_stats_shows_a_window_no_catch_up_covered_until_one_does(store: Store):
    workspace = store.workspace()
    source_id = a_source(store, workspace.id)
    now = utcnow()
    up(store, now - timedelta(hours=3), now - timedelta(hours=2))
    up(store, now - timedelta(hours=1), now)

    def stats(*args: str):
        runner = CliRunner(env={"TASKHOOK_DATABASE_URL": store.url})
        result = runner.invoke(cli, ["stats", *args])
        assert result.exit_code == 0, result.output
        return result

    shown = stats().stdout
    assert "Not caught up: acme-github -- no ingress was up from" in shown
    # The first process died: the suggested catch-up reads from its last heartbeat.
    since = (now - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S")
    assert f"taskhook catch-up github --source acme-github --since {since}" in shown
    (window,) = json.loads(stats("--json").stdout)["uncovered"]["acme-github"]
    assert window["end"] > window["start"]

    with session_scope(store.sessions) as session:
        session.add(
            CatchUpRun(
                source_id=source_id,
                since=now - timedelta(hours=4),
                covered_until=now,
                dry_run=False,
                missed=3,
                recovered=3,
            )
        )
    shown = stats().stdout
    assert "Not caught up" not in shown
    assert "Last catch-up of acme-github (delivery log):" in shown
    assert "3 missed, 3 recovered" in shown


def test_metrics_show_the_uncovered_downtime_and_the_last_catch_up(store: Store):
    workspace = store.workspace()
    source_id = a_source(store, workspace.id)
    now = utcnow()
    up(store, now - timedelta(hours=3), now - timedelta(hours=2))
    with session_scope(store.sessions) as session:
        session.add(
            CatchUpRun(
                source_id=source_id,
                since=now - timedelta(hours=1),
                covered_until=None,
                dry_run=False,
                error="BadCredentials: Bad credentials",
            )
        )

    def scrape(**settings) -> dict[str, float]:
        app = create_app(Settings(database_url=store.url, **settings))
        with TestClient(app) as client:
            text = client.get("/metrics").text
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("taskhook_") and ("catchup" in line or "downtime" in line)
        }

    hidden = scrape()
    assert hidden['taskhook_uncovered_downtime_seconds{source="-"}'] > 3600
    assert hidden['taskhook_catchup_last_failed{source="-"}'] == 1
    named = scrape(metrics_source_labels=True)
    assert named['taskhook_uncovered_downtime_seconds{source="acme-github"}'] > 3600
    assert named['taskhook_catchup_last_recovered{source="acme-github"}'] == 0
