"""``python -m bench brokers``: taskhook's drain on Redis and on RabbitMQ, side by side.

The same N deliveries are posted to one ingress (its relay publishing as it
ships), with no worker running; then one worker process (threads, as the
Procfile starts it) drains them. Redis is a private ``redis-server``;
RabbitMQ is a virtual host of the benchmark's own on the machine's node, with
taskhook's quorum queues and publisher confirms. The brokers take turns at
going first, round by round, and the ratio RabbitMQ : Redis is taken per
round. Timed from the worker's ready to the last delivery done, counted in
the inbox (which is what taskhook's work is, whatever the broker).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg

from bench import report, taskhook
from bench.processes import BenchError, libpq_url, throwaway_database

BROKERS = ("redis", "rabbitmq")


def brokers(bench: Any) -> dict[str, Any]:
    sizes, procs = bench.sizes, bench.processes
    n = sizes.brokers_deliveries
    urls = {"redis": procs.redis(), "rabbitmq": procs.rabbitmq()}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in BROKERS}
    with throwaway_database() as database:
        taskhook.prepare(database)
        with psycopg.connect(libpq_url(database), autocommit=True) as watcher:
            for round_ in range(sizes.brokers_rounds):
                order = BROKERS if round_ % 2 == 0 else tuple(reversed(BROKERS))
                for name in order:
                    run = _drain_on(bench, database, watcher, name, urls[name], n, round_)
                    runs[name].append(run)
                    bench.say(
                        f"  round {round_ + 1}, {name}: posted at {run['posted_per_s']}/s, "
                        f"drained at {run['rate_per_s']}/s"
                    )
    ratios = [
        report.ratio(rabbit["rate_per_s"], redis["rate_per_s"])
        for redis, rabbit in zip(runs["redis"], runs["rabbitmq"], strict=True)
    ]
    medians = {
        name: report.median([run["rate_per_s"] for run in entries])
        for name, entries in runs.items()
    }
    result = {
        "benchmark": "brokers",
        "deliveries": n,
        "runs": runs,
        "ratios_rabbitmq_vs_redis": ratios,
        "goals": {
            "redis_drain_per_s": medians["redis"],
            "rabbitmq_drain_per_s": medians["rabbitmq"],
            # report.median keeps one decimal, too few for a ratio.
            "rabbitmq_vs_redis": round(statistics.median(ratios), 3),
        },
    }
    rows = [{"label": name, "rate": rate} for name, rate in medians.items()]
    return bench.finish(result, rows, f"Drain of {n} deliveries, 1 worker process (per s)")


def _drain_on(
    bench: Any, database: str, watcher: psycopg.Connection, name: str, url: str, n: int, round_: int
) -> dict[str, Any]:
    procs = bench.processes
    taskhook.reset(database)
    env = taskhook.environment(database, url)
    ingress, ingress_url = procs.uvicorn(f"ingress-{name}", "ingest.app:app", env)
    try:
        started = time.monotonic()
        posted = bench.load(
            ingress_url,
            tag=f"brokers-{name}-{round_}",
            requests=n,
            concurrency=bench.sizes.concurrency,
        )
        posting = time.monotonic() - started
        if posted["completed"] != n:
            raise BenchError(f"{name}: the ingress answered {posted['completed']} of {n}")
        seconds = taskhook.timed_drain(
            procs, f"worker-{name}", env, watcher, n, what=f"every delivery done on {name}"
        )
        counts = taskhook.outcome_counts(database)
    finally:
        procs.stop(ingress)
    if counts["tasks"] != n or counts["deliveries_by_status"].get("done") != n:
        raise BenchError(f"{name}: not one task per delivery: {counts}")
    return {
        "seconds": round(seconds, 2),
        "rate_per_s": round(n / seconds, 1),
        "posted_per_s": round(n / posting, 1),
        "tasks": counts["tasks"],
    }
