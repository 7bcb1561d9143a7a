"""The reliability harness: private servers, the scenario's processes, the secrets
used, the figures measured, and a time bound on every scenario.

Run it all with ``pytest -m reliability`` (the README's ``scripts/test`` runs
it with everything else); one scenario alone with its file, e.g.
``pytest tests/reliability/test_03_redis_flushed.py``. Bigger runs:
``TASKHOOK_RELIABILITY_SCALE=10`` multiplies the counts (see ``scaled`` in tests/support/stack.py).
The figures of a run are printed at its end and written to
``figures.json`` in the run's log folder (and to ``$TASKHOOK_RELIABILITY_FIGURES``
when set).
"""

from __future__ import annotations

import logging
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.figures import Figures, hand_over
from tests.support.pgbouncer import EVERY_TEST_THROUGH_PGBOUNCER, routed_through
from tests.support.services import PrivatePostgres, PrivateRedis, ThrowawayDatabase
from tests.support.stack import SCALE, Stack

#: No scenario may run longer than this many seconds (times the scale).
SCENARIO_TIME_LIMIT = 300


# --- a bound on every scenario -------------------------------------------------------------------


class ScenarioTimedOut(Exception):
    pass


@pytest.fixture(autouse=True)
def _time_bound(request: pytest.FixtureRequest) -> Iterator[None]:
    """Interrupt a scenario that runs past its bound; its teardown still stops
    every process it started."""
    limit = int(SCENARIO_TIME_LIMIT * SCALE)

    def expired(signum, frame):
        raise ScenarioTimedOut(f"{request.node.nodeid} ran past {limit} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --- logs, secrets and figures of the whole run --------------------------------------------------


class SecretBook:
    """Every secret the run hands out: signing secrets, API tokens, passwords.
    The security scenario greps every log of the run for each of them."""

    def __init__(self) -> None:
        self.values: set[str] = set()

    def new(self, label: str) -> str:
        value = f"{label}-{secrets.token_hex(12)}"
        self.values.add(value)
        return value

    def add(self, value: str) -> str:
        self.values.add(value)
        return value


@pytest.fixture(scope="session")
def log_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where every process of the run logs; this process's own records go to
    ``pytest-process.log`` there too (the secret grep reads them all)."""
    folder = tmp_path_factory.mktemp("reliability-logs")
    handler = logging.FileHandler(folder / "pytest-process.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)
    ours = [logging.getLogger(name) for name in ("ingest", "models", "worker")]
    levels = [logger.level for logger in ours]
    for logger in ours:
        logger.setLevel(logging.INFO)
    try:
        yield folder
    finally:
        root.removeHandler(handler)
        handler.close()
        for logger, level in zip(ours, levels, strict=True):
            logger.setLevel(level)


@pytest.fixture(scope="session")
def secret_book() -> SecretBook:
    return SecretBook()


@pytest.fixture(scope="session")
def figures(request: pytest.FixtureRequest, log_folder: Path) -> Figures:
    """What each scenario measured (printed by tests/conftest.py's summary)."""
    return Figures(log_folder, request.config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    hand_over(session.config)


# --- servers -------------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _through_pgbouncer(request: pytest.FixtureRequest) -> Iterator[None]:
    """With TASKHOOK_TEST_PGBOUNCER=1, the scenarios' processes reach the shared
    PostgreSQL through a PgBouncer in transaction mode (tests/support/pgbouncer.py);
    a scenario's private cluster they still reach directly."""
    if not EVERY_TEST_THROUGH_PGBOUNCER:
        yield
        return
    with routed_through(request.getfixturevalue("pgbouncer")):
        yield


@pytest.fixture(scope="module")
def module_logs(log_folder: Path, request: pytest.FixtureRequest) -> Path:
    folder = log_folder / request.module.__name__.rsplit(".", 1)[-1]
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def private_redis(module_logs: Path, secret_book: SecretBook) -> Iterator[PrivateRedis]:
    """A Redis of the scenario's own (flushed, restarted, frozen at will)."""
    server = PrivateRedis(module_logs, secret_book.new("redis-password")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def shared_database() -> Iterator[ThrowawayDatabase]:
    """A migrated database of the scenario's own on the shared PostgreSQL."""
    database = ThrowawayDatabase("s")
    try:
        yield database
    finally:
        database.drop()


@pytest.fixture(scope="module")
def private_postgres(module_logs: Path, secret_book: SecretBook) -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of the scenario's own (restarted at will)."""
    cluster = PrivatePostgres(secret_book.new("pg-password"), module_logs)
    try:
        cluster.init().start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="module")
def stack_on(module_logs: Path) -> Iterator:
    """``stack_on(database_url, broker_url, **env)``: a Stack whose processes are
    all stopped, by pid, when the module ends."""
    stacks: list[Stack] = []

    def build(database_url: str, broker_url: str, **env: str) -> Stack:
        stacks.append(Stack(module_logs, database_url, broker_url, **env))
        return stacks[-1]

    try:
        yield build
    finally:
        for stack in stacks:
            stack.stop_all()
