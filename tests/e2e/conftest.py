"""Real Celery workers against the real Redis and PostgreSQL on this machine.

Each worker is a ``celery -A worker worker`` subprocess started from the
repository root with short timings from the environment. Every process a
test starts is stopped by its pid (its process group, so a prefork child goes
with it) in teardown, and every wait is bounded.

Redis: a database of its own (TASKHOOK_TEST_REDIS_URL, default db 13),
FLUSHDB'd before and after, never FLUSHALL. PostgreSQL: the suite's throwaway
database (``postgres_url`` in tests/conftest.py), emptied after each module.
An unreachable Redis or PostgreSQL fails these tests; they never skip. The
embedded-default test needs neither: a SQLite file and the filesystem broker.
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
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis
from celery import Celery
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from models.db import make_engine, make_session_factory
from models.inbox import FINISHED
from models.settings import Settings
from models.tables import Delivery
from tests.brokers import BROKERS, rabbitmq_vhost
from tests.conftest import empty_postgres
from tests.e2e.browser import browser, browser_log, page  # noqa: F401 (fixtures)
from worker.celery_app import make_celery_app

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("TASKHOOK_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
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

    def __init__(self, name: str, log: Path, args: list[str], env: dict[str, str]) -> None:
        self.name, self.log = name, log
        with log.open("wb") as output:
            self.process = subprocess.Popen(
                args,
                cwd=ROOT,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: a prefork child is stopped with it
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
    env.update(
        TASKHOOK_DATABASE_URL=database_url,
        TASKHOOK_BROKER_URL=broker_url,
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


StartWorker = Callable[..., WorkerProcess]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module that sets ``ON_EVERY_BROKER = True`` runs once on Redis and once
    on RabbitMQ: the same tests, on each broker taskhook supports."""
    if "broker" in metafunc.fixturenames and getattr(metafunc.module, "ON_EVERY_BROKER", False):
        metafunc.parametrize("broker", BROKERS, indirect=True, scope="module")


@pytest.fixture(scope="module")
def broker(request: pytest.FixtureRequest) -> str:
    """Which broker the module's processes use: Redis, unless the module runs
    on every broker (``ON_EVERY_BROKER``)."""
    return getattr(request, "param", "redis")


@pytest.fixture(scope="module")
def broker_url(broker: str, request: pytest.FixtureRequest) -> str:
    """The module's broker: a Redis database of its own, or a RabbitMQ virtual
    host of its own on the machine's RabbitMQ (made now, deleted after)."""
    if broker == "rabbitmq":
        return request.getfixturevalue("rabbitmq_url")
    return request.getfixturevalue("redis_url")


@pytest.fixture(scope="module")
def rabbitmq_url() -> Iterator[str]:
    with rabbitmq_vhost() as url:
        yield url


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except redis.RedisError as error:
        pytest.fail(
            f"Redis is not reachable at {REDIS_URL} ({error}). Start it (scripts/test does, "
            "when it is installed) or point TASKHOOK_TEST_REDIS_URL at one.",
            pytrace=False,
        )
    client.flushdb()
    try:
        yield REDIS_URL
    finally:
        client.flushdb()
        client.close()


@pytest.fixture(scope="module")
def sessions(postgres_url: str, broker_url: str) -> Iterator[sessionmaker[Session]]:
    """The test's own view of the database the workers use; emptied when the
    module ends on its broker (a module on every broker starts clean on each)."""
    engine = make_engine(postgres_url)
    try:
        yield make_session_factory(engine)
    finally:  # the integration tests after this module expect an empty database
        empty_postgres(engine)
        engine.dispose()


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
        args += ["-Q", "deliveries,operator", "-n", f"{unique}@%h", "-l", "INFO"]
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


@pytest.fixture(scope="module")
def start_worker(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str, broker_url: str, sessions
) -> Iterator[StartWorker]:
    """Start workers on PostgreSQL and the module's broker; all are stopped, by
    pid, when the module ends -- before the database is emptied and the broker
    cleared."""
    launcher = Launcher(tmp_path_factory.mktemp("workers"), postgres_url, broker_url)
    try:
        yield launcher.start
    finally:
        launcher.stop_all()


@pytest.fixture
def start_embedded_worker(tmp_path: Path) -> Iterator[StartWorker]:
    """Start workers on the embedded default: a SQLite file and the filesystem
    broker, both in ``tmp_path``. Needs no server."""
    launcher = Launcher(tmp_path, f"sqlite:///{tmp_path / 'taskhook.db'}", "filesystem://")
    try:
        yield lambda name, **options: launcher.start(
            name, TASKHOOK_BROKER_FOLDER=str(tmp_path / "broker"), **options
        )
    finally:
        launcher.stop_all()


@pytest.fixture(scope="module")
def client(postgres_url: str, broker_url: str) -> Iterator[Celery]:
    """A Celery client that sends by name, as the ingress and the CLI do."""
    app = make_celery_app(Settings(database_url=postgres_url, broker_url=broker_url))
    try:
        yield app
    finally:
        app.close()


def free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Ingress:
    """A real ingress subprocess (``python -m ingest.server``: uvicorn with its bounds)."""

    def __init__(self, folder: Path, database_url: str, broker_url: str, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "ingest.server", "--port", str(self.port)]
        args += ["--host", "127.0.0.1", "--no-access-log"]
        environment = worker_environment(database_url, broker_url, **env)
        self.process = WorkerProcess(
            "uvicorn", folder / f"uvicorn-{self.port}.log", args, environment
        )
        wait_until(self._healthy, timeout=READY_TIMEOUT, what="uvicorn", logs=[self.process])

    def _healthy(self) -> bool:
        if self.process.process.poll() is not None:
            pytest.fail(f"uvicorn exited early\n{self.process.tail()}", pytrace=False)
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.process.stop()


@pytest.fixture(scope="module")
def start_ingress(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str, broker_url: str, sessions
) -> Iterator[Callable[..., Ingress]]:
    """Start uvicorn on PostgreSQL and the module's broker; stopped by pid when
    the module ends."""
    folder = tmp_path_factory.mktemp("ingress")
    started: list[Ingress] = []

    def start(**env: str) -> Ingress:
        started.append(Ingress(folder, postgres_url, broker_url, **env))
        return started[-1]

    try:
        yield start
    finally:
        for ingress in started:
            ingress.stop()
