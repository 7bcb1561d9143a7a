"""Downtime windows from the ingress's heartbeats, and which a source's
catch-up has covered, on SQLite and PostgreSQL; the heartbeat of a real app."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import select

from ingest.app import create_app
from models.catchup import mark_handled, window_start
from models.db import session_scope
from models.errors import InvalidOperation, SourceNotFound
from models.settings import Settings
from models.sources import add_source
from models.tables import CatchUpRun, IngressHeartbeat, utcnow
from models.uptime import Window, downtime, ingress_refused, uncovered
from tests.support.processes import wait_until
from tests.support.scenarios import SECRET, a_source
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


def test_a_stretch_of_503s_is_a_window_even_while_another_process_was_up(store: Store):
    """The database failed over under a process that stayed up: it answered
    deliveries 503 from ``since`` until it stored one at ``until``. GitHub
    sends those to no one else, so another process being up covers nothing."""
    now = utcnow()
    up(store, now - timedelta(hours=3), now)  # another process, up all along
    since, until = now - timedelta(hours=2), now - timedelta(hours=2) + timedelta(seconds=7)
    with session_scope(store.sessions) as session:
        beat = IngressHeartbeat(
            host="h2", pid=2, started_at=now - timedelta(hours=3), last_seen_at=since
        )
        session.add(beat)
        session.flush()
        ingress_refused(
            session=session, heartbeat_id=beat.id, since=since, until=until, host="h2", pid=2
        )
    with session_scope(store.sessions) as session:
        windows = downtime(session=session, heartbeat_seconds=BEAT, now=now)
        rows = session.scalars(select(IngressHeartbeat).where(IngressHeartbeat.host == "h2"))
        spans = sorted((row.started_at, row.stopped_at) for row in rows)

    assert windows == [Window(since, until, refused=True)]
    assert windows[0].seconds == 7
    # The process goes on in a new row from the moment it stored again.
    assert spans == [(now - timedelta(hours=3), since), (until, None)]


def test_windows_that_overlap_are_one(store: Store):
    now = utcnow()
    t = now - timedelta(hours=3)
    up(store, t, t + timedelta(minutes=10), stopped=True)
    up(store, t + timedelta(minutes=30), now)
    with session_scope(store.sessions) as session:
        beat = IngressHeartbeat(host="h3", pid=3, started_at=t, last_seen_at=t)
        session.add(beat)
        session.flush()
        ingress_refused(
            session=session,
            heartbeat_id=beat.id,
            since=t + timedelta(minutes=5),
            until=t + timedelta(minutes=20),
            host="h3",
            pid=3,
        )
        session.flush()
        # That process stopped cleanly right after it stored again.
        session.execute(
            IngressHeartbeat.__table__.update()
            .where(IngressHeartbeat.host == "h3", IngressHeartbeat.stopped_at.is_(None))
            .values(stopped_at=t + timedelta(minutes=20))
        )
    with session_scope(store.sessions) as session:
        windows = downtime(session=session, heartbeat_seconds=BEAT, now=now)
    assert windows == [Window(t + timedelta(minutes=5), t + timedelta(minutes=30), refused=True)]


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

    since = (now - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S")
    command = f"taskhook catch-up github --source acme-github --since {since}"
    hidden = scrape()
    assert hidden[f'taskhook_uncovered_downtime_seconds{{command="{command}",source="-"}}'] > 3600
    assert hidden['taskhook_catchup_last_failed{source="-"}'] == 1
    named = scrape(metrics_source_labels=True)
    assert (
        named[f'taskhook_uncovered_downtime_seconds{{command="{command}",source="acme-github"}}']
        > 3600
    )
    assert named['taskhook_catchup_last_recovered{source="acme-github"}'] == 0


def stats_of(store: Store, *args: str):
    result = CliRunner(env={"TASKHOOK_DATABASE_URL": store.url}).invoke(cli, ["stats", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def a_source_of(store: Store, provider: str, slug: str) -> int:
    with session_scope(store.sessions) as session:
        return add_source(
            session=session,
            provider=provider,
            workspace_id=store.workspace().id,
            slug=slug,
            secret=SECRET,
            create_events=["Issue Hook.open" if provider == "gitlab" else "jira:issue_created"],
            site_url="https://acme.atlassian.net" if provider == "jira" else None,
        ).id


def test_stats_names_each_providers_own_catch_up(store: Store):
    a_source_of(store, "gitlab", "acme-gitlab")
    now = utcnow()
    up(store, now - timedelta(hours=3), now - timedelta(hours=2), stopped=True)
    up(store, now - timedelta(hours=1), now)
    since = (now - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S")

    shown = stats_of(store)

    assert f"taskhook catch-up gitlab --source acme-gitlab --since {since}" in shown
    assert "catch-up github --source acme-gitlab" not in shown
    assert f"taskhook catch-up mark-handled --source acme-gitlab --since {since}" in shown


def test_a_window_marked_as_handled_by_hand_is_reported_no_more_but_never_moves_a_cursor(
    store: Store,
):
    source_id = a_source_of(store, "gitlab", "acme-gitlab")
    now = utcnow()
    up(store, now - timedelta(hours=3), now - timedelta(hours=2), stopped=True)
    up(store, now - timedelta(hours=1), now)
    assert "Not caught up: acme-gitlab" in stats_of(store)

    marked = CliRunner(env={"TASKHOOK_DATABASE_URL": store.url}).invoke(
        cli,
        [
            "catch-up", "mark-handled", "--source", "acme-gitlab",
            "--since", (now - timedelta(hours=2, minutes=1)).strftime("%Y-%m-%dT%H:%M:%S"),
            "--until", (now - timedelta(minutes=59)).strftime("%Y-%m-%dT%H:%M:%S"),
            "--reason", "issues filed by hand from GitLab's UI", "--operator", "alice",
        ],
    )  # fmt: skip

    assert marked.exit_code == 0, marked.output
    assert "as handled by hand (operator alice)" in marked.stdout
    shown = stats_of(store)
    assert "Not caught up" not in shown
    assert "Handled by hand: acme-gitlab from" in shown
    assert "marked by alice" in shown and "issues filed by hand from GitLab's UI" in shown
    assert "Last catch-up of acme-gitlab" not in shown  # a mark is no catch-up
    app = create_app(Settings(database_url=store.url, metrics_source_labels=True))
    with TestClient(app) as client:
        scraped = client.get("/metrics").text
    gauges = [line for line in scraped.splitlines() if 'source="acme-gitlab"' in line]
    assert not [line for line in gauges if "uncovered_downtime" in line or "catchup" in line]
    (mark,) = json.loads(stats_of(store, "--json"))["handled_by_hand"]
    assert mark["operator"] == "alice"
    history = CliRunner(env={"TASKHOOK_DATABASE_URL": store.url}).invoke(
        cli, ["operations", "list"]
    )
    assert "mark-handled" in history.stdout and "alice" in history.stdout
    with session_scope(store.sessions) as session:
        # The next catch-up still reads from as far back as it would have.
        assert window_start(session=session, source_id=source_id, now=now) < now - timedelta(days=2)


@pytest.mark.parametrize(
    ("since", "until", "slug", "error", "said"),
    [
        (2, 3, "acme-gitlab", InvalidOperation, "--until must be after --since"),
        (2, -1, "acme-gitlab", InvalidOperation, "--until is in the future"),
        (3, 2, "nobody", SourceNotFound, "no webhook source named 'nobody'"),
    ],
)
def test_a_mark_refuses_a_window_backwards_in_the_future_or_of_no_source(
    store: Store, since, until, slug, error, said
):
    a_source_of(store, "gitlab", "acme-gitlab")
    now = utcnow()
    with session_scope(store.sessions) as session, pytest.raises(error, match=said):
        mark_handled(
            session=session,
            slug=slug,
            since=now - timedelta(hours=since),
            until=now - timedelta(hours=until),
            operator="alice",
            reason="done",
        )


def test_a_mark_refused_on_the_command_line_is_one_line(store: Store):
    a_source_of(store, "gitlab", "acme-gitlab")
    result = CliRunner(env={"TASKHOOK_DATABASE_URL": store.url}).invoke(
        cli,
        [
            "catch-up", "mark-handled", "--source", "acme-gitlab", "--since", "2026-12-01T10:00",
            "--until", "2026-12-01T09:00", "--reason", "x", "--operator", "alice",
        ],
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["Error: --until must be after --since"]
    unknown = CliRunner(env={"TASKHOOK_DATABASE_URL": store.url}).invoke(
        cli,
        [
            "catch-up", "mark-handled", "--source", "nobody", "--since", "2026-12-01T08:00",
            "--until", "2026-12-01T09:00", "--reason", "x", "--operator", "alice",
        ],
    )  # fmt: skip
    assert unknown.exit_code == 1
    assert unknown.output.strip().splitlines() == ["Error: no webhook source named 'nobody'"]
