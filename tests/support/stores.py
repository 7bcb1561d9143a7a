"""The task store every store test runs on: one migrated database (SQLite or
the real PostgreSQL) and how to reach it, and how a test empties it.

The fixtures that hand these out (``store``, ``postgres_store``, the session's
``postgres_url`` and ``sqlite_template``) are in tests/conftest.py.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from models.access import Caller
from models.db import make_engine, make_session_factory, session_scope
from models.settings import Settings
from models.tables import Base, Workspace
from models.workspaces import StepSpec, create_workspace

POSTGRES_ADMIN_URL = os.environ.get(
    "TASKHOOK_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
TRUSTED = Caller.trusted("tests")


def libpq(url: str) -> str:
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
