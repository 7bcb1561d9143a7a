"""Databases for the suite: every store test runs on SQLite and on the real PostgreSQL.

PostgreSQL is the server on 127.0.0.1:5432 (override with
TASKHOOK_TEST_POSTGRES_URL, an admin URL). The suite creates its own throwaway
database, migrates it with Alembic, empties it after every test and drops it
at the end. An unreachable PostgreSQL fails the tests that need it -- it never
skips them.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from migrations import upgrade_to_head
from models.access import Caller
from models.db import make_engine, make_session_factory, session_scope
from models.settings import Settings
from models.tables import Base, Workspace
from models.workspaces import StepSpec, create_workspace

POSTGRES_ADMIN_URL = os.environ.get(
    "TASKHOOK_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
TRUSTED = Caller.trusted("tests")


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass
class Store:
    """One migrated database and how to reach it."""

    dialect: str
    url: str
    engine: Engine
    sessions: sessionmaker[Session]
    #: Whether the worker may take its fast path here (the worker tests run
    #: on each database with it on and off: tests/integration/worker).
    fast_path: bool = True

    @property
    def takes_fast_path(self) -> bool:
        """A plain create runs on the fast path (models.fastpath) on this store."""
        return self.fast_path

    def worker_settings(self, base: Settings) -> Settings:
        """``base`` with the worker's path as this store runs it."""
        return base.model_copy(update={"worker_fast_path": self.fast_path})

    def workspace(
        self, slug: str = "acme", prefix: str = "ACME", intake_wip_limit: int | None = None
    ) -> Workspace:
        steps = (StepSpec("Inbox", intake_wip_limit), StepSpec("Done"))
        with session_scope(self.sessions) as session:
            return create_workspace(
                session=session, slug=slug, name=slug.title(), task_prefix=prefix, steps=steps
            )

    def scalar(self, sql: str, **params: object) -> object:
        with self.engine.connect() as connection:
            return connection.execute(text(sql), params).scalar()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL database, migrated to head, for the whole run."""
    name = f"taskhook_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(_libpq(POSTGRES_ADMIN_URL), autocommit=True, connect_timeout=5)
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
    with psycopg.connect(_libpq(POSTGRES_ADMIN_URL), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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


def empty_postgres(engine: Engine) -> None:
    """Every table emptied and every sequence back at 1, as a new database.

    DELETE, not TRUNCATE: TRUNCATE gives each of the tables a new file, about
    120 ms a test here; deleting a test's few rows costs about 3 ms, which
    over the suite's PostgreSQL tests is almost two minutes."""
    with engine.begin() as connection:
        for table in reversed(Base.metadata.sorted_tables):  # children first
            connection.execute(table.delete())
        connection.exec_driver_sql(
            "SELECT setval(quote_ident(schemaname) || '.' || quote_ident(sequencename), 1, false) "
            "FROM pg_sequences"
        )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated, empty task store on SQLite, then on PostgreSQL."""
    yield from open_store(request, tmp_path, request.param)


def open_store(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str, *, fast_path: bool = True
) -> Iterator[Store]:
    """The ``store`` fixture's body: a migrated, empty store on ``dialect``."""
    if dialect == "sqlite":
        path = tmp_path / "taskhook.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        url = f"sqlite:///{path}"
    else:
        url = request.getfixturevalue("postgres_url")
    engine = make_engine(url)
    try:
        yield Store(dialect, url, engine, make_session_factory(engine), fast_path=fast_path)
    finally:
        if dialect == "postgresql":
            empty_postgres(engine)
        engine.dispose()


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
