"""``python -m bench prune``: the ingress and the workers while the retention
policy prunes a large inbox, against the same without a prune.

The inbox is bulk-loaded with ``prune_rows`` finished deliveries (``scale``'s
loader, ``bench.taskhook.bulk_load``: as many tasks beside them), aged evenly
from 31 to 150 days by key, so that the default policy (bodies dropped after
30 days, rows deleted after 90) has about half of them to delete and the
other half's bodies to drop: more than every round's prunes get through, so
a prune runs from the start to the end of every phase that has one.

The prune runs as in production: an operator Celery worker (one thread) takes
PRUNE (``worker.retention``), prunes for half the task time limit (8 s here,
so that each run of 4 s logs what it did) in batches of
``TASKHOOK_RETENTION_BATCH``, pausing between two, and sends PRUNE again while
rows are left. It starts before a phase's measurement and is stopped after it.

Each round measures three sides, in an order that rotates by round: without
a prune, with one **deleting** rows (``TASKHOOK_BODY_RETENTION_DAYS=0`` for
the operator worker: its cheap rule) and with one **dropping** bodies
(``TASKHOOK_INBOX_RETENTION_DAYS=0``: an UPDATE of every index of the row,
the expensive one); each of:

- **ingress**: the closed loop (``concurrency`` in flight) for
  ``prune_ingress_seconds``, as ``bench ingress`` runs it;
- **drain**: ``prune_deliveries`` deliveries posted first, then one worker
  process (taskhook's defaults: threads, 4) drains them, timed from its first
  message to the last row done, as ``bench e2e`` times it.

The ratio of each prune's side to the side without is taken per round and the
median reported; the goal is every one within 10 %. Also reported: what each
prune got through (rows per second, the share of the time it spent in its
transactions, the operator worker's CPU), the autovacuums meanwhile, a
batch's plan at full size (EXPLAIN ANALYZE), and the inbox's disk use before
and after (``models.reports.inbox_disk_use``).
"""

from __future__ import annotations

import contextlib
import re
import signal
import statistics
import time
from typing import Any

import psycopg
import redis
from sqlalchemy import select

from bench import drains, report, taskhook
from bench.processes import BenchError, Process, libpq_url, throwaway_database, wait_until
from models.broker.messages import DELIVERY_QUEUES, OPERATOR_QUEUE, PRUNE
from models.db import make_engine, make_session_factory, session_scope
from models.reports import inbox_disk_use
from models.retention import Policy, _bodies_to_drop, _rows_to_delete
from models.settings import Settings
from models.tables import Delivery, utcnow

#: Bulk-loaded rows are this old at the newest (just past the 30 days of the
#: default body retention) ...
YOUNGEST_DAYS = 31
#: ... to this old at the oldest (well past its 90 days of rows).
OLDEST_DAYS = 150

_AGE = """
UPDATE deliveries
SET updated_at = now() - make_interval(days => %(youngest)s)
                       - make_interval(secs => %(spread)s * (%(last)s - id)::float / %(last)s),
    received_at = now() - make_interval(days => %(youngest)s)
                        - make_interval(secs => %(spread)s * (%(last)s - id)::float / %(last)s)
WHERE id <= %(last)s
"""
#: Issue numbers each load may use: far more than one phase posts.
PHASE_NUMBERS = 10_000_000
_UNFINISHED = "SELECT count(*) FROM deliveries WHERE status IN ('queued', 'processing')"

WITHOUT, DELETING, DROPPING = "without", "deleting", "dropping"
SIDES = (WITHOUT, DELETING, DROPPING)
#: What each prune's operator worker sets to keep to its one rule.
_RULE_OFF = {DELETING: "TASKHOOK_BODY_RETENTION_DAYS", DROPPING: "TASKHOOK_INBOX_RETENTION_DAYS"}


def prune(bench: Any) -> dict[str, Any]:
    sizes, procs = bench.sizes, bench.processes
    redis_url = procs.redis()
    with throwaway_database() as database:
        taskhook.prepare(database)
        loaded = taskhook.bulk_load(database, sizes.prune_rows)
        aged = _age(database, sizes.prune_rows)
        bench.say(
            f"  bulk-loaded {sizes.prune_rows:,} inbox rows in {loaded:.0f} s, aged in {aged:.0f} s"
        )
        before = _disk(database)
        plans = _batch_plans(database)
        env = taskhook.environment(database, redis_url)
        _, url = procs.uvicorn("taskhook", "ingest.app:app", env)
        bench.load(url, tag=taskhook.tag("warm"), duration=1.0, concurrency=8)
        rig = _Rig(bench, database, redis_url, url, env)
        rounds = []
        for round_ in range(sizes.prune_rounds):
            # Each round starts with the next side, so none always runs first.
            order = SIDES[round_ % 3 :] + SIDES[: round_ % 3]
            entry: dict[str, Any] = {"ingress": {}, "drain": {}}
            for side in order:
                entry["ingress"][side] = rig.ingress(side, round_)
            for side in order:
                entry["drain"][side] = rig.drain(side, round_)
            for what in ("ingress", "drain"):
                entry[what]["ratios"] = {
                    side: report.ratio(
                        entry[what][side]["rate_per_s"], entry[what][WITHOUT]["rate_per_s"]
                    )
                    for side in (DELETING, DROPPING)
                }
            bench.say(
                f"  round {round_}: ingress {entry['ingress']['ratios']}, "
                f"drain {entry['drain']['ratios']} of the side without a prune"
            )
            rounds.append(entry)
        after = _disk(database)
    return _report(bench, rounds, loaded, before, after, plans)


class _Rig:
    """One ingress on the loaded database, and how each phase runs on it."""

    def __init__(self, bench, database, redis_url, url, env) -> None:
        self.bench = bench
        self.database, self.redis_url, self.url = database, redis_url, url
        self.env = env
        self.client = redis.Redis.from_url(redis_url)
        self.watcher = psycopg.connect(libpq_url(database), autocommit=True)
        self.published = 0.0
        self.phases = 0

    def numbers(self) -> int:
        """The first issue number of the next load: bodies of their own, for
        a body already stored under another delivery id is a replay."""
        self.phases += 1
        return self.phases * PHASE_NUMBERS

    def ingress(self, side: str, round_: int) -> dict[str, Any]:
        sizes = self.bench.sizes
        drains.flush(self.redis_url)
        with self.pruning(side) as pruned:
            run = self.bench.load(
                self.url,
                tag=taskhook.tag(f"prune-ingress-{round_}-{side}"),
                duration=sizes.prune_ingress_seconds,
                concurrency=sizes.concurrency,
                first_number=self.numbers(),
            )
        # Nothing drains these: out of the way of the next phase.
        self.watcher.execute("DELETE FROM deliveries WHERE status = 'queued'")
        drains.flush(self.redis_url)
        self.published = taskhook.relay_published(self.url)
        result = {
            "rate_per_s": run["throughput_rps"],
            "errors": run["errors"],
            "latency": run["latency"],
            "meanwhile": pruned,
        }
        self.bench.say(
            f"  round {round_}, ingress {side}: {run['throughput_rps']}/s, "
            f"p99 {run['latency']['p99_ms']} ms{_prune_brief(pruned)}"
        )
        return result

    def drain(self, side: str, round_: int) -> dict[str, Any]:
        sizes = self.bench.sizes
        n = sizes.prune_deliveries
        drains.flush(self.redis_url)
        posted = self.bench.load(
            self.url,
            tag=taskhook.tag(f"prune-drain-{round_}-{side}"),
            requests=n,
            concurrency=sizes.concurrency,
            first_number=self.numbers(),
        )
        queued = posted["by_answer"].get("queued", {}).get("count", 0)
        if posted["completed"] != n or queued != n:
            raise BenchError(f"the ingress queued {queued} of {n}: {posted['by_answer']}")
        target = self.published + n
        wait_until(
            lambda: taskhook.relay_published(self.url) >= target,
            timeout=120,
            what="the relay to publish every key",
        )
        self.published = target
        messages = self._waiting()
        workers = drains.Starter(
            self.bench.processes, f"drain-{round_}-{side}", "worker", self.env, 1
        )

        def done() -> bool:
            # Not the broker's unacked messages: the prune's own is one of them.
            idle = self._waiting() == 0
            return idle and self.watcher.execute(_UNFINISHED).fetchone()[0] == 0

        with self.pruning(side) as pruned:
            drained = drains.drain(workers, n, messages, self.redis_url, done)
        workers.stop()
        result = {**drained, "meanwhile": pruned}
        self.bench.say(
            f"  round {round_}, drain {side}: {drained['rate_per_s']}/s "
            f"({messages} messages){_prune_brief(pruned)}"
        )
        return result

    @contextlib.contextmanager
    def pruning(self, side: str):
        """Unless ``side`` is WITHOUT, an operator worker pruning by that side's
        rule throughout the block. Yields what happened meanwhile (filled in
        when the block ends): what the prune got through and what it spent,
        and either way the autovacuums and autoanalyzes PostgreSQL ran."""
        happened: dict[str, Any] = {"pruning": side != WITHOUT}
        vacuums = self._vacuums()
        operator = None
        if side != WITHOUT:
            counts = self._counts()
            env = {
                **self.env,
                "TASKHOOK_WORKER_CONCURRENCY": "1",
                # Runs of a few seconds, each logged: the time it spent working.
                "TASKHOOK_TASK_TIME_LIMIT_SECONDS": "8",
                _RULE_OFF[side]: "0",
            }
            operator = self.bench.processes.celery_worker(
                "operator", "worker", env, queues=OPERATOR_QUEUE
            )
            app = drains.celery_client(self.redis_url)
            app.send_task(PRUNE)
            app.close()
            wait_until(
                lambda: "taskhook.prune" in operator.log.read_text(errors="replace"),
                timeout=30,
                what="the operator worker to take PRUNE",
            )
            time.sleep(0.5)  # into its batches
            cpu = operator.cpu_seconds()
        started = time.monotonic()
        try:
            yield happened
        finally:
            seconds = time.monotonic() - started
            happened["autovacuums"] = self._vacuums() - vacuums
            if operator is not None:
                log = operator.log.read_text(errors="replace")
                ran_out = "'finished': True" in log
                spent = operator.cpu_seconds() - cpu
                _cold_stop(self.bench.processes, operator)
                later = self._counts()
                # Each side's prune keeps to its one rule: the other count
                # does not move (a deleted row may take a dropped body with it).
                deleted = counts["rows"] - later["rows"] if side == DELETING else 0
                dropped = later["dropped"] - counts["dropped"] if side == DROPPING else 0
                happened.update(
                    {
                        "rows_deleted": deleted,
                        "bodies_dropped": dropped,
                        "seconds": round(seconds, 1),
                        "rows_per_s": round((deleted + dropped) / seconds, 1),
                        "operator_cpu_share": round(spent / seconds, 3),
                        "busy_share": _busy_share(log),
                        "ran_out_of_work": ran_out,
                    }
                )

    def _waiting(self) -> int:
        """Messages waiting in either lane of the deliveries queue."""
        return sum(self.client.llen(queue) for queue in DELIVERY_QUEUES)

    def _counts(self) -> dict[str, int]:
        """The bulk-loaded rows left, and those of their bodies dropped."""
        rows, dropped = self.watcher.execute(
            "SELECT count(*), count(*) FILTER (WHERE body_dropped_at IS NOT NULL) FROM deliveries"
            " WHERE id <= %s",
            (self.bench.sizes.prune_rows,),
        ).fetchone()
        return {"rows": rows, "dropped": dropped}

    def _vacuums(self) -> int:
        return self.watcher.execute(
            "SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0)::int"
            " FROM pg_stat_user_tables"
        ).fetchone()[0]


def _cold_stop(procs: Any, process: Process) -> None:
    """Stop at once (Celery's cold shutdown): a warm one would wait for the
    prune's run, up to half the task time limit. The batch in flight rolls back."""
    with contextlib.suppress(ProcessLookupError):
        process.popen.send_signal(signal.SIGQUIT)
    procs.stop(process)


def _busy_share(log: str) -> float | None:
    """The share of its time the prune spent in its transactions, from the
    runs the operator worker logged (each says both)."""
    runs = re.findall(r"batches, ([0-9.]+) s \(([0-9.]+) s of it in transactions\)", log)
    total = sum(float(seconds) for seconds, _ in runs)
    return round(sum(float(busy) for _, busy in runs) / total, 3) if total else None


def _prune_brief(happened: dict[str, Any]) -> str:
    vacuums = f"; {happened['autovacuums']} autovacuum(s)/analyze(s)"
    if not happened["pruning"]:
        return vacuums
    did = (
        f"deleted {happened['rows_deleted']:,} rows"
        if happened["rows_deleted"]
        else f"dropped {happened['bodies_dropped']:,} bodies"
    )
    return (
        f"; the prune {did} ({happened['rows_per_s']:,.0f} rows/s, "
        f"its worker {happened['operator_cpu_share']:.0%} of a CPU)"
        + (", and ran out of work" if happened["ran_out_of_work"] else "")
        + vacuums
    )


def _age(database: str, rows: int) -> float:
    started = time.monotonic()
    spread = (OLDEST_DAYS - YOUNGEST_DAYS) * 86400
    with psycopg.connect(libpq_url(database), autocommit=True) as connection:
        connection.execute(_AGE, {"youngest": YOUNGEST_DAYS, "spread": spread, "last": rows})
        connection.execute("VACUUM ANALYZE deliveries")
    return time.monotonic() - started


def _disk(database: str) -> dict[str, Any]:
    engine = make_engine(database)
    try:
        with session_scope(make_session_factory(engine)) as session:
            use = inbox_disk_use(session=session)
    finally:
        engine.dispose()
    return {
        "rows": use.rows,
        "body_bytes": use.body_bytes,
        "bodies_dropped": use.bodies_dropped,
        "storage_bytes": use.storage_bytes,
    }


def _batch_plans(database: str) -> dict[str, str]:
    """EXPLAIN (ANALYZE) of the first batch's choice of rows, at full size."""
    policy, now = Policy.of(Settings()), utcnow()
    wheres = {
        "delete rows": _rows_to_delete("done", policy.row_cutoff(now)),
        "drop bodies": _bodies_to_drop("done", policy.body_cutoff(now), policy.row_cutoff(now)),
    }
    engine = make_engine(database)
    plans = {}
    try:
        with engine.connect() as connection:
            for name, where in wheres.items():
                statement = (
                    select(Delivery.id)
                    .where(where)
                    .order_by(Delivery.updated_at)
                    .limit(policy.batch)
                )
                sql = str(statement.compile(engine, compile_kwargs={"literal_binds": True}))
                plans[name] = "\n".join(
                    connection.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS) {sql}").scalars()
                )
    finally:
        engine.dispose()
    return plans


def _report(bench, rounds, loaded, before, after, plans) -> dict[str, Any]:
    whats, pruning = ("ingress", "drain"), (DELETING, DROPPING)
    ratios = {
        what: {
            side: round(statistics.median(entry[what]["ratios"][side] for entry in rounds), 3)
            for side in pruning
        }
        for what in whats
    }
    medians = {
        what: {
            side: report.median([entry[what][side]["rate_per_s"] for entry in rounds])
            for side in SIDES
        }
        for what in whats
    }
    prunes = {
        side: [entry[what][side]["meanwhile"] for entry in rounds for what in whats]
        for side in pruning
    }
    rows = [
        {
            "label": f"{what}\n{side}",
            "rate": medians[what][side],
            "low": min(entry[what][side]["rate_per_s"] for entry in rounds),
            "high": max(entry[what][side]["rate_per_s"] for entry in rounds),
        }
        for what in whats
        for side in SIDES
    ]
    result = {
        "rows": bench.sizes.prune_rows,
        "bulk_load_seconds": round(loaded, 1),
        "rounds": rounds,
        "medians_per_s": medians,
        "ratios_vs_without": ratios,
        "ratios_per_round": {
            what: {side: [entry[what]["ratios"][side] for entry in rounds] for side in pruning}
            for what in whats
        },
        "prune_rows_per_s": {
            side: report.median([p["rows_per_s"] for p in prunes[side]]) for side in pruning
        },
        "disk_before": before,
        "disk_after": after,
        "batch_plans": plans,
        "goals": {
            **{
                f"{what} while a prune is {side} within 10% of without": ratios[what][side] >= 0.9
                for what in whats
                for side in pruning
            },
            "a prune ran through every measured phase": not any(
                p["ran_out_of_work"] for side in pruning for p in prunes[side]
            ),
        },
    }
    return bench.finish(
        result,
        rows,
        f"Retention: ingress and drain without a prune, and with one deleting rows or "
        f"dropping bodies ({bench.sizes.prune_rows:,} rows)",
        rate_label="answers or deliveries per s",
    )
