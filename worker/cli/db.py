"""``taskhook db``: the database schema."""

from __future__ import annotations

import click

from worker.cli.output import echo, emit_json, json_option
from worker.cli.runtime import CommandRuntime, pass_runtime


@click.group()
def db() -> None:
    """The database schema."""


@db.command("upgrade")
@json_option
@pass_runtime
def db_upgrade(runtime: CommandRuntime, as_json: bool) -> None:
    """Migrate the configured database to the newest schema (safe to repeat).

    Creates a SQLite database that does not exist yet: the one command that
    does (every other refuses, and creates nothing).
    """
    # Imported here: Alembic is needed by this command alone.
    from alembic.runtime.migration import MigrationContext

    from migrations import upgrade_to_head

    with runtime.engine_creating_the_database().begin() as connection:
        upgrade_to_head(connection)
        revision = MigrationContext.configure(connection).get_current_revision()
    url = runtime.database_url_for_people
    if as_json:
        emit_json({"database": url, "revision": revision})
    else:
        echo(f"Database {url} is at revision {revision}.")
