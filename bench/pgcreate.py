"""PostgreSQL's own floor for a create: pgbench running the bare create
transaction (``bench/pgbench_create.sql``: lookup by external id, the
workspace's next identifier, the insert, commit; then the settlement, commit)
on taskhook's schema, in the benchmark's own database; and the contract's
writes in plain SQL (``bench/pgbench_contract.sql``: the bare create with the
delivery's lease, source link, event and record), on deliveries stored for it.

What it is measured by is PostgreSQL's CPU per create, counted for the
database's own client backends (the processes ``pg_stat_activity`` lists for
it, so a neighbour's queries on the shared server are left out; ``bench
messages`` counts a drain the same way), and also the way ``bench e2e``
counts it (``bench.processes.server_cpu_seconds``: every live ``postgres``
process). Both are read twice while pgbench runs, after a warm-up, so
connection set-up and pgbench's ramp are not counted; the creates in between
are counted on the workspace's identifier counter.
"""

from __future__ import annotations

import glob
import hashlib
import math
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import psycopg
from sqlalchemy import select
from sqlalchemy.engine import make_url

from bench.deliveries import recorded_body
from bench.processes import BenchError, Processes, clean_environment, libpq_url, server_cpu_seconds
from models.db import make_engine, make_session_factory, session_scope
from models.sources import add_source
from models.tables import WebhookSource
from models.workspaces import create_workspace

SCRIPT = Path(__file__).resolve().parent / "pgbench_create.sql"
#: The contract's writes in plain SQL: the bare create and what a delivery adds to it.
CONTRACT_SCRIPT = Path(__file__).resolve().parent / "pgbench_contract.sql"
#: Queued deliveries stored per pgbench client and second of its run: more
#: than a client gets through (pgbench fails a client that runs out).
CONTRACT_DELIVERIES_PER_CLIENT_SECOND = 250
#: Where Debian's postgresql-client puts pgbench when it is not on PATH.
_DEBIAN_PGBENCH = "/usr/lib/postgresql/*/bin/pgbench"


class PgbenchMissing(BenchError):
    pass


def pgbench_path() -> str:
    """pgbench on PATH or in Debian's PostgreSQL folders; else PgbenchMissing."""
    found = shutil.which("pgbench") or next(iter(sorted(glob.glob(_DEBIAN_PGBENCH))), None)
    if found is None:
        raise PgbenchMissing(
            "pgbench is not installed (Debian: apt-get install postgresql-client or "
            "postgresql-contrib): the bare create baseline cannot be measured"
        )
    return found


def prepare_workspace(database_url: str) -> int:
    """A workspace of pgbench's own, so its creates leave the benchmark's alone."""
    engine = make_engine(database_url)
    try:
        with session_scope(make_session_factory(engine)) as session:
            slug = f"pgbench-{uuid.uuid4().hex[:8]}"
            return create_workspace(
                session=session, slug=slug, name="pgbench", task_prefix="PGBENCH"
            ).id
    finally:
        engine.dispose()


def database_backends_cpu(watcher: psycopg.Connection) -> dict[int, float]:
    """User and system CPU so far of every other client backend of
    ``watcher``'s database, by pid (a backend's CPU is all its database's: it
    serves one). Autovacuum's workers are left out: when one starts is
    PostgreSQL's choice, and one landing in a window would swing its figure."""
    pids = [
        pid
        for (pid,) in watcher.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
    ]
    seconds = {}
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[pid] = times.user + times.system
    return seconds


def backends_cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """The database's backend CPU between two readings: a backend that
    connected in between counts from zero (all of its work is in the window)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def _snapshot(watcher: psycopg.Connection, workspace_id: int) -> dict[str, Any]:
    (creates,) = watcher.execute(
        "SELECT task_sequence FROM workspaces WHERE id = %s", (workspace_id,)
    ).fetchone()
    return {
        "at": time.monotonic(),
        "creates": creates,
        "postgres": server_cpu_seconds("postgres"),
        "database_backends": database_backends_cpu(watcher),
    }


def bare_create(
    processes: Processes,
    database_url: str,
    *,
    workspace_id: int,
    clients: int,
    seconds: float,
) -> dict[str, Any]:
    """Run pgbench's bare create with ``clients`` connections for a warm-up,
    then ``seconds``, then a little more (so every client is still connected at
    the second reading); PostgreSQL's CPU per create over the ``seconds``."""
    return _pgbench(
        processes, database_url, SCRIPT, workspace_id=workspace_id, clients=clients, seconds=seconds
    )


def contract_floor(
    processes: Processes,
    database_url: str,
    *,
    workspace_id: int,
    clients: int,
    seconds: float,
) -> dict[str, Any]:
    """As :func:`bare_create`, with ``bench/pgbench_contract.sql``: the
    contract's writes in plain SQL, each create driven by one of the queued
    deliveries stored for it first (:func:`store_queued_deliveries`)."""
    per_client = CONTRACT_DELIVERIES_PER_CLIENT_SECOND * math.ceil(seconds + 2)
    first = store_queued_deliveries(database_url, workspace_id, clients * per_client)
    return _pgbench(
        processes,
        database_url,
        CONTRACT_SCRIPT,
        workspace_id=workspace_id,
        clients=clients,
        seconds=seconds,
        variables={"first": first, "per_client": per_client},
    )


def store_queued_deliveries(database_url: str, workspace_id: int, count: int) -> int:
    """``count`` queued GitHub deliveries of ``issues.opened`` with a real
    body, stored for a source of the workspace in one COPY; the first one's id
    (the rest follow it)."""
    body = recorded_body("github", "issues__opened")
    digest = hashlib.sha256(body).hexdigest()
    source_id = _source_of(database_url, workspace_id)
    run = uuid.uuid4().hex[:12]
    with psycopg.connect(libpq_url(database_url)) as connection:
        (first,) = connection.execute(
            "SELECT nextval(pg_get_serial_sequence('deliveries', 'id'))"
        ).fetchone()
        with connection.cursor().copy(
            "COPY deliveries (id, source_id, delivery_id, body, body_sha256, event, action,"
            " headers, received_at, updated_at, status) FROM STDIN"
        ) as copy:
            for offset in range(count):
                copy.write_row(
                    (
                        first + offset,
                        source_id,
                        f"{run}-{offset}",
                        body,
                        digest,
                        "issues.opened",
                        "opened",
                        "{}",
                        "now",
                        "now",
                        "queued",
                    )
                )
        connection.execute(
            "SELECT setval(pg_get_serial_sequence('deliveries', 'id'), %s)", (first + count,)
        )
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE deliveries")
    return first


def _source_of(database_url: str, workspace_id: int) -> int:
    """The workspace's GitHub source for the contract's deliveries, added on first use."""
    engine = make_engine(database_url)
    try:
        with session_scope(make_session_factory(engine)) as session:
            slug = f"pgbench-github-{workspace_id}"
            found = session.scalar(select(WebhookSource.id).where(WebhookSource.slug == slug))
            if found is not None:
                return found
            return add_source(
                session=session,
                provider="github",
                workspace_id=workspace_id,
                slug=slug,
                secret="pgbench",
                create_events=["issues.opened"],
            ).id
    finally:
        engine.dispose()


def _pgbench(
    processes: Processes,
    database_url: str,
    script: Path,
    *,
    workspace_id: int,
    clients: int,
    seconds: float,
    variables: dict[str, int] | None = None,
) -> dict[str, Any]:
    warmup = min(1.0, seconds / 2)
    url = make_url(database_url)
    args = [pgbench_path(), "--no-vacuum", "--protocol=prepared", f"--file={script}"]
    args += [f"--client={clients}", f"--jobs={min(clients, 2)}"]
    args += [f"--time={math.ceil(warmup + seconds + 0.5)}"]
    args += ["-D", f"workspace={workspace_id}", "-D", f"run={uuid.uuid4().int % 10**9}"]
    args += ["-D", "n=0"]
    for name, value in (variables or {}).items():
        args += ["-D", f"{name}={value}"]
    args += ["-h", url.host or "127.0.0.1", "-p", str(url.port or 5432)]
    args += ["-U", url.username or "postgres", url.database or "postgres"]
    env = clean_environment(**({"PGPASSWORD": url.password} if url.password else {}))
    process = processes.start("pgbench", args, env)
    try:
        with psycopg.connect(libpq_url(database_url), autocommit=True) as watcher:
            time.sleep(warmup)
            process.check_alive()
            before = _snapshot(watcher, workspace_id)
            time.sleep(seconds)
            process.check_alive()
            after = _snapshot(watcher, workspace_id)
        process.popen.wait(timeout=warmup + seconds + 60)
    finally:
        processes.stop(process)
    output = process.log.read_text(errors="replace")
    if process.popen.returncode != 0 or "number of failed transactions: 0 " not in output:
        raise BenchError(f"pgbench failed:\n{process.tail()}")
    creates = after["creates"] - before["creates"]
    if creates <= 0:
        raise BenchError(f"pgbench committed no creates in {seconds} s:\n{process.tail()}")
    elapsed = after["at"] - before["at"]
    return {
        "clients": clients,
        "window_s": round(elapsed, 3),
        "creates": creates,
        "rate_per_s": round(creates / elapsed, 1),
        "cpu_ms_per_create": {
            "postgres": round(1000 * (after["postgres"] - before["postgres"]) / creates, 3),
            "database_backends": round(
                1000
                * backends_cpu_between(before["database_backends"], after["database_backends"])
                / creates,
                3,
            ),
        },
    }
