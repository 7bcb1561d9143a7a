"""Alembic is the only way the schema changes: upgrading an empty database to
head gives exactly the models' schema, and downgrading to base undoes it, on
both databases."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import make_url

from migrations import alembic_config, upgrade_to_head
from migrations.timeouts import LOCK_TIMEOUT, STATEMENT_TIMEOUT
from models.db import make_engine
from models.tables import EXTERNAL_ID_INDEX, Base
from tests.support.cli import refused, taskhook
from tests.support.migrations import (
    config_with,
    head_revision,
    throwaway_postgres,
    upgrade_process,
    write_revision,
)
from tests.support.stores import POSTGRES_ADMIN_URL, Store, libpq


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_engine(request: pytest.FixtureRequest, tmp_path) -> Iterator[Engine]:
    """An engine on a database with nothing in it."""
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
        yield engine
        engine.dispose()
        return
    name = f"taskhook_migrate_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(libpq(POSTGRES_ADMIN_URL), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    # make_engine takes the URL as text (models/postgres_hosts.py reads its hosts).
    url = make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    yield engine
    engine.dispose()
    with psycopg.connect(libpq(POSTGRES_ADMIN_URL), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def schema_diff(engine: Engine) -> list:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return compare_metadata(context, Base.metadata)


def tables_of(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def test_upgrade_from_empty_matches_the_models_exactly(empty_engine: Engine):
    with empty_engine.begin() as connection:
        upgrade_to_head(connection)

    assert schema_diff(empty_engine) == []
    assert tables_of(empty_engine) == set(Base.metadata.tables) | {"alembic_version"}


def test_the_identity_index_is_partial_unique_and_named(empty_engine: Engine):
    with empty_engine.begin() as connection:
        upgrade_to_head(connection)

    (index,) = [
        ix for ix in inspect(empty_engine).get_indexes("tasks") if ix["name"] == EXTERNAL_ID_INDEX
    ]
    assert index["unique"]
    assert index["column_names"] == ["workspace_id", "external_id"]
    where = index["dialect_options"].get(f"{empty_engine.dialect.name}_where")
    assert "external_id IS NOT NULL" in str(where)


def test_downgrade_to_base_removes_everything_and_upgrade_works_again(empty_engine: Engine):
    with empty_engine.begin() as connection:
        upgrade_to_head(connection)
    with empty_engine.begin() as connection:
        command.downgrade(alembic_config(connection), "base")

    assert tables_of(empty_engine) <= {"alembic_version"}

    with empty_engine.begin() as connection:
        upgrade_to_head(connection)
    assert schema_diff(empty_engine) == []


@pytest.mark.postgres
def test_postgres_external_id_columns_use_the_c_collation(postgres_store: Store):
    with postgres_store.engine.connect() as connection:
        collations = dict(
            connection.execute(
                text(
                    "SELECT table_name || '.' || column_name, collation_name "
                    "FROM information_schema.columns "
                    "WHERE table_schema = 'public' AND column_name = 'external_id'"
                )
            ).all()
        )
    assert collations == {
        "tasks.external_id": "C",
        "identity_releases.external_id": "C",
        "task_deletions.external_id": "C",
        "task_events.external_id": "C",
        "deliveries.external_id": "C",
    }


@pytest.mark.postgres
def test_postgres_inbox_bodies_are_compressed_with_lz4(postgres_store: Store):
    # This machine's PostgreSQL has lz4 (Debian builds it in); the migration
    # skips the setting only on a server without it.
    with postgres_store.engine.connect() as connection:
        compression = connection.execute(
            text(
                "SELECT attcompression FROM pg_attribute "
                "WHERE attrelid = 'deliveries'::regclass AND attname = 'body'"
            )
        ).scalar()
    assert compression == "l"


@pytest.mark.postgres
def test_postgres_lookup_by_identity_can_use_the_partial_index(postgres_store: Store):
    with postgres_store.engine.connect() as connection:
        connection.execute(text("SET LOCAL enable_seqscan = off"))
        # On a table without statistics the planner may as well walk the
        # (workspace, identifier) index and filter: that one is out of the
        # way for this question, and the transaction is rolled back.
        connection.execute(
            text("ALTER TABLE tasks DROP CONSTRAINT uniq_tasks_workspace_id_identifier")
        )
        plan = "\n".join(
            connection.execute(
                text("EXPLAIN SELECT id FROM tasks WHERE workspace_id = :w AND external_id = :e"),
                {"w": 1, "e": "jira:PROJ-1"},
            ).scalars()
        )
        connection.rollback()
    assert EXTERNAL_ID_INDEX in plan


def test_sqlite_never_reuses_a_task_id(store: Store):
    if store.dialect != "sqlite":
        assert store.scalar("SELECT pg_get_serial_sequence('tasks', 'id')") is not None
        return
    sql = store.scalar("SELECT sql FROM sqlite_master WHERE name = 'tasks'")
    assert "AUTOINCREMENT" in sql


def test_0010_gives_rows_stored_before_it_a_budget_with_nothing_spent(empty_engine: Engine):
    with empty_engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0009")
        connection.execute(
            text(
                "INSERT INTO workspaces (id, slug, name, task_prefix, created_at) "
                "VALUES (1, 'acme', 'Acme', 'ACME', CURRENT_TIMESTAMP)"
            )
        )
        connection.execute(
            text(
                "INSERT INTO webhook_sources (id, slug, provider, workspace_id, create_events, "
                "created_at) VALUES (1, 'acme-github', 'github', 1, '[]', CURRENT_TIMESTAMP)"
            )
        )
        connection.execute(
            text(
                "INSERT INTO deliveries (source_id, delivery_id, body, body_sha256, event, "
                "headers, received_at, updated_at, status, attempts) VALUES (1, 'd-1', :body, "
                "'0', 'issues.opened', '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, "
                "'processing', 7)"
            ),
            {"body": b"{}"},
        )
    with empty_engine.begin() as connection:
        upgrade_to_head(connection)

    with empty_engine.connect() as connection:
        assert connection.execute(text("SELECT attempts, retries FROM deliveries")).one() == (7, 0)

    with empty_engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0009")
    columns = {column["name"] for column in inspect(empty_engine).get_columns("deliveries")}
    assert "retries" not in columns and "attempts" in columns


def test_0018_backfills_the_ledger_from_the_tasks_and_their_events(empty_engine: Engine):
    statements = [
        "INSERT INTO workspaces (id, slug, name, task_prefix, created_at) "
        "VALUES (1, 'acme', 'Acme', 'ACME', CURRENT_TIMESTAMP)",
        "INSERT INTO workflow_steps (id, workspace_id, name, position) VALUES (1, 1, 'Inbox', 0)",
        "INSERT INTO webhook_sources (id, slug, provider, workspace_id, create_events, "
        "created_at) VALUES (1, 'acme-github', 'github', 1, '[]', CURRENT_TIMESTAMP)",
        "INSERT INTO deliveries (id, source_id, delivery_id, body, body_sha256, event, headers, "
        "received_at, updated_at, status, attempts) VALUES (1, 1, 'd-1', '', 'abc', "
        "'issues.opened', '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 'done', 1)",
        # held, created by delivery 1; archived; released (the task stays, without its id)
        "INSERT INTO tasks (id, workspace_id, identifier, title, step_id, created_at, "
        "updated_at, external_id, external_id_settled_at, created_by_delivery) VALUES "
        "(1, 1, 'ACME-1', 'held', 1, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 'gh-issue/a/b#1', "
        "CURRENT_TIMESTAMP, 1)",
        "INSERT INTO tasks (id, workspace_id, identifier, title, step_id, created_at, "
        "updated_at, archived_at, external_id, external_id_settled_at) VALUES "
        "(2, 1, 'ACME-2', 'archived', 1, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, "
        "CURRENT_TIMESTAMP, 'gh-issue/a/b#2', CURRENT_TIMESTAMP)",
        "INSERT INTO tasks (id, workspace_id, identifier, title, step_id, created_at, "
        "updated_at) VALUES (4, 1, 'ACME-4', 'released', 1, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
        "INSERT INTO event_streams (workspace_id, last_position) VALUES (1, 3)",
        # #3 was deleted; #4 released; #1 deleted once, then created again (held wins)
        "INSERT INTO task_events (workspace_id, position, type, task_id, external_id, "
        "occurred_at) VALUES (1, 1, 'task.deleted', 3, 'gh-issue/a/b#3', CURRENT_TIMESTAMP)",
        "INSERT INTO task_events (workspace_id, position, type, task_id, external_id, "
        "occurred_at) VALUES (1, 2, 'task.identity_released', 4, 'gh-issue/a/b#4', "
        "CURRENT_TIMESTAMP)",
        "INSERT INTO task_events (workspace_id, position, type, task_id, external_id, "
        "occurred_at) VALUES (1, 3, 'task.deleted', 9, 'gh-issue/a/b#1', CURRENT_TIMESTAMP)",
    ]
    with empty_engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0017")
        for statement in statements:
            connection.execute(text(statement))
    with empty_engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0018")

    with empty_engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT name, task_id, state, delivery_id, body_sha256 FROM identities "
                "WHERE kind = 'external' ORDER BY name"
            )
        ).all()
    assert [tuple(row) for row in rows] == [
        ("gh-issue/a/b#1", 1, "held", "d-1", "abc"),
        ("gh-issue/a/b#2", 2, "archived", None, None),
        ("gh-issue/a/b#3", 3, "deleted", None, None),
        ("gh-issue/a/b#4", 4, "released", None, None),
    ]


def test_0019_moves_live_own_names_onto_the_tasks_and_keeps_their_creators(
    empty_engine: Engine,
):
    """Revision 0018 kept every name in ``identities``; from 0019 a live
    task's own names are on its row, and the ledger keeps the rest."""
    ledger = (
        "INSERT INTO identities (workspace_id, kind, name, task_id, state, is_alias, "
        "source_id, delivery_id, body_sha256, created_at, changed_at) VALUES "
    )
    statements = [
        "INSERT INTO workspaces (id, slug, name, task_prefix, created_at) "
        "VALUES (1, 'acme', 'Acme', 'ACME', CURRENT_TIMESTAMP)",
        "INSERT INTO workflow_steps (id, workspace_id, name, position) VALUES (1, 1, 'Inbox', 0)",
        "INSERT INTO webhook_sources (id, slug, provider, workspace_id, create_events, "
        "created_at) VALUES (1, 'acme-github', 'github', 1, '[]', CURRENT_TIMESTAMP)",
        "INSERT INTO tasks (id, workspace_id, identifier, title, step_id, created_at, "
        "updated_at, external_id, external_id_settled_at, created_by_delivery) VALUES "
        "(1, 1, 'ACME-1', 'held', 1, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 'gh-issue/a/b#1', "
        "CURRENT_TIMESTAMP, 7)",
        # Task 1's own names (its creator's inbox row pruned), an alias a move
        # gave it, and a name a deleted task 3 had.
        ledger + "(1, 'external', 'gh-issue/a/b#1', 1, 'held', false, 1, 'd-1', 'abc', "
        "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
        ledger + "(1, 'stable', 'github:node-1', 1, 'held', false, 1, 'd-1', 'abc', "
        "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
        ledger + "(1, 'external', 'gh-issue/a/old#1', 1, 'held', true, NULL, NULL, NULL, "
        "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
        ledger + "(1, 'external', 'gh-issue/a/b#3', 3, 'deleted', false, 1, 'd-3', 'def', "
        "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
    ]
    with empty_engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0018")
        for statement in statements:
            connection.execute(text(statement))
    with empty_engine.begin() as connection:
        upgrade_to_head(connection)

    def ledger_rows(connection) -> list[tuple]:
        rows = connection.execute(
            text("SELECT kind, name, task_id, state, is_alias FROM identities ORDER BY name")
        ).all()
        return [
            (kind, name, task_id, state, bool(alias)) for kind, name, task_id, state, alias in rows
        ]

    with empty_engine.connect() as connection:
        assert ledger_rows(connection) == [
            ("external", "gh-issue/a/b#3", 3, "deleted", False),
            ("external", "gh-issue/a/old#1", 1, "held", True),
        ]
        assert connection.execute(text("SELECT stable_key FROM tasks")).scalar() == "github:node-1"
        kept = connection.execute(
            text("SELECT delivery_id, name, body_sha256, created FROM identity_deliveries")
        ).all()
        assert [(d, n, b, bool(c)) for d, n, b, c in kept] == [
            ("d-1", "gh-issue/a/b#1", "abc", True)
        ]

    with empty_engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0018")
    with empty_engine.connect() as connection:
        assert ledger_rows(connection) == [
            ("external", "gh-issue/a/b#1", 1, "held", False),
            ("external", "gh-issue/a/b#3", 3, "deleted", False),
            ("external", "gh-issue/a/old#1", 1, "held", True),
            ("stable", "github:node-1", 1, "held", False),
        ]


def test_0023_lets_members_of_existing_workspaces_delete_as_before(empty_engine: Engine):
    with empty_engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0022")
        connection.execute(
            text(
                "INSERT INTO workspaces (id, slug, name, task_prefix, created_at) "
                "VALUES (1, 'acme', 'Acme', 'ACME', CURRENT_TIMESTAMP)"
            )
        )
    with empty_engine.begin() as connection:
        upgrade_to_head(connection)

    with empty_engine.connect() as connection:
        reserved = connection.execute(text("SELECT deletes_need_operator FROM workspaces")).one()
    assert bool(reserved[0]) is False
    assert "task_deletions" in tables_of(empty_engine)

    with empty_engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0022")
    columns = {column["name"] for column in inspect(empty_engine).get_columns("workspaces")}
    assert "deletes_need_operator" not in columns
    assert "task_deletions" not in tables_of(empty_engine)


# --- PostgreSQL: a migration gives up on a lock instead of stalling the ingress ---

_RECORD_TIMEOUTS = """
    op.execute(
        "CREATE TABLE seen_timeouts (step int, lock_timeout text, statement_timeout text)"
    )
    def record(step):
        op.execute(
            "INSERT INTO seen_timeouts SELECT %d, current_setting('lock_timeout'), "
            "current_setting('statement_timeout')" % step
        )
    record(1)
    with longer_statements("2min"):
        record(2)
    record(3)
    concurrently("CREATE INDEX CONCURRENTLY ix_seen_step ON seen_timeouts (step)", timeout="1min")
    record(4)
"""


@pytest.mark.postgres
def test_postgres_migrations_run_under_the_lock_and_statement_timeouts(tmp_path):
    write_revision(tmp_path, _RECORD_TIMEOUTS)
    with throwaway_postgres() as url:
        engine = make_engine(url)
        try:
            with engine.connect() as connection:  # as `taskhook db upgrade` hands it
                command.upgrade(config_with(tmp_path, connection), "heads")
                connection.commit()
            with engine.connect() as connection:
                seen = connection.execute(text("SELECT * FROM seen_timeouts ORDER BY step")).all()
                after = connection.execute(text("SHOW statement_timeout")).scalar()
        finally:
            engine.dispose()
    assert [tuple(row) for row in seen] == [
        (1, LOCK_TIMEOUT, STATEMENT_TIMEOUT),
        (2, LOCK_TIMEOUT, "2min"),
        (3, LOCK_TIMEOUT, STATEMENT_TIMEOUT),
        (4, LOCK_TIMEOUT, STATEMENT_TIMEOUT),
    ]
    assert after == "0"  # nothing left on the session for the pool


@pytest.mark.postgres
def test_postgres_a_migration_blocked_by_a_lock_gives_up_and_frees_the_ingress(tmp_path):
    """A long transaction reads the inbox; the migration's ALTER queues for its
    lock, and an ingress INSERT behind it. Without a lock timeout both wait
    for the reader; with it the migration fails after LOCK_TIMEOUT and the
    INSERT goes through while the reader still holds its lock."""
    write_revision(tmp_path, 'op.add_column("deliveries", sa.Column("probe", sa.Text()))')
    limit = float(LOCK_TIMEOUT.removesuffix("s"))
    with throwaway_postgres() as url:
        engine = make_engine(url)
        try:
            with engine.begin() as connection:
                upgrade_to_head(connection)
                connection.execute(text(_A_SOURCE))
            with engine.connect() as reader:
                reader.execute(text("SELECT count(*) FROM deliveries"))  # holds ACCESS SHARE
                upgrade = upgrade_process(url, tmp_path)
                _wait_for_lock_wait(engine)
                started = time.monotonic()
                with engine.begin() as ingress:
                    ingress.execute(text(_AN_INBOX_ROW))
                inserted_after = time.monotonic() - started
                output, _ = upgrade.communicate(timeout=30)
                still_reading = reader.in_transaction()
                reader.rollback()
            with engine.connect() as connection:
                version = connection.execute(
                    text("SELECT version_num FROM alembic_version")
                ).scalar()
        finally:
            engine.dispose()
    assert upgrade.returncode != 0
    assert "canceling statement due to lock timeout" in output
    assert still_reading
    assert inserted_after < limit + 2, inserted_after
    assert version == head_revision()  # the failed revision left nothing behind


@pytest.mark.postgres
def test_db_upgrade_says_in_one_line_that_it_gave_up_on_a_lock(postgres_store: Store):
    """Another release job migrating at the same moment holds the version
    table: this one gives up after LOCK_TIMEOUT, with a line that says what to do."""
    started = time.monotonic()
    with postgres_store.engine.connect() as other_release:
        other_release.execute(text("LOCK TABLE alembic_version IN ACCESS EXCLUSIVE MODE"))
        started = time.monotonic()
        result = taskhook(postgres_store, "db", "upgrade")
        other_release.rollback()
    elapsed = time.monotonic() - started
    line = refused(result)
    assert f"the migration waited {LOCK_TIMEOUT} for a lock" in line
    assert "pg_stat_activity" in line
    assert elapsed < float(LOCK_TIMEOUT.removesuffix("s")) + 3, elapsed


_A_SOURCE = (
    "INSERT INTO workspaces (id, slug, name, task_prefix, created_at) "
    "VALUES (1, 'acme', 'Acme', 'ACME', CURRENT_TIMESTAMP); "
    "INSERT INTO webhook_sources (id, slug, provider, workspace_id, create_events, created_at) "
    "VALUES (1, 'acme-github', 'github', 1, '[]', CURRENT_TIMESTAMP)"
)
_AN_INBOX_ROW = (
    "INSERT INTO deliveries (source_id, delivery_id, body, body_sha256, event, headers, "
    "received_at, updated_at, status) VALUES (1, 'd-1', '\\x7b7d', 'abc', 'issues.opened', "
    "'{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 'queued')"
)


def _wait_for_lock_wait(engine: Engine) -> None:
    """Until some session waits for a lock (the migration's ALTER)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with engine.connect() as connection:
            waiting = connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar()
        if waiting:
            return
        time.sleep(0.05)
    raise AssertionError("the migration never queued for its lock")


_BOTH_HELPERS = """
    with longer_statements("2min"):
        op.add_column("deliveries", sa.Column("probe", sa.Text()))
    concurrently(
        "CREATE INDEX CONCURRENTLY ix_deliveries_probe ON deliveries (probe)", timeout="1min"
    )
"""


def test_the_timeout_helpers_run_their_statements_on_both_databases(empty_engine, tmp_path):
    """SQLite has no timeouts and no CONCURRENTLY: the statements run as they are."""
    write_revision(tmp_path, _BOTH_HELPERS)
    with empty_engine.connect() as connection:
        command.upgrade(config_with(tmp_path, connection), "heads")
        connection.commit()
    indexes = {ix["name"] for ix in inspect(empty_engine).get_indexes("deliveries")}
    assert "ix_deliveries_probe" in indexes


@pytest.mark.postgres
def test_a_concurrent_step_in_a_transaction_the_caller_owns_says_why_it_cannot(tmp_path):
    write_revision(tmp_path, _BOTH_HELPERS)
    with throwaway_postgres() as url:
        engine = make_engine(url)
        try:
            with (
                pytest.raises(RuntimeError, match="outside any transaction"),
                engine.begin() as connection,
            ):
                command.upgrade(config_with(tmp_path, connection), "heads")
        finally:
            engine.dispose()
