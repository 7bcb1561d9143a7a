"""The embedded workers stop warm within the 5 s honcho gives them.

``taskhook start`` (scripts/run) runs the Procfile under honcho, which sends
SIGTERM and kills a process still running 5 s later. Each worker here is
started by its own Procfile line, on the embedded default (a SQLite file and
the filesystem broker in the test's folder), and stopped as honcho stops it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
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
#: way out, then up to 1 s for its timer, and the interpreter's own exit came
#: on top: 4-5 s was usual, never under 2 s. Now about 0.5 s, and up to 1.6 s
#: on a machine loaded six times over (most of it the interpreter's exit).
IDLE_STOP_SECONDS = 3.0


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


def processes_marked(mark: str) -> list[int]:
    """Every live process whose environment carries ``mark``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"TASKHOOK_TEST_RUN_MARK={mark}".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                pass
    return found


def test_under_honcho_idle_workers_stop_warm_and_are_never_killed(tmp_path: Path, database: Path):
    """``taskhook start`` (honcho) with the Procfile's workers, stopped as
    Ctrl-C stops it: every process it started is gone within honcho's grace,
    none was sent SIGKILL. (honcho reports a process stopped when its output
    closes; where ``/bin/sh`` does not exec the Procfile's command, the exit
    code it reports is the shell's, so the workers themselves are watched.)"""
    mark = uuid.uuid4().hex
    environment = worker_environment(
        f"sqlite:///{database}",
        "filesystem://",
        TASKHOOK_BROKER_FOLDER=str(tmp_path / "broker"),
        # As scripts/run: the Procfile's `celery` is the virtualenv's.
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        TASKHOOK_TEST_RUN_MARK=mark,
    )
    command = [sys.executable, "-m", "worker.cli", "start", "--procfile", str(ROOT / "Procfile")]
    honcho = WorkerProcess(
        "taskhook start", tmp_path / "honcho.log", [*command, "worker", "operator"], environment
    )
    try:
        wait_until(
            lambda: honcho.process.poll() is not None or honcho.text().count(" ready.") == 2,
            timeout=60,
            what="both workers ready",
            logs=[honcho],
        )
        assert honcho.process.poll() is None, honcho.tail()
        time.sleep(0.5)
        started = time.monotonic()
        os.kill(honcho.pid, signal.SIGINT)
        while processes_marked(mark) and time.monotonic() - started < 3 * HONCHO_GRACE_SECONDS:
            time.sleep(0.05)
        took = time.monotonic() - started

        said = honcho.text()
        assert not processes_marked(mark), honcho.tail()
        assert "SIGKILL" not in said, honcho.tail()
        assert said.count("Warm shutdown") == 2, honcho.tail()
        assert took < HONCHO_GRACE_SECONDS, f"{took:.1f} s\n{honcho.tail()}"
    finally:
        honcho.stop()
        for pid in processes_marked(mark):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
