"""The worker's own engine: under the threads pool, which enforces no Celery
time limit, the database bounds each statement instead (``worker.runtime``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import text

from models.fastpath import fast_path
from models.settings import Settings
from worker import runtime
from worker.processing import TRANSIENT_ERRORS

LIMIT = 1  # second


@contextmanager
def worker_runtime(url: str) -> Iterator[Settings]:
    """The worker's runtime on ``url`` with a one-second task time limit."""
    settings = Settings(database_url=url, task_time_limit_seconds=LIMIT, lease_seconds=LIMIT + 1)
    runtime.use(settings=settings)
    try:
        yield settings
    finally:
        runtime.reset()


@pytest.mark.postgres
def test_a_statement_that_outlasts_the_task_time_limit_is_cancelled_as_a_retryable_error(
    postgres_url: str,
):
    with worker_runtime(postgres_url), runtime.sessions()() as session:
        assert session.scalar(text("SHOW statement_timeout")) == f"{LIMIT}s"
        started = time.monotonic()
        with pytest.raises(TRANSIENT_ERRORS) as cancelled:
            session.execute(text("SELECT pg_sleep(:seconds)"), {"seconds": LIMIT * 5})
        assert time.monotonic() - started < LIMIT * 4
        assert "statement timeout" in str(cancelled.value)

        # The fast path takes its connections from the same engine: the same limit.
        with fast_path(runtime.sessions().kw["bind"]) as fast:
            assert fast is not None
            (limit,) = fast.connection.execute("SHOW statement_timeout").fetchone()
            assert limit == f"{LIMIT}s"


def test_the_pool_holds_two_connections_per_thread(store):
    with worker_runtime(store.url) as settings:
        engine = runtime.sessions().kw["bind"]
        if store.dialect == "postgresql":
            assert engine.pool.size() == 2 * settings.worker_concurrency
        with runtime.sessions()() as session:  # SQLite ignores the PostgreSQL options
            assert session.scalar(text("SELECT 1")) == 1
