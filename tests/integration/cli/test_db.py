"""``taskhook db``, and what any command says about the database it is given:
migrated from nothing, one clear line when it is unreachable, not migrated or
not there -- and only ``db upgrade`` creates a SQLite file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.support.cli import BIN, ROOT, as_json, refused, taskhook
from tests.support.stores import Store


def test_db_upgrade_migrates_a_fresh_sqlite_file_and_is_safe_to_repeat(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'var' / 'fresh.db'}"

    first = taskhook(url, "db", "upgrade")
    again = as_json(taskhook(url, "db", "upgrade", "--json"))

    assert first.exit_code == 0
    assert "is at revision" in first.stdout
    assert again["revision"]
    assert (
        taskhook(url, "workspace", "add", "acme", "--name", "Acme", "--prefix", "ACME").exit_code
        == 0
    )


def test_db_upgrade_of_a_migrated_store_changes_nothing(store: Store):
    store.workspace()
    assert taskhook(store, "db", "upgrade").exit_code == 0
    assert store.scalar("SELECT count(*) FROM workspaces") == 1


def test_db_upgrade_leaves_a_database_a_newer_release_migrated(store: Store):
    """After a rollback the release step of the older release runs on the
    newer schema: it says so and succeeds, and changes nothing (0.1.0's
    crashed with alembic's traceback, and its release step failed)."""
    head = store.scalar("SELECT version_num FROM alembic_version")
    with store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    try:
        done = taskhook(store, "db", "upgrade")
        answer = as_json(taskhook(store, "db", "upgrade", "--json"))
        after = store.scalar("SELECT version_num FROM alembic_version")
    finally:
        with store.engine.begin() as connection:
            connection.execute(
                text("UPDATE alembic_version SET version_num = :head"), {"head": head}
            )

    assert done.exit_code == 0, done.output
    assert f"is at revision 9999, which this release does not know (its newest is {head})" in (
        done.stdout
    )
    assert "Traceback" not in done.output
    assert (answer["revision"], answer["newer_than_this_release"]) == ("9999", True)
    assert after == "9999"


def test_a_database_without_tables_says_to_upgrade(tmp_path: Path):
    (tmp_path / "empty.db").touch()
    line = refused(taskhook(f"sqlite:///{tmp_path / 'empty.db'}", "stats"))
    assert line == (
        f"Error: the database at sqlite:///{tmp_path / 'empty.db'} has no taskhook tables yet: "
        "run `taskhook db upgrade`"
    )


#: Commands that read, and a few that write: none of them creates a database.
COMMANDS = [
    ("stats",),
    ("explain", "--workspace", "acme", "jira:PROJ-1"),
    ("task", "lookup", "--workspace", "acme", "jira:PROJ-1"),
    ("deliveries", "list"),
    ("deliveries", "show", "1"),
    ("identities", "list", "--workspace", "acme"),
    ("identities", "merges"),
    ("workspace", "list"),
    ("source", "list"),
    ("operations", "list"),
    ("token", "list"),
    ("workspace", "add", "acme", "--name", "Acme", "--prefix", "ACME"),
    ("source", "disable", "acme-github"),
    ("demo", "setup"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_no_command_but_db_upgrade_creates_a_sqlite_database(
    tmp_path: Path, command: tuple[str, ...]
):
    mistyped = tmp_path / "vra" / "taskhook.db"

    line = refused(taskhook(f"sqlite:///{mistyped}", *command))

    assert line == (
        f"Error: no database at {mistyped} (TASKHOOK_DATABASE_URL); "
        "`taskhook db upgrade` creates it"
    )
    assert list(tmp_path.iterdir()) == []  # neither the file nor its folder


def test_a_read_command_as_a_process_creates_no_database(tmp_path: Path):
    """As an operator runs it, with the default database under the working folder."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("TASKHOOK_")}
    done = subprocess.run(
        [str(BIN / "taskhook"), "deliveries", "list"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "Error: no database at ./var/taskhook.db (TASKHOOK_DATABASE_URL); "
        "`taskhook db upgrade` creates it"
    ]
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_database_is_one_clear_line():
    url = "postgresql+psycopg://postgres:hunter2@127.0.0.1:1/taskhook"
    line = refused(taskhook(url, "workspace", "list"))
    assert line == (
        "Error: cannot use the database at postgresql+psycopg://postgres:***@127.0.0.1:1/taskhook: "
        "connection refused"
    )
    assert "hunter2" not in line


def test_importing_the_cli_builds_nothing():
    code = (
        "import sys, worker.cli; "
        "assert 'worker.celery_app' not in sys.modules; "
        "assert 'celery' not in sys.modules; "
        "assert 'kombu' not in sys.modules; "
        "assert 'alembic' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
