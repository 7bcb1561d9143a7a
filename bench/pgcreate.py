"""PostgreSQL's own floor for a create: pgbench running the bare create
transaction (``bench/pgbench_create.sql``: lookup by external id, the
workspace's next identifier, the insert, commit; then the settlement, commit)
on taskhook's schema, in the benchmark's own database.

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
import math
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import psycopg
from sqlalchemy.engine import make_url

from bench.processes import BenchError, Processes, clean_environment, libpq_url, server_cpu_seconds
from models.db import make_engine, make_session_factory, session_scope
from models.workspaces import create_workspace

SCRIPT = Path(__file__).resolve().parent / "pgbench_create.sql"
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
    warmup = min(1.0, seconds / 2)
    url = make_url(database_url)
    args = [pgbench_path(), "--no-vacuum", "--protocol=prepared", f"--file={SCRIPT}"]
    args += [f"--client={clients}", f"--jobs={min(clients, 2)}"]
    args += [f"--time={math.ceil(warmup + seconds + 0.5)}"]
    args += ["-D", f"workspace={workspace_id}", "-D", f"run={uuid.uuid4().int % 10**9}"]
    args += ["-D", "n=0"]
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
