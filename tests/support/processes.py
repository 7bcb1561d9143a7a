"""Real processes of ours for the end-to-end and reliability tests: Celery
workers and the ingress (``python -m ingest.server``) as subprocesses started
from the repository root with short timings, each stopped by its pid (its
process group, so a prefork child goes with it), and bounded waits.

The fixtures that start them per module are in tests/e2e/conftest.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from models.broker.messages import DELIVERY_QUEUES, OPERATOR_QUEUE
from models.inbox import FINISHED
from models.tables import Delivery
from tests.support.pgbouncer import database_environment
from tests.support.redis_databases import machine_redis_url

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = machine_redis_url("TASKHOOK_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
READY_TIMEOUT = 30.0

#: Short timings, so a lease runs out and a sweep comes within seconds.
FAST = {
    "TASKHOOK_TASK_TIME_LIMIT_SECONDS": "4",
    "TASKHOOK_LEASE_SECONDS": "5",
    "TASKHOOK_RETRY_BASE_SECONDS": "0.2",
    "TASKHOOK_RETRY_MAX_SECONDS": "1",
    "TASKHOOK_UNSETTLED_MAX_RETRIES": "30",
    "TASKHOOK_SWEEP_INTERVAL_SECONDS": "1",
    "TASKHOOK_QUEUED_GRACE_SECONDS": "1",
    # The harnesses read Celery's per-task lines (a message received, a sweep's
    # count), which are off by default.
    "TASKHOOK_WORKER_LOG_EACH_TASK": "true",
}


def finished(sessions: sessionmaker[Session], *pks: int) -> Callable[[], bool]:
    """A check: every one of the deliveries is in a finished state."""

    def check() -> bool:
        with sessions() as session:
            statuses = session.scalars(select(Delivery.status).where(Delivery.id.in_(pks))).all()
        return len(statuses) == len(pks) and all(status in FINISHED for status in statuses)

    return check


def wait_until(check: Callable[[], object], *, timeout: float, what: str, logs=()) -> object:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            tails = "\n".join(process.tail() for process in logs)
            pytest.fail(f"timed out after {timeout} s waiting for {what}\n{tails}", pytrace=False)
        time.sleep(0.1)


class WorkerProcess:
    """One subprocess of ours (a Celery worker, uvicorn) and its log."""

    def __init__(
        self,
        name: str,
        log: Path,
        args: list[str],
        env: dict[str, str],
        *,
        preexec_fn: Callable[[], object] | None = None,
        cwd: Path = ROOT,
    ) -> None:
        self.name, self.log = name, log
        with log.open("wb") as output:
            self.process = subprocess.Popen(
                args,
                cwd=cwd,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: a prefork child is stopped with it
                preexec_fn=preexec_fn,  # e.g. a limit on open files, set in the child
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 40) -> str:
        return f"--- {self.name} (pid {self.pid}) ---\n" + "\n".join(
            self.text().splitlines()[-lines:]
        )

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                pytest.fail(f"worker {self.name} exited early\n{self.tail()}", pytrace=False)
            return " ready." in self.text()

        wait_until(ready, timeout=READY_TIMEOUT, what=f"worker {self.name}", logs=[self])

    def stop(self) -> None:
        """Warm shutdown by pid; SIGKILL to its group if it does not go in time."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=15)
        # The group is ours: the worker and any pool child it left behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


def worker_environment(database_url: str, broker_url: str, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TASKHOOK_")}
    env.update(FAST)
    # Straight to the database, or through the PgBouncer the test routes it by.
    env.update(database_environment(database_url))
    env.update(TASKHOOK_BROKER_URL=broker_url, PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


StartWorker = Callable[..., WorkerProcess]


class Launcher:
    """Starts workers into one folder of logs, and stops every one of them."""

    def __init__(self, folder: Path, database_url: str, broker_url: str) -> None:
        self.folder, self.database_url, self.broker_url = folder, database_url, broker_url
        self.started: list[WorkerProcess] = []

    def start(
        self,
        name: str,
        *,
        pool: str | None = None,
        beat: bool = False,
        database_url: str | None = None,
        broker_url: str | None = None,
        **env: str,
    ) -> WorkerProcess:
        unique = f"{name}-{uuid.uuid4().hex[:6]}"
        args = [sys.executable, "-m", "celery", "-A", "worker", "worker"]
        args += ["-Q", ",".join((*DELIVERY_QUEUES, OPERATOR_QUEUE)), "-n", f"{unique}@%h"]
        args += ["-l", "INFO"]
        # No pool named: the shape taskhook ships (threads, TASKHOOK_WORKER_CONCURRENCY).
        if pool is not None:
            args += ["--pool", pool] + (["-c", "1"] if pool == "prefork" else [])
        args += ["--without-gossip", "--without-mingle"]
        if beat:
            args += ["-B", "-s", str(self.folder / f"{unique}-beat-schedule")]
        environment = worker_environment(
            database_url or self.database_url, broker_url or self.broker_url, **env
        )
        process = WorkerProcess(unique, self.folder / f"{unique}.log", args, environment)
        self.started.append(process)
        process.wait_ready()
        return process

    def stop_all(self) -> None:
        for process in self.started:
            process.stop()


def free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Ingress:
    """A real ingress subprocess (``python -m ingest.server``: uvicorn with its bounds)."""

    def __init__(
        self,
        folder: Path,
        database_url: str,
        broker_url: str,
        *,
        preexec_fn: Callable[[], object] | None = None,
        cwd: Path = ROOT,
        **env: str,
    ) -> None:
        environment = worker_environment(database_url, broker_url, **env)
        # A free port may be taken by another suite's process before uvicorn
        # binds it (this machine runs several at once): then another port.
        for _ in range(3):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            args = [sys.executable, "-m", "ingest.server", "--port", str(self.port)]
            args += ["--host", "127.0.0.1", "--no-access-log"]
            self.process = WorkerProcess(
                "uvicorn",
                folder / f"uvicorn-{self.port}.log",
                args,
                environment,
                preexec_fn=preexec_fn,
                cwd=cwd,
            )
            wait_until(self._up, timeout=READY_TIMEOUT, what="uvicorn", logs=[self.process])
            if self.process.process.poll() is None:
                return
        pytest.fail(f"uvicorn found no free port in 3 tries\n{self.process.tail()}", False)

    def _up(self) -> bool:
        """Healthy, or gone because its port was taken (the caller tries another)."""
        if self.process.process.poll() is not None and "Address already in use" in (
            self.process.text()
        ):
            return True
        return self._healthy()

    def _healthy(self) -> bool:
        if self.process.process.poll() is not None:
            pytest.fail(f"uvicorn exited early\n{self.process.tail()}", pytrace=False)
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.process.stop()
