"""How long a migration may wait for a lock, and run one statement, on PostgreSQL.

A migration's ALTER TABLE queues for its lock behind whatever transaction
holds the table, and every ingress INSERT then queues behind the ALTER: one
long transaction turns a moment's DDL into a stalled ingress. With a
``lock_timeout`` the migration gives up instead (and the release step fails
loudly, to be retried); with a ``statement_timeout`` nothing it runs holds
its lock for long. 4 s and 5 s as Warehouse (PyPI) uses them.

Both are ``SET LOCAL``: they last for the migration's transaction only, so
they also hold behind PgBouncer in transaction mode and never leak into the
pool. SQLite has neither (its writers wait ``busy_timeout``): nothing here
runs there.

A revision that needs longer -- a backfill, an index built on a big table --
says so in its own file with :func:`longer_statements` or
:func:`concurrently`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from alembic import op

#: Longest wait for a lock before the migration gives up: past it the
#: ingress's INSERTs would be queued behind the migration's own request.
LOCK_TIMEOUT = "4s"
#: Longest a migration statement may run while it holds its locks.
STATEMENT_TIMEOUT = "5s"


def timeout_statements(
    *, lock: str = LOCK_TIMEOUT, statement: str = STATEMENT_TIMEOUT, scope: str = "LOCAL"
) -> list[str]:
    """The SET statements for these timeouts (``scope`` LOCAL or SESSION)."""
    return [
        f"SET {scope} lock_timeout = '{lock}'",
        f"SET {scope} statement_timeout = '{statement}'",
    ]


def _on_postgresql() -> bool:
    return op.get_context().dialect.name == "postgresql"


@contextmanager
def longer_statements(timeout: str) -> Iterator[None]:
    """Let the statements of this block run up to ``timeout`` each (a
    PostgreSQL interval: '15min'); the lock timeout stays. Back to
    :data:`STATEMENT_TIMEOUT` after the block, for the revisions that follow
    in the same transaction."""
    if not _on_postgresql():
        yield
        return
    op.execute(f"SET LOCAL statement_timeout = '{timeout}'")
    yield
    op.execute(f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'")


def concurrently(statement: str, *, timeout: str) -> None:
    """Run ``CREATE/DROP INDEX CONCURRENTLY ...``: the ingress keeps writing
    while it builds. It cannot run inside a transaction, so the migration's
    transaction so far is committed first (Alembic's autocommit block), the
    statement runs under session-level timeouts (``timeout`` for itself,
    :data:`LOCK_TIMEOUT` for its lock), which are reset after it, and the
    timeouts are set again on the transaction that follows.

    Needs a connection of its own (``taskhook db upgrade`` gives one), and a
    direct one rather than through PgBouncer in transaction mode, where
    consecutive statements outside a transaction may reach different servers.
    On SQLite the statement runs as it is, without CONCURRENTLY.
    """
    if not _on_postgresql():
        op.execute(statement.replace(" CONCURRENTLY", ""))
        return
    context = op.get_context()
    # Alembic's own flag: the caller began the transaction, so Alembic cannot
    # commit it (its autocommit block would fail on an assert).
    if getattr(context, "_in_external_transaction", False):
        raise RuntimeError(
            "a revision with a CONCURRENTLY step needs a connection outside any "
            "transaction (taskhook db upgrade hands one): upgrade with "
            "engine.connect(), not engine.begin()"
        )
    with context.autocommit_block():
        for setting in timeout_statements(statement=timeout, scope="SESSION"):
            op.execute(setting)
        try:
            op.execute(statement)
        finally:
            op.execute("RESET statement_timeout")
            op.execute("RESET lock_timeout")
    for setting in timeout_statements():
        op.execute(setting)
