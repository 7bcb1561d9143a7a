"""``taskhook db``, and what any command says about the database it is given:
migrated from nothing, one clear line when it is unreachable or not migrated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.cli import ROOT, as_json, refused, taskhook
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


def test_a_database_without_tables_says_to_upgrade(tmp_path: Path):
    line = refused(taskhook(f"sqlite:///{tmp_path / 'empty.db'}", "stats"))
    assert "taskhook db upgrade" in line


def test_an_unreachable_database_is_one_clear_line():
    url = "postgresql+psycopg://postgres:hunter2@127.0.0.1:1/taskhook"
    line = refused(taskhook(url, "workspace", "list"))
    assert line.startswith("Error: cannot use the database at postgresql+psycopg://postgres:***@")
    assert "hunter2" not in line


def test_importing_the_cli_builds_nothing():
    code = (
        "import sys, worker.cli; "
        "assert 'worker.celery_app' not in sys.modules; "
        "assert 'celery' not in sys.modules; "
        "assert 'alembic' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
