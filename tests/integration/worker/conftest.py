"""The worker's tests run every delivery's path on SQLite and on PostgreSQL,
each twice: with the fast path (models.fastpath) allowed and with it turned off.

The two executors make the same decisions in a different number of
statements; running the same tests on each is what keeps them from drifting
apart unseen. ``Store.worker_settings`` carries the choice into the worker's
settings, and ``Processed.path`` says which executor ran.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.stores import Store, open_store

PATHS = {
    "sqlite-fast": ("sqlite", True),
    "sqlite-general": ("sqlite", False),
    "postgresql-fast": ("postgresql", True),
    "postgresql-general": ("postgresql", False),
}


@pytest.fixture(
    params=[
        "sqlite-fast",
        "sqlite-general",
        pytest.param("postgresql-fast", marks=pytest.mark.postgres),
        pytest.param("postgresql-general", marks=pytest.mark.postgres),
    ]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated, empty store on SQLite, then on PostgreSQL, each with the
    worker's fast path on, then off."""
    dialect, fast_path = PATHS[request.param]
    yield from open_store(request, tmp_path, dialect, fast_path=fast_path)


@pytest.fixture(
    params=[
        pytest.param("postgresql-fast", marks=pytest.mark.postgres),
        pytest.param("postgresql-general", marks=pytest.mark.postgres),
    ]
)
def postgres_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The PostgreSQL store alone (for what only a real server shows: row locks,
    true concurrency), with the worker's fast path on, then off."""
    dialect, fast_path = PATHS[request.param]
    yield from open_store(request, tmp_path, dialect, fast_path=fast_path)


@pytest.fixture
def fast_path_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """PostgreSQL with the fast path on, for what only its fast path does (its
    own psycopg connection, its round trips)."""
    yield from open_store(request, tmp_path, "postgresql", fast_path=True)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def fast_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each database with the fast path on, for what every fast path does (the
    draft it creates from)."""
    yield from open_store(request, tmp_path, request.param, fast_path=True)
