"""What every process of taskhook checks as it starts, each failure said in one line.

The web process (``ingest.server``), the Celery worker and beat
(``worker.celery_app``) and the CLI (``worker.cli.runtime``) each, before
anything else:

1. warn, one line each, about ``TASKHOOK_`` variables that are not settings:
   a misspelled name is otherwise ignored and its default used without a word;
2. read the settings, and on a bad value say which variable and what it takes;
3. the services only: connect once to the database and to the broker they
   use, and on a failure say where (never the password) and why.

A service prints its line on stderr and exits 1 (:func:`refuse`) before it
logs anything else: a worker whose database cannot be reached never says
"ready". The CLI turns the same lines into its own refusals (``Error: ...``).
What comes after the start -- a database that goes away later -- is the
processes' own business (503s, retries, the sweeper).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import NoReturn, TextIO

from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from models import logs, sealing
from models.credentials import check_keys_cover
from models.db import NoDatabase, make_engine
from models.settings import (
    Settings,
    for_people,
    get_settings,
    invalid_settings,
    unknown_variables,
)

#: How every line a process says about its start begins.
PREFIX = "taskhook: "
#: How long a process waits, at its start, for its database or broker to answer.
CONNECT_TIMEOUT_SECONDS = 5.0

_warned = False


class CannotStart(Exception):
    """Why a process cannot start: ``str()`` is one line, naming the setting."""


class BrokerDown(CannotStart):
    """The broker did not answer at all (refused, timed out): an outage, not a
    mistake in the settings. The web process starts through one
    (:func:`service_ready`): it stores deliveries without a broker, and the
    sweeper sends them once the broker is back."""


def warn_about_unknown_variables(
    environ: Mapping[str, str] | None = None, *, to: TextIO | None = None
) -> None:
    """One warning line on stderr per unknown ``TASKHOOK_`` variable; never
    fatal. For the process's own environment (``environ`` None), once: the CLI
    and the Celery app it loads both start by reading the settings."""
    global _warned
    if environ is None:
        if _warned:
            return
        _warned = True
    for warning in unknown_variables(os.environ if environ is None else environ):
        _say(f"warning: {warning}", logging.WARNING, to=to or sys.stderr)


def read_settings() -> Settings:
    """The process's settings (:func:`models.settings.get_settings`), or
    :class:`CannotStart` saying which value is wrong and what is allowed."""
    try:
        return get_settings()
    except ValidationError as error:
        raise CannotStart(invalid_settings(error)) from None


def check_database(settings: Settings, *, timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
    """Connect to the settings' database once, or :class:`CannotStart`. A
    SQLite file is created if missing, as the service's own engine would."""
    url = settings.database_url
    try:
        engine = make_engine(
            url,
            settings=settings,
            poolclass=NullPool,
            connect_args={"connect_timeout": max(2, round(timeout))},  # libpq's least is 2
        )
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except (DBAPIError, NoDatabase, OSError) as error:
        raise CannotStart(
            f"cannot reach the database at {for_people(url)} (TASKHOOK_DATABASE_URL): "
            f"{database_reason(error)}"
        ) from None


def check_encryption(settings: Settings) -> None:
    """Install the keyring the settings name, or :class:`CannotStart`: no key
    at all, a key that is not one, or a key removed while it still seals
    stored credentials (``models.credentials``). Never a fallback to plain text."""
    try:
        keyring = sealing.install(sealing.keyring_of(settings))
    except sealing.SealingError as problem:
        raise CannotStart(str(problem)) from None
    engine = make_engine(settings.database_url, settings=settings, poolclass=NullPool)
    try:
        with Session(engine) as session:
            check_keys_cover(session, keyring)
    except sealing.SealingError as problem:
        raise CannotStart(str(problem)) from None
    except DBAPIError:
        pass  # no tables yet: the service's first query says so, as it did before
    finally:
        engine.dispose()


def database_reason(error: BaseException) -> str:
    """Why a connection to the database failed, in a few words: libpq's
    reason without its preamble ("connection refused", 'database "x" does
    not exist', "password authentication failed for user ...")."""
    if isinstance(error, DBAPIError) and error.orig is not None:
        error = error.orig
    if isinstance(error, OSError) and error.strerror:
        where = f": {error.filename}" if error.filename else ""
        return _lower_first(error.strerror) + where
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    # 'connection failed: connection to server at "h", port 5433 failed: FATAL:  ...'
    reason = text.rsplit(" failed: ", 1)[-1].removeprefix("FATAL:").strip()
    return _lower_first(reason)


def check_broker(settings: Settings, *, timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
    """Connect to the settings' broker once, or :class:`CannotStart`."""
    # Imported here: the CLI reads its settings through this module on every
    # command, and only the services connect to the broker at their start.
    from kombu import Connection

    from models.broker.connection import broker_transport, broker_transport_options

    try:
        with Connection(
            settings.broker_url,
            transport=broker_transport(settings),
            transport_options=broker_transport_options(settings),
            connect_timeout=timeout,
        ) as connection:
            # No retry: the first answer is the one to report.
            connection.ensure_connection(max_retries=0, timeout=timeout)
    except Exception as error:  # whatever kombu's transport raised, it could not connect
        kind = BrokerDown if _unanswered(error) else CannotStart
        raise kind(
            f"cannot reach the broker at {for_people(settings.broker_url)} "
            f"(TASKHOOK_BROKER_URL): {broker_reason(error)}"
        ) from None


def _unanswered(error: BaseException) -> bool:
    """Whether the broker never answered (an operating system's error all the
    way): a refused login or an unknown virtual host is an answer."""
    from amqp.exceptions import AMQPError  # kombu's: see check_broker
    from redis.exceptions import AuthenticationError, ResponseError

    seen: BaseException | None = error
    outage = False
    while seen is not None:
        if isinstance(seen, AMQPError | AuthenticationError | ResponseError):
            return False
        outage = outage or isinstance(seen, OSError | TimeoutError)
        seen = seen.__cause__ or seen.__context__
    return outage


def broker_reason(error: BaseException) -> str:
    """Why a connection to the broker failed, in a few words: "authentication
    failed" for a refused login (RabbitMQ's ACCESS_REFUSED, Redis's), the
    operating system's reason ("connection refused"), else the broker's."""
    from amqp.exceptions import AccessRefused, AMQPError  # kombu's: see check_broker
    from redis.exceptions import AuthenticationError

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, AccessRefused | AuthenticationError):
            return "authentication failed (wrong user name or password)"
        if isinstance(seen, AMQPError) and seen.reply_text:
            return seen.reply_text  # "NOT_ALLOWED - vhost x not found"
        if isinstance(seen, OSError) and seen.strerror:
            return _lower_first(seen.strerror)
        seen = seen.__cause__ or seen.__context__
    text = str(error).strip().splitlines()
    return _lower_first(text[0]) if text else type(error).__name__


def _lower_first(text: str) -> str:
    """A reason as the end of a sentence: "Connection refused", "connection refused"."""
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def service_settings() -> Settings:
    """A service's settings as it starts: unknown ``TASKHOOK_`` names warned
    about, then the settings read; a bad value is one line and exit 1."""
    warn_about_unknown_variables()
    try:
        return read_settings()
    except CannotStart as problem:
        refuse(problem)


def service_ready(
    settings: Settings,
    *,
    database: bool = True,
    broker: bool = True,
    through_a_broker_outage: bool = False,
) -> None:
    """Connect once to what a service uses; an unreachable one is one line and exit 1.

    ``through_a_broker_outage`` (the web process): a broker that does not
    answer at all is a warning line, and the process starts -- the inbox is
    the queue of record, and what it stores meanwhile the sweeper sends. A
    broker that answers "no" (a wrong password) is still a mistake to refuse.
    """
    try:
        if database:
            check_database(settings)
            check_encryption(settings)
        if broker:
            try:
                check_broker(settings)
            except BrokerDown as problem:
                if not through_a_broker_outage:
                    raise
                _say(
                    f"warning: {problem}; starting anyway: deliveries are stored, "
                    "and the sweeper sends them once the broker is back",
                    logging.WARNING,
                )
    except CannotStart as problem:
        refuse(problem)


def refuse(problem: CannotStart) -> NoReturn:
    """Say ``problem`` in one line on stderr and end the process with exit code 1.

    The process's own stderr, even where Celery has put a logger in its place
    (beat does before it starts): one plain line, not a log record."""
    _say(str(problem), logging.CRITICAL)
    raise SystemExit(1)


def _say(line: str, level: int, *, to: TextIO | None = None) -> None:
    """``taskhook: <line>`` on the process's own stderr; with
    ``TASKHOOK_LOG_FORMAT=json``, the same as one JSON object (``models.logs``)."""
    text = logs.json_line("taskhook.startup", level, line) if logs.wants_json() else PREFIX + line
    print(text, file=to or sys.__stderr__ or sys.stderr, flush=True)
