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

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from playwright.sync_api import Browser, Page
from sqlalchemy.orm import Session, sessionmaker

from models.db import make_engine, make_session_factory
from models.settings import Settings
from tests.support.brokers import BROKERS, rabbitmq_vhost
from tests.support.browser import BrowserLog, launched_chromium, watched_page
from tests.support.pgbouncer import EVERY_TEST_THROUGH_PGBOUNCER, routed_through
from tests.support.processes import REDIS_URL, Ingress, Launcher, StartWorker
from tests.support.stores import empty_postgres
from worker.celery_app import make_celery_app

#: How the processes a module starts reach PostgreSQL: straight, or through a
#: PgBouncer in transaction mode (docs/deploy.md, "Behind PgBouncer").
ROUTES = ("direct", "pgbouncer")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module that sets ``ON_EVERY_BROKER = True`` runs once on Redis and once
    on RabbitMQ: the same tests, on each broker taskhook supports. One that
    sets ``THROUGH_PGBOUNCER_TOO = True`` runs again with its processes behind
    a PgBouncer (on Redis alone: the broker is not what changes). With
    TASKHOOK_TEST_PGBOUNCER=1 every module runs behind one, once."""
    brokers = BROKERS if getattr(metafunc.module, "ON_EVERY_BROKER", False) else ()
    routes = () if EVERY_TEST_THROUGH_PGBOUNCER else ROUTES
    routes = routes if getattr(metafunc.module, "THROUGH_PGBOUNCER_TOO", False) else ()
    if "broker" not in metafunc.fixturenames:
        brokers = ()
    if brokers and routes:
        pairs = [(broker, "direct") for broker in brokers] + [("redis", "pgbouncer")]
        metafunc.parametrize(
            ("broker", "database_route"),
            pairs,
            ids=[f"{broker}-{route}" for broker, route in pairs],
            indirect=True,
            scope="module",
        )
    elif brokers:
        metafunc.parametrize("broker", brokers, indirect=True, scope="module")
    elif routes:
        metafunc.parametrize("database_route", routes, indirect=True, scope="module")


@pytest.fixture(scope="module", autouse=True)
def database_route(request: pytest.FixtureRequest) -> Iterator[str]:
    """How the module's processes reach PostgreSQL (``ROUTES``): through a
    PgBouncer, their TASKHOOK_DATABASE_URL is its, with the settings taskhook
    needs behind one (tests/support/pgbouncer.py). The tests' own sessions
    always go straight to PostgreSQL."""
    default = "pgbouncer" if EVERY_TEST_THROUGH_PGBOUNCER else "direct"
    route = getattr(request, "param", default)
    if route == "direct":
        yield route
        return
    with routed_through(request.getfixturevalue("pgbouncer")):
        yield route


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
def sessions(
    postgres_url: str, broker_url: str, database_route: str
) -> Iterator[sessionmaker[Session]]:
    """The test's own view of the database the workers use; emptied when the
    module ends on its broker (a module on every broker starts clean on each,
    and again behind a PgBouncer: its workers and ingress are new too)."""
    engine = make_engine(postgres_url)
    try:
        yield make_session_factory(engine)
    finally:  # the integration tests after this module expect an empty database
        empty_postgres(engine)
        engine.dispose()


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


@pytest.fixture(scope="module")
def start_ingress(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str, broker_url: str, sessions
) -> Iterator[Callable[..., Ingress]]:
    """Start uvicorn on PostgreSQL and the module's broker; stopped by pid when
    the module ends."""
    folder = tmp_path_factory.mktemp("ingress")
    started: list[Ingress] = []

    def start(*, preexec_fn: Callable[[], object] | None = None, **env: str) -> Ingress:
        started.append(Ingress(folder, postgres_url, broker_url, preexec_fn=preexec_fn, **env))
        return started[-1]

    try:
        yield start
    finally:
        for ingress in started:
            ingress.stop()


# --- a real headless Chromium, for the console's tests (tests/support/browser.py) ----------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with launched_chromium() as launched:
        yield launched


@pytest.fixture
def browser_log() -> BrowserLog:
    return BrowserLog()


@pytest.fixture
def page(browser: Browser, browser_log: BrowserLog) -> Iterator[Page]:
    """A fresh context per test; it fails the test at teardown on a dialog, a
    script error, a refused policy or a part of the page that did not load."""
    with watched_page(browser, browser_log) as opened:
        yield opened
