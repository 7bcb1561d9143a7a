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
    does (every other refuses, and creates nothing). A database a newer
    release migrated is left as it is: after a rollback this release runs on
    the newer schema (docs/deploy.md, "Upgrades").
    """
    # Imported here: Alembic is needed by this command alone.
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from migrations import alembic_config, upgrade_to_head

    url = runtime.database_url_for_people
    with runtime.engine_creating_the_database().begin() as connection:
        revision = MigrationContext.configure(connection).get_current_revision()
        ours = ScriptDirectory.from_config(alembic_config())
        known = {script.revision for script in ours.walk_revisions()}
        newer = revision is not None and revision not in known
        if not newer:
            # 0.1.0 crashed here on a revision it did not know, which made its
            # release step fail after a rollback: now it is said, and left.
            upgrade_to_head(connection)
            revision = MigrationContext.configure(connection).get_current_revision()
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
