"""What a worker process holds while it runs: its settings and its sessions.

Nothing is built at import. A prefork child builds its engine in Celery's
``worker_process_init`` (see ``worker.celery_app``), after the fork, so no
connection is ever shared between processes; a threads or solo worker, beat or
a test builds it on first use (under threads, once: the lock below). Tests
inject their own with :func:`use`.
"""

from __future__ import annotations

import threading

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from models.db import make_engine, make_session_factory
from models.settings import Settings, get_settings

_lock = threading.Lock()
_settings: Settings | None = None
_engine: Engine | None = None
_sessions: sessionmaker[Session] | None = None


def settings() -> Settings:
    """The injected settings, else the process's (read from the environment once)."""
    return _settings if _settings is not None else get_settings()


def sessions() -> sessionmaker[Session]:
    """The process's session factory, built from the settings on first use."""
    global _engine, _sessions
    if _sessions is None:
        with _lock:
            if _sessions is None:
                # No ping per checkout: it is a round trip per delivery. A
                # connection the server dropped fails one attempt, which is
                # retried (the dead connection is invalidated, not reused).
                _engine = make_engine(
                    settings().database_url,
                    settings=settings(),
                    pool_pre_ping=False,
                    # Under threads, each running delivery holds a connection,
                    # two while it falls back from the fast path to a session.
                    pool_size=2 * settings().worker_concurrency,
                    connect_args=_bounded_statements(settings()),
                )
                _sessions = make_session_factory(_engine)
    return _sessions


def _bounded_statements(settings: Settings) -> dict[str, object]:
    """PostgreSQL connection options that bound how long one statement can
    hold a worker: the server cancels it at the task time limit, and the
    client gives up on a connection whose packets go unanswered as long.

    Celery's time limits are enforced only under prefork; under threads they
    are these. A statement cut off raises a database error, which retries the
    delivery like any other; the lease and the attempt fence make a second run
    harmless. (Ignored for SQLite, whose busy timeout bounds its waits.)
    Behind a pooler only the client's half is set here.
    """
    limit_ms = settings.task_time_limit_seconds * 1000
    if settings.database_pooler != "none":
        # A pooler refuses the startup option (PgBouncer: "unsupported startup
        # parameter: options"), and a SET would stay behind on a server session
        # other clients get next. The role's default bounds the statements
        # there instead (docs/deploy.md, "Behind PgBouncer").
        return {"tcp_user_timeout": limit_ms}
    return {"options": f"-c statement_timeout={limit_ms}", "tcp_user_timeout": limit_ms}


def use(*, sessions: sessionmaker[Session] | None = None, settings: Settings | None = None) -> None:
    """Inject a session factory and/or settings (tests). The caller owns the engine."""
    global _sessions, _settings, _engine
    with _lock:
        _engine = None  # not ours to dispose
        _sessions = sessions
        _settings = settings


def reset(*, close: bool = True) -> None:
    """Forget the engine (and injected values), disposing an engine built here.

    ``close=False`` after a fork: the pooled connections belong to the parent,
    so the child drops them without closing the parent's sockets.
    """
    global _engine, _sessions, _settings
    with _lock:
        if _engine is not None:
            _engine.dispose(close=close)
        _engine = _sessions = _settings = None
