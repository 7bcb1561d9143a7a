"""Migrations for the tests: a throwaway PostgreSQL database, revisions a test
writes into a folder of its own (on top of the project's head), and the
upgrade run as its own process, as a release job runs it.

``python -m tests.support.migrations URL [FOLDER]`` upgrades the database at
URL to the head of the project's revisions and FOLDER's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from migrations import alembic_config
from tests.support.stores import POSTGRES_ADMIN_URL, libpq

ROOT = Path(__file__).resolve().parents[2]
#: The application_name of the migration process's sessions.
MIGRATION_APP = "taskhook-migration"
VERSIONS = ROOT / "migrations" / "versions"

#: A realistic "expand" step on the inbox: a nullable column (a moment's
#: lock) and an index built CONCURRENTLY (reads the whole table while the
#: ingress keeps writing). The concurrent step commits what came before it,
#: so each statement can run again after a failure (IF NOT EXISTS).
EXPAND_THE_INBOX = """
    op.add_column(
        "deliveries", sa.Column("probe_note", sa.Text(), nullable=True), if_not_exists=True
    )
    concurrently(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_deliveries_source_received "
        "ON deliveries (source_id, received_at)",
        timeout="30min",
    )
"""

_REVISION = '''"""{message}"""

import sqlalchemy as sa
from alembic import op

from migrations.timeouts import concurrently, longer_statements

revision = {revision!r}
down_revision = {down!r}
branch_labels = None
depends_on = None
{declarations}

def upgrade() -> None:
{upgrade}


def downgrade() -> None:
    pass
'''


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def write_revision(
    folder: Path, upgrade: str, *, revision: str = "9001", declarations: str = ""
) -> str:
    """A revision on top of the project's head, in ``folder``; its id.
    ``declarations`` go at the module's top level."""
    folder.mkdir(parents=True, exist_ok=True)
    body = textwrap.indent(textwrap.dedent(upgrade).strip(), "    ")
    text = _REVISION.format(
        message=f"test revision {revision}",
        revision=revision,
        down=head_revision(),
        declarations=textwrap.dedent(declarations),
        upgrade=body,
    )
    (folder / f"{revision}_test.py").write_text(text)
    return revision


def config_with(folder: Path | None, connection=None) -> Config:
    """The project's Alembic config, with ``folder``'s revisions too."""
    config = alembic_config(connection)
    if folder is not None:
        config.set_main_option("path_separator", "os")
        config.set_main_option("version_locations", os.pathsep.join([str(VERSIONS), str(folder)]))
    return config


@contextmanager
def throwaway_postgres(prefix: str = "taskhook_migrate") -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(libpq(POSTGRES_ADMIN_URL), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(libpq(POSTGRES_ADMIN_URL), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def upgrade_process(url: str, folder: Path | None) -> subprocess.Popen:
    """``alembic upgrade heads`` in a process of its own, on its own connection."""
    args = [sys.executable, "-m", "tests.support.migrations", url]
    if folder is not None:
        args.append(str(folder))
    return subprocess.Popen(
        args,
        cwd=ROOT,
        # Named in pg_stat_activity, so a test tells its sessions from the ingress's.
        env=os.environ | {"PGAPPNAME": MIGRATION_APP},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def main(argv: list[str]) -> None:
    url, *folder = argv
    # env.py opens its own engine from the settings.
    os.environ["TASKHOOK_DATABASE_URL"] = url
    command.upgrade(config_with(Path(folder[0]) if folder else None), "heads")


if __name__ == "__main__":
    main(sys.argv[1:])
