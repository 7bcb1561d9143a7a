"""What a plain delivery costs the database in round trips, counted on the
wire: libpq's protocol trace of the worker's connection, one ``Sync`` (or
simple ``Query``) per round trip. On the fast path a delivery is its two
statements, each its own transaction in autocommit: no BEGIN, no COMMIT, no
ping, no read of the body (docs/architecture.md, "The fast path").
"""

from __future__ import annotations

from pathlib import Path

from psycopg import pq
from sqlalchemy import event

from models.db import make_engine, make_session_factory
from tests.support.feeds import make_feed, store_github_issue
from tests.support.runs import SETTINGS
from tests.support.stores import Store
from worker import runtime, tasks

#: psycopg prepares a statement on its fifth execution (one extra round trip,
#: once per connection): the deliveries counted come after it.
WARM_UP = 6
COUNTED = 10


def _round_trips(trace: Path) -> int:
    """Frontend messages that wait for the server: extended-protocol Syncs and
    simple Queries."""
    lines = trace.read_text(errors="replace").splitlines()
    return sum(
        1
        for line in lines
        if line.startswith("F\t") and line.split("\t")[2].split()[0] in ("Sync", "Query")
    )


def test_a_plain_delivery_on_the_fast_path_is_two_round_trips(
    fast_path_store: Store, tmp_path: Path
) -> None:
    store = fast_path_store
    feed = make_feed(store.sessions)
    pks = [
        store_github_issue(store.sessions, feed, number)
        for number in range(1, WARM_UP + COUNTED + 1)
    ]
    trace = tmp_path / "libpq.trace"
    engine = make_engine(store.url, pool_size=1, max_overflow=0, pool_pre_ping=False)
    sessions = make_session_factory(engine)
    traced = trace.open("wb")

    @event.listens_for(engine, "connect")
    def _trace(dbapi_connection, _record):
        dbapi_connection.pgconn.trace(traced.fileno())
        dbapi_connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

    # What both delivery tasks run for a key, unit of work included: it opens
    # no transaction of its own (worker.tasks).
    runtime.use(sessions=sessions, settings=store.worker_settings(SETTINGS))

    def deliver(pk: int) -> str | None:
        processed = tasks._process(pk, retries=0)
        assert processed.outcome == "created", processed
        return processed.path

    try:
        for pk in pks[:WARM_UP]:
            deliver(pk)
        traced.flush()
        before = _round_trips(trace)
        paths = {deliver(pk) for pk in pks[WARM_UP:]}
        traced.flush()
        after = _round_trips(trace)
    finally:
        runtime.reset()
        engine.dispose()
        traced.close()
    assert paths == {"fast"}
    assert before > 0
    assert after - before == 2 * COUNTED
