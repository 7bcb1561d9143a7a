"""``taskhook db``: the database schema."""

from __future__ import annotations

import click
from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from worker.cli.output import echo, emit_json, json_option
from worker.cli.runtime import CommandRuntime, Refused, first_line, pass_runtime

#: PostgreSQL's SQLSTATEs for a lock_timeout and a statement_timeout.
_LOCK_NOT_AVAILABLE = "55P03"
_QUERY_CANCELED = "57014"


@click.group()
def db() -> None:
    """The database schema."""


@db.command("upgrade")
@json_option
@pass_runtime
def db_upgrade(runtime: CommandRuntime, as_json: bool) -> None:
    """Migrate the configured database to the newest schema (safe to repeat).

    Creates a SQLite database that does not exist yet: the one command that
    does (every other refuses, and creates nothing). A database a newer
    release migrated is left as it is: after a rollback this release runs on
    the newer schema (docs/deploy.md, "Upgrades").
    """
    # Imported here: Alembic is needed by this command alone.
    from alembic.script import ScriptDirectory

    from migrations import alembic_config, upgrade_to_head

    url = runtime.database_url_for_people
    # A connection outside any transaction: Alembic begins and commits its own,
    # so a revision may step out of it (migrations/timeouts.py, concurrently).
    with runtime.engine_creating_the_database().connect() as connection:
        try:
            revision = _current_revision(connection)
            ours = ScriptDirectory.from_config(alembic_config())
            known = {script.revision for script in ours.walk_revisions()}
            newer = revision is not None and revision not in known
            if not newer:
                # 0.1.0 crashed here on a revision it did not know, which made its
                # release step fail after a rollback: now it is said, and left.
                upgrade_to_head(connection)
                revision = _current_revision(connection)
        except OperationalError as error:
            raise _timed_out(error) or error from None
    if as_json:
        emit_json({"database": url, "revision": revision, "newer_than_this_release": newer})
    elif newer:
        echo(
            f"Database {url} is at revision {revision}, which this release does not know "
            f"(its newest is {ours.get_current_head()}): a newer release migrated it. "
            'Left as it is; this release runs on it (docs/deploy.md, "Upgrades").'
        )
    else:
        echo(f"Database {url} is at revision {revision}.")


def _current_revision(connection: Connection) -> str | None:
    """The database's revision, read in a transaction of its own that waits
    for a lock no longer than a migration would (migrations/timeouts.py)."""
    from alembic.runtime.migration import MigrationContext

    from migrations.timeouts import LOCK_TIMEOUT

    if connection.in_transaction():
        connection.commit()  # what the upgrade left open (SQLite's version row)
    with connection.begin():
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        return MigrationContext.configure(connection).get_current_revision()


def _timed_out(error: OperationalError) -> Refused | None:
    """A migration that gave up (migrations/timeouts.py) in one clear line;
    None for any other error."""
    from migrations.timeouts import LOCK_TIMEOUT, STATEMENT_TIMEOUT

    state = getattr(error.orig, "sqlstate", None)
    reason = first_line(error.orig)
    if state == _LOCK_NOT_AVAILABLE:
        return Refused(
            f"the migration waited {LOCK_TIMEOUT} for a lock another transaction holds "
            f"({reason}) and gave up rather than queue the ingress behind it; its transaction was "
            "rolled back: find the holder in pg_stat_activity, "
            "then run `taskhook db upgrade` again"
        )
    if state == _QUERY_CANCELED:
        return Refused(
            f"a migration statement ran past {STATEMENT_TIMEOUT} ({reason}) and was "
            "stopped and its transaction rolled back. A revision that "
            "needs longer says so itself (migrations/timeouts.py, longer_statements)"
        )
    return None
