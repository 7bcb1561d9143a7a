"""What a worker process holds while it runs: its settings and its sessions.

Nothing is built at import. A prefork child builds its engine in Celery's
``worker_process_init`` (see ``worker.celery_app``), after the fork, so no
connection is ever shared between processes; a solo worker, beat or a test
builds it on first use. Tests inject their own with :func:`use`.
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
                    settings().database_url, settings=settings(), pool_pre_ping=False
                )
                _sessions = make_session_factory(_engine)
    return _sessions


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
