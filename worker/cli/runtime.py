"""The per-invocation runtime (settings, engine, sessions) and the CLI's errors.

Also the root group's class, which turns the models' domain errors and the
database's into the one-line refusals of exit code 1: the CLI's one
translation, through which every command's errors pass (no command maps a
domain error itself).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, StatementError
from sqlalchemy.orm import Session, sessionmaker

from models import sealing, startup
from models.db import NoDatabase, make_engine, make_session_factory, session_scope
from models.errors import TaskStoreError
from models.settings import Settings, for_people, invalid_settings
from worker.cli.output import printable

#: Exit code of a release whose request went out but got no answer.
EXIT_NO_ANSWER = 3


def load_celery_app() -> Any:
    """The Celery app, imported only by the commands that send a message.

    A module-level hook: tests replace it with a fake app to see what would
    be sent without a broker. The commands call it as
    ``worker.cli.runtime.load_celery_app``, looked up when they run, so the
    replacement is what they get. It lives here, below every command module,
    rather than in the package that imports them all: there it made each
    command that sends a message and the package import each other.
    """
    from worker.celery_app import app

    return app


# --- errors ---------------------------------------------------------------------------


class Refused(click.ClickException):
    """A user mistake or a refusal: one line on stderr, exit 1."""

    exit_code = 1


class NoAnswer(click.ClickException):
    exit_code = EXIT_NO_ANSWER


def redacted(url: str) -> str:
    """``url`` without its password, safe to print."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _database_refusal(error: DBAPIError, url: str) -> Refused:
    reason = first_line(error.orig if error.orig is not None else error)
    # SQLite says "no such table"; PostgreSQL's undefined_table is SQLSTATE 42P01.
    if "no such table" in reason or getattr(error.orig, "sqlstate", None) == "42P01":
        return Refused(
            f"the database at {url} has no taskhook tables yet: run `taskhook db upgrade`"
        )
    if isinstance(error, IntegrityError):  # a concurrent change won a unique constraint
        return Refused(f"the database refused the change: {reason}")
    # libpq's reason without its preamble: "connection refused", as the services say it.
    return Refused(f"cannot use the database at {url}: {startup.database_reason(error)}")


class TaskhookGroup(click.Group):
    """The root group: turns the models' domain errors into one-line refusals,
    and shows any control character in an error's message escaped."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return self._translated(ctx)
        except click.ClickException as error:
            # A name, a title or a provider's words may stand in the message:
            # shown escaped, so the error stays one line and the terminal untouched.
            error.message = printable(error.message)
            raise

    def _translated(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TaskStoreError as error:  # every kind alike: the store's words, exit 1
            raise Refused(str(error)) from None
        except sealing.SealingError as error:  # a credential it cannot open: no key, a removed key
            raise Refused(str(error)) from None
        except DBAPIError as error:
            runtime = ctx.find_object(CommandRuntime)
            url = runtime.database_url_for_people if runtime else "?"
            raise _database_refusal(error, url) from None
        except StatementError as error:  # not a DBAPIError: raised by our own code
            if isinstance(error.orig, sealing.SealingError):  # sealing a value to write
                raise Refused(str(error.orig)) from None
            raise


# --- per-invocation runtime: settings, engine, sessions -----------------------------


class CommandRuntime:
    """What a command needs, built on first use: nothing at import, nothing unused."""

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._engine: Engine | None = None
        self._sessions: sessionmaker[Session] | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            # Settings() rather than the process-wide cached get_settings(): each
            # invocation reads the environment as it is now.
            # As every process of taskhook starts (models.startup): a warning
            # per unknown TASKHOOK_ name, and a bad value in one line.
            startup.warn_about_unknown_variables()
            try:
                self._settings = Settings()
            except ValidationError as error:
                raise Refused(invalid_settings(error)) from None
        return self._settings

    @property
    def database_url_for_people(self) -> str:
        try:
            url = make_url(self.settings.database_url).render_as_string(hide_password=True)
            return for_people(url)  # and a password given as a parameter (several hosts)
        except ArgumentError:
            return "<invalid TASKHOOK_DATABASE_URL>"

    @property
    def engine(self) -> Engine:
        """The engine of the configured database, which must exist: no command
        but ``db upgrade`` (:meth:`engine_creating_the_database`) creates a
        SQLite file, so a mistyped path is one line and leaves no empty file."""
        return self._open_engine(create=False)

    def engine_creating_the_database(self) -> Engine:
        """The engine, creating a SQLite file (and its folder) not there yet."""
        return self._open_engine(create=True)

    def _open_engine(self, *, create: bool) -> Engine:
        if self._engine is None:
            try:
                self._engine = make_engine(
                    self.settings.database_url, settings=self.settings, create=create
                )
            except ArgumentError as error:
                raise Refused(f"invalid TASKHOOK_DATABASE_URL: {first_line(error)}") from None
            except NoDatabase as error:
                raise Refused(
                    f"no database at {error.path} (TASKHOOK_DATABASE_URL); "
                    "`taskhook db upgrade` creates it"
                ) from None
        return self._engine

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One unit of work: commits when the block ends, rolls back on error."""
        with session_scope(self.sessions) as session:
            yield session

    @property
    def sessions(self) -> sessionmaker[Session]:
        """The session factory, for a command that opens several units of work."""
        if self._sessions is None:
            self.install_keyring(required=False)
            self._sessions = make_session_factory(self.engine)
        return self._sessions

    def install_keyring(self, *, required: bool = True) -> sealing.Keyring | None:
        """The keyring the settings name, installed for this process. Not
        ``required``: none configured is left to the first credential read,
        so a command that touches no credential needs no key."""
        try:
            return sealing.install(sealing.keyring_of(self.settings))
        except sealing.NoEncryptionKey as problem:
            if required:
                raise Refused(str(problem)) from None
            return None
        except sealing.SealingError as problem:
            raise Refused(str(problem)) from None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


pass_runtime = click.make_pass_decorator(CommandRuntime)
