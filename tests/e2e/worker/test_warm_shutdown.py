"""The embedded workers stop warm within the 5 s honcho gives them.

``taskhook start`` (scripts/run) runs the Procfile under honcho, which sends
SIGTERM and kills a process still running 5 s later. Each worker here is
started by its own Procfile line, on the embedded default (a SQLite file and
the filesystem broker in the test's folder), and stopped as honcho stops it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.broker.messages import PROCESS_DELIVERY
from models.db import make_engine, make_session_factory
from models.settings import Settings
from tests.support.feeds import delivery, make_feed, store_fixture, tasks_of
from tests.support.processes import ROOT, WorkerProcess, wait_until, worker_environment
from worker.celery_app import make_celery_app

pytestmark = pytest.mark.e2e

#: What honcho waits after SIGTERM before it kills.
HONCHO_GRACE_SECONDS = 5.0
#: An idle worker's bound here. Before the embedded broker stopped waiting on
#: SIGTERM, Celery's loop waited out a 2 s poll for messages once more on its
#: way out, so no idle worker ever stopped in under 2 s (4-5 s was usual).
IDLE_STOP_SECONDS = 2.0


def procfile_command(name: str) -> list[str]:
    """The Procfile's command for process ``name``, run by this interpreter."""
    for line in (ROOT / "Procfile").read_text().splitlines():
        process, _, command = line.partition(":")
        if process.strip() == name:
            args = shlex.split(command)
            assert args[0] == "celery", line
            return [sys.executable, "-m", "celery", *args[1:]]
    raise AssertionError(f"no {name!r} in the Procfile")


def start(name: str, tmp_path: Path, database: Path, **env: str) -> WorkerProcess:
    environment = worker_environment(
        f"sqlite:///{database}",
        "filesystem://",
        TASKHOOK_BROKER_FOLDER=str(tmp_path / "broker"),
        TASKHOOK_BEAT_SCHEDULE=str(tmp_path / "beat-schedule"),
        **env,
    )
    process = WorkerProcess(name, tmp_path / f"{name}.log", procfile_command(name), environment)
    process.wait_ready()
    return process


def stop_as_honcho_does(worker: WorkerProcess) -> tuple[int | None, float]:
    """SIGTERM; the exit code within honcho's grace (None: honcho would kill it), and the time."""
    started = time.monotonic()
    os.kill(worker.pid, signal.SIGTERM)
    try:
        code = worker.process.wait(timeout=HONCHO_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        code = None
    return code, time.monotonic() - started


@pytest.fixture
def database(sqlite_template: Path, tmp_path: Path) -> Path:
    database = tmp_path / "taskhook.db"
    shutil.copyfile(sqlite_template, database)
    return database


@pytest.mark.parametrize("name", ["worker", "operator"])
def test_an_idle_embedded_worker_stops_warm_at_once(name: str, tmp_path: Path, database: Path):
    worker = start(name, tmp_path, database)
    try:
        time.sleep(0.5)  # idle: its loop is polling the empty queue
        code, took = stop_as_honcho_does(worker)
        assert code == 0, f"exit {code} after {took:.1f} s\n{worker.tail()}"
        assert "Warm shutdown" in worker.text()
        assert took < IDLE_STOP_SECONDS, f"{took:.1f} s\n{worker.tail()}"
    finally:
        worker.stop()


def test_a_delivery_in_flight_is_finished_before_the_worker_stops(tmp_path: Path, database: Path):
    database_url = f"sqlite:///{database}"
    engine = make_engine(database_url)
    sessions = make_session_factory(engine)
    client = make_celery_app(Settings(database_url=database_url, broker_folder=tmp_path / "broker"))
    go = tmp_path / "go"
    worker = start("worker", tmp_path, database, TASKHOOK_FAILPOINT=f"after_insert:hold={go}")
    try:
        feed = make_feed(sessions)
        pk = store_fixture(sessions, feed, "github", "issues__opened")
        client.send_task(PROCESS_DELIVERY, args=[pk])
        wait_until(
            lambda: "holding until" in worker.text(), timeout=30, what="the hold", logs=[worker]
        )

        os.kill(worker.pid, signal.SIGTERM)
        time.sleep(0.5)
        assert worker.process.poll() is None, "the worker left its delivery running"
        go.touch()
        code = worker.process.wait(timeout=HONCHO_GRACE_SECONDS)

        assert code == 0, worker.tail()
        assert delivery(sessions, pk).status == "done"
        assert [t.external_id for t in tasks_of(sessions, feed.workspace_id)] == [
            "gh-issue/Codertocat/Hello-World#1"
        ]
    finally:
        worker.stop()
        client.close()
        engine.dispose()
