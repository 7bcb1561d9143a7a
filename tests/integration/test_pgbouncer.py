"""taskhook behind a real PgBouncer in transaction mode (tests/support/pgbouncer.py):
what breaks without TASKHOOK_DATABASE_POOLER=pgbouncer, and that it holds with it.

A pooler in transaction mode gives each transaction whichever server session
is free. PgBouncer hands out the one released last, so a client that holds a
transaction open takes the session the previous client's statements ran on,
and that client's next transaction lands on another: :func:`elsewhere` does
that on purpose, so a prepared statement is looked for where it is not.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import exc, text
from sqlalchemy.engine import make_url

from ingest.app import create_app
from ingest.runtime import AsyncInbox, StoreUnavailable
from models.db import driver_options, libpq_conninfo, make_engine
from models.fastpath import fast_path
from models.inbox import DeliveryStatus, IncomingDelivery
from models.settings import Settings
from tests.support.pgbouncer import PgBouncer, running_pgbouncer
from tests.support.scenarios import a_source
from tests.support.stores import POSTGRES_ADMIN_URL, Store, libpq
from worker import runtime
from worker.processing import TRANSIENT_ERRORS

pytestmark = pytest.mark.postgres

#: More runs of one query than psycopg's prepare_threshold (5): it is prepared.
RUNS = 8
QUERY = text("SELECT count(*) FROM pg_class WHERE relkind = :kind")


def settings(url: str, pooler: str, **values: object) -> Settings:
    return Settings(database_url=url, database_pooler=pooler, **values)


@contextmanager
def elsewhere(pooled_url: str) -> Iterator[None]:
    """While the block runs, another client holds a transaction open through the
    PgBouncer: on the server session released last, the one the block's client
    used before."""
    with psycopg.connect(libpq(pooled_url)) as holder:
        holder.execute("SELECT 1")  # BEGIN: the session is this client's until the rollback
        yield
        holder.rollback()


def run_then_run_elsewhere(engine) -> None:
    with engine.connect() as connection:
        for _ in range(RUNS):
            connection.execute(QUERY, {"kind": "r"}).scalar_one()
            connection.commit()
        with elsewhere(str(engine.url.render_as_string(hide_password=False))):
            connection.execute(QUERY, {"kind": "r"}).scalar_one()
            connection.commit()


@pytest.fixture
def fresh_pgbouncer() -> Iterator[PgBouncer]:
    """A PgBouncer of the test's own: its server sessions hold no prepared
    statement yet, so one looked for elsewhere is not there. (On sessions
    other clients used, it may be theirs: "already exists", or a statement
    with other parameters.)"""
    with running_pgbouncer(POSTGRES_ADMIN_URL) as bouncer:
        yield bouncer


def prepared_elsewhere(error: BaseException | None) -> None:
    assert isinstance(error, psycopg.errors.InvalidSqlStatementName), repr(error)
    assert 'prepared statement "_pg3_' in str(error)
    assert "does not exist" in str(error)


def test_without_the_pooler_setting_a_prepared_statement_is_looked_for_on_another_session(
    postgres_url: str, fresh_pgbouncer: PgBouncer
):
    pooled = fresh_pgbouncer.url(postgres_url)
    engine = make_engine(pooled, settings=settings(pooled, "none"))
    try:
        with pytest.raises(exc.DBAPIError) as failed:
            run_then_run_elsewhere(engine)
    finally:
        engine.dispose()
    prepared_elsewhere(failed.value.orig)


def test_with_the_pooler_setting_nothing_is_prepared_and_every_session_serves(
    postgres_url: str, pgbouncer: PgBouncer
):
    pooled = pgbouncer.url(postgres_url)
    engine = make_engine(pooled, settings=settings(pooled, "pgbouncer"))
    try:
        run_then_run_elsewhere(engine)
        with engine.connect() as connection:
            assert connection.connection.driver_connection.prepare_threshold is None
    finally:
        engine.dispose()


def incoming(source_id: int, delivery_id: str) -> IncomingDelivery:
    return IncomingDelivery(
        source_id=source_id,
        delivery_id=delivery_id,
        body=f'{{"action": "opened", "n": "{delivery_id}"}}'.encode(),  # not a replay
        event="issues.opened",
        action="opened",
        headers={"User-Agent": "GitHub-Hookshot/abc"},
        content_type="application/json",
    )


@pytest.mark.parametrize("pooler", ["none", "pgbouncer"])
def test_the_ingress_inbox_on_the_event_loop_behind_pgbouncer(
    postgres_store: Store, fresh_pgbouncer: PgBouncer, pooler: str
):
    """The webhook path's own psycopg connections (``ingest.runtime.AsyncInbox``):
    one connection, the same statements a delivery after another."""
    store = postgres_store
    source = a_source(store, store.workspace().id)
    pooled = fresh_pgbouncer.url(store.url)
    conninfo = libpq(pooled)

    async def record_all() -> list:
        inbox = AsyncInbox(conninfo, size=1, options=driver_options(settings(pooled, pooler)))
        try:
            recorded = [await inbox.record(incoming(source, f"d-{n}")) for n in range(RUNS)]
            with elsewhere(pooled):
                recorded.append(await inbox.record(incoming(source, "d-last")))
            return recorded
        finally:
            await inbox.close()

    if pooler == "none":
        with pytest.raises(StoreUnavailable) as failed:
            asyncio.run(record_all())
        prepared_elsewhere(failed.value.__cause__)
        return
    recorded = asyncio.run(record_all())
    assert [row.status for row in recorded] == [DeliveryStatus.QUEUED] * (RUNS + 1)


@contextmanager
def worker_runtime(url: str, pooler: str, limit: int = 60) -> Iterator[Settings]:
    values = settings(url, pooler, task_time_limit_seconds=limit, lease_seconds=limit + 1)
    runtime.use(settings=values)
    try:
        yield values
    finally:
        runtime.reset()


def test_the_worker_without_the_pooler_setting_is_refused_its_statement_timeout_option(
    postgres_url: str, pgbouncer: PgBouncer
):
    refused = pytest.raises(exc.OperationalError, match="unsupported startup parameter: options")
    with (
        worker_runtime(pgbouncer.url(postgres_url), "none"),
        runtime.sessions()() as session,
        refused,
    ):
        session.execute(text("SELECT 1"))


def test_the_worker_behind_pgbouncer_runs_its_sessions_and_its_fast_path(
    postgres_url: str, pgbouncer: PgBouncer
):
    with worker_runtime(pgbouncer.url(postgres_url), "pgbouncer"):
        with runtime.sessions()() as session:
            for _ in range(RUNS):
                session.execute(QUERY, {"kind": "r"}).scalar_one()
                session.commit()
        with fast_path(runtime.sessions().kw["bind"]) as fast:
            assert fast is not None
            for _ in range(RUNS):
                fast.connection.execute("SELECT count(*) FROM pg_class").fetchone()
            assert fast.connection.prepare_threshold is None


@pytest.fixture
def bounded_role(postgres_url: str) -> Iterator[str]:
    """A login role of its own whose default statement_timeout, in the test
    database, is one second: what docs/deploy.md asks of the workers' role."""
    role = f"taskhook_bounded_{uuid.uuid4().hex[:8]}"
    database = make_url(postgres_url).database
    with psycopg.connect(libpq(POSTGRES_ADMIN_URL), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"ALTER ROLE {role} IN DATABASE \"{database}\" SET statement_timeout = '1s'")
    try:
        yield role
    finally:
        with psycopg.connect(libpq(POSTGRES_ADMIN_URL), autocommit=True) as admin:
            admin.execute(f'ALTER ROLE {role} IN DATABASE "{database}" RESET ALL')
            admin.execute(f"DROP ROLE {role}")


def test_behind_pgbouncer_the_role_default_bounds_a_worker_statement(
    postgres_url: str, bounded_role: str
):
    with running_pgbouncer(POSTGRES_ADMIN_URL, users=(bounded_role,)) as bouncer:
        url = make_url(bouncer.url(postgres_url)).set(username=bounded_role)
        pooled = url.render_as_string(hide_password=False)
        with worker_runtime(pooled, "pgbouncer"), runtime.sessions()() as session:
            assert session.scalar(text("SHOW statement_timeout")) == "1s"
            with pytest.raises(TRANSIENT_ERRORS) as cancelled:
                session.execute(text("SELECT pg_sleep(5)"))
            assert "statement timeout" in str(cancelled.value)


def test_the_ingress_listens_on_the_direct_url_and_behind_a_pooler_without_one_polls(
    postgres_url: str, pgbouncer: PgBouncer, caplog: pytest.LogCaptureFixture
):
    pooled = pgbouncer.url(postgres_url)

    def listener_of(**values: object):
        app = create_app(settings(pooled, "pgbouncer", **values), publish=lambda keys, lane: None)
        with TestClient(app):
            return app.state.runtime.listener

    with caplog.at_level(logging.WARNING, logger="ingest.events"):
        assert listener_of() is None
    assert "no TASKHOOK_DATABASE_DIRECT_URL: no LISTEN/NOTIFY listener" in caplog.text
    listener = listener_of(database_direct_url=postgres_url)
    assert listener is not None
    assert listener._conninfo == libpq_conninfo(postgres_url)
