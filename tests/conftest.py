"""Databases for the suite: every store test runs on SQLite and on the real PostgreSQL.

PostgreSQL is the server on 127.0.0.1:5432 (override with
TASKHOOK_TEST_POSTGRES_URL, an admin URL). The suite creates its own throwaway
database, migrates it with Alembic, empties it after every test and drops it
at the end. An unreachable PostgreSQL fails the tests that need it -- it never
skips them.

What a store is and how it is opened: tests/support/stores.py. Helpers the
tests share live in tests/support/; a test never imports a conftest.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from migrations import upgrade_to_head
from models import sealing
from models.db import make_engine, make_session_factory
from tests.support import figures
from tests.support.descriptors import DescriptorWatch, open_descriptors
from tests.support.pgbouncer import PgBouncer, running_pgbouncer
from tests.support.stores import POSTGRES_ADMIN_URL, Store, empty_postgres, libpq, open_store

#: The key every process of the suite seals credentials with: the embedded
#: default's key file, made as ``scripts/run`` makes it (``taskhook secrets
#: init``), which every process the tests start from the repository reads.
sealing.create_key_file(str(Path(__file__).resolve().parents[1] / "var" / "encryption.key"))

#: File descriptors the session may leave open: those of caches that live as
#: long as the process (kombu's connection pools, an event loop's selector).
#: About a dozen stay after tests/integration, in any order; when every SQLite
#: engine kept its writer lock's file open, over a thousand did.
DESCRIPTOR_LIMIT = 64


@pytest.fixture(scope="session", autouse=True)
def descriptors_watched() -> Iterator[DescriptorWatch]:
    """Fails the session when its tests left file descriptors open: a leak of
    one a test is unseen until some order of the suite runs out of them."""
    watch = DescriptorWatch(DESCRIPTOR_LIMIT)
    yield watch
    if (excess := watch.excess()) is not None:
        pytest.fail(excess, pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def descriptors_per_module(
    request: pytest.FixtureRequest, descriptors_watched: DescriptorWatch
) -> Iterator[None]:
    """Counts what each module leaves open, so a failure names the leaking modules."""
    before = open_descriptors()
    yield
    descriptors_watched.module_ran(request.module.__name__, before)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL database, migrated to head, for the whole run."""
    name = f"taskhook_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(libpq(POSTGRES_ADMIN_URL), autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as error:
        pytest.fail(
            f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL} ({error}). Start it "
            "(scripts/test does, when it is installed) or point TASKHOOK_TEST_POSTGRES_URL "
            "at a server where this user may create databases.",
            pytrace=False,
        )
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    with engine.begin() as connection:
        upgrade_to_head(connection)
    engine.dispose()
    yield url
    with psycopg.connect(libpq(POSTGRES_ADMIN_URL), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pgbouncer() -> Iterator[PgBouncer]:
    """A PgBouncer of the run's own in transaction mode, in front of the
    machine's PostgreSQL (tests/support/pgbouncer.py); started when a test
    first asks for it, stopped at the end."""
    with running_pgbouncer(POSTGRES_ADMIN_URL) as bouncer:
        yield bouncer


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once; each test gets a copy."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        upgrade_to_head(connection)
    with engine.connect() as connection:  # fold the WAL into the file before copying it
        connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()
    return path


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated, empty task store on SQLite, then on PostgreSQL."""
    yield from open_store(request, tmp_path, request.param)


@pytest.fixture
def postgres_store(postgres_url: str) -> Iterator[Store]:
    """The PostgreSQL store alone, for what only a real server can show (row locks)."""
    engine = make_engine(
        postgres_url,
    )
    try:
        yield Store("postgresql", postgres_url, engine, make_session_factory(engine))
    finally:
        empty_postgres(engine)
        engine.dispose()


#: The reliability scenarios share one session: the log folder all their
#: processes write to and the secrets they handed out, which the last of them
#: greps (``runs_last``). On several workers they all run on one.
RELIABILITY = "tests/reliability/"
#: The longest units of work, started first on several workers so that no
#: worker is left with one of them at the end while the others wait: the
#: reliability scenarios together, then the benchmarks' smoke runs.
LONGEST_FIRST = (RELIABILITY, "tests/bench/test_smoke.py")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest units first (:data:`LONGEST_FIRST`), then the rest in the
    order pytest-randomly shuffled them; tests marked ``runs_last`` go after
    all others (a test that reads what the whole run left behind, every log
    searched for every secret handed out, must come after it)."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("runs_last"):
            return len(LONGEST_FIRST) + 1
        starts = [item.nodeid.startswith(prefix) for prefix in LONGEST_FIRST]
        return starts.index(True) if True in starts else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the shuffled order holds within a rank


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` (scripts/test), with the reliability scenarios as
    one unit, and the units in the order collected (longest first) rather
    than by their number of tests."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByFileReliabilityTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return RELIABILITY if nodeid.startswith(RELIABILITY) else super()._split_scope(nodeid)

    config.option.loadscopereorder = False
    return ByFileReliabilityTogether(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """A worker's reliability figures, for this process's summary."""
    figures.take_over(node.config, getattr(node, "workeroutput", {}).get(figures.WORKER_OUTPUT))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say plainly how many tests ran against the real PostgreSQL."""
    ran = [
        report
        for status in ("passed", "failed", "error")
        for report in terminalreporter.stats.get(status, [])
        if getattr(report, "when", "call") == "call" and "postgres" in report.keywords
    ]
    passed = sum(1 for report in ran if report.passed)
    terminalreporter.write_line(
        f"PostgreSQL ({POSTGRES_ADMIN_URL}): {len(ran)} tests ran, {passed} passed"
    )
    figures.summarize(terminalreporter, config)
