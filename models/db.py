"""Engines and sessions, built from settings when a process starts, never at import.

The FastAPI lifespan and Celery's ``worker_process_init`` call
:func:`make_engine`; tests build their own engines against throwaway databases.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg.conninfo
import sqlalchemy
from sqlalchemy import Engine, event
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

from models.postgres_hosts import spread_hosts
from models.settings import Settings
from models.sqlite_writer import WriterConnection, WriterLock, lock_file_for

#: The settings' defaults, for an engine built without settings (a test's).
_DEFAULTS = Settings.model_construct()


class NoDatabase(Exception):
    """The SQLite file an engine was to open, without creating it, does not exist."""

    def __init__(self, path: str) -> None:
        super().__init__(f"no database at {path}")
        self.path = path


def make_engine(
    url: str, *, settings: Settings | None = None, create: bool = True, **options: object
) -> Engine:
    """An engine for ``url``, tuned for the dialect it names.

    SQLite gets WAL (readers never wait for the writer), the settings'
    ``synchronous`` level (what a commit is durable against), a busy timeout
    (two writers queue instead of failing), optionally writers queued on a
    lock handed over at once (``models.sqlite_writer``) and enforced foreign keys (so
    deleting a task deletes its source link, as on PostgreSQL). The parent directory of a
    SQLite file is created, so the default ``./var/taskhook.db`` just works;
    with ``create=False`` a SQLite file that does not exist is
    :class:`NoDatabase`, and neither it nor its folder is made (the CLI: a
    mistyped path must not leave an empty database behind).
    ``options`` go to :func:`sqlalchemy.create_engine` (a pool size, say) for
    a server; SQLite takes none of them. Without ``settings``, the defaults:
    the environment is read at a process's edge (``models.settings``), not here.
    """
    url = spread_hosts(url)
    parsed = make_url(url)
    # A statement's parameters are a request's values (a title, a description):
    # never in an error message, so never in a log line.
    options.setdefault("hide_parameters", True)
    if parsed.get_backend_name() != "sqlite":
        options.setdefault("pool_pre_ping", True)
        connect_args = {**driver_options(settings or _DEFAULTS), **options.get("connect_args", {})}
        if connect_args:
            options["connect_args"] = connect_args
        # Looked up at the call, not imported: the SQLAlchemy instrumentation
        # (models.tracing) traces engines by wrapping sqlalchemy.create_engine.
        return sqlalchemy.create_engine(url, **options)

    settings = settings or _DEFAULTS
    writer_lock = None
    if parsed.database and parsed.database != ":memory:":
        if not create and "uri" not in parsed.query and not Path(parsed.database).is_file():
            raise NoDatabase(parsed.database)
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        if settings.sqlite_writer_lock:
            writer_lock = WriterLock(
                lock_file_for(parsed.database),
                timeout_seconds=settings.sqlite_busy_timeout_ms / 1000,
            )
    busy_timeout_ms = settings.sqlite_busy_timeout_ms
    # The options are a server's (a pool size, PostgreSQL's connection
    # options); a SQLite file takes none of them.
    engine = sqlalchemy.create_engine(
        url,
        connect_args={"timeout": busy_timeout_ms / 1000, "factory": WriterConnection},
        hide_parameters=options["hide_parameters"],
    )

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # What a commit is durable against: Settings.sqlite_synchronous.
        cursor.execute(f"PRAGMA synchronous={settings.sqlite_synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.close()
        dbapi_connection.writer_lock = writer_lock

    if writer_lock is not None:

        @event.listens_for(engine, "before_cursor_execute")
        def _queue_the_writers(_connection, cursor, statement, *_):
            cursor.connection.take_writer_lock_before(statement)

    return engine


def libpq_conninfo(url: str | URL) -> str:
    """libpq's connection string for a PostgreSQL URL, for a psycopg connection
    of our own (the ingress's inbox writer and event listener). Built by the
    dialect that reads the URL for the engines, so both connect alike: the
    URL rendered as a string would hand libpq ``host=h1:5432&host=h2:5432``,
    which it reads as one host named ``h2:5432`` (``models.postgres_hosts``)."""
    url = make_url(spread_hosts(url) if isinstance(url, str) else url)
    _, options = PGDialect_psycopg().create_connect_args(url)
    # Only libpq's keywords: the dialect may add psycopg's adapters ("context").
    return psycopg.conninfo.make_conninfo(
        **{key: value for key, value in options.items() if isinstance(value, str | int)}
    )


def driver_options(settings: Settings) -> dict[str, object]:
    """psycopg's connection options for the settings' database.

    Behind a pooler in transaction mode (``database_pooler``), no prepared
    statements: psycopg prepares a query on the server session the sixth time
    a connection runs it, and the pooler gives the next transaction another
    session, which knows no such name ("prepared statement "_pg3_0" does not
    exist") or knows another client's under it. PostgreSQL plans each
    statement instead, as it does for the first five."""
    if settings.database_pooler != "none":
        return {"prepare_threshold": None}
    return {}


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: the create sequence commits twice (insert, then
    # settle) and hands the task back to its caller after the last commit.
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """A unit of work: commits when the block ends normally, rolls back otherwise.

    The create sequence and the worker's run need some writes durable before
    the next step begins; they commit those in named :func:`transaction`
    blocks inside the unit of work, and its own commit takes what is left.

    A block that never used its session (the worker's fast path runs on a
    connection of its own and asks the session only for its engine) costs
    neither a commit nor a close: with one message per delivery, those were
    about 4 % of a worker's time (docs/performance.md, section 11). A session
    holds a connection only inside a transaction, and pending objects are
    flushed, so nothing is skipped that had anything to do.
    """
    session = sessions()
    try:
        yield session
        if session.in_transaction() or session.new or session.dirty or session.deleted:
            session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        if session.in_transaction() or session.identity_map:
            session.close()


@contextmanager
def transaction(session: Session, name: str) -> Iterator[Session]:
    """One of several transactions a sequence needs, each durable before the
    next begins (the create's insert, then its settlement: docs/contract.md,
    "The create sequence"). Commits what the session did since its last
    commit when the block ends normally, rolls it back otherwise; ``name``
    says which transaction failed, in the error's notes."""
    try:
        yield session
        session.commit()
    except BaseException as error:
        session.rollback()
        error.add_note(f"in the transaction: {name}")
        raise
