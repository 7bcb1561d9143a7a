"""The six benchmarks. Each takes a :class:`Bench` (sizes, where results go,
the processes it starts) and returns the result it wrote."""

from __future__ import annotations

import contextlib
import random
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import text

from bench import report, taskhook
from bench.aliases import aliases
from bench.baselines import DURABLE_TABLE
from bench.brokers import brokers
from bench.catch_up import catch_up
from bench.drains import (
    Sampler,
    drain_rows,
    end_to_end_rig,
    flush,
    peaks_across,
    settled_goals,
    summary_of_rounds,
)
from bench.embedded import sqlite
from bench.fairness import fairness
from bench.latency import latency
from bench.messages import messages
from bench.processes import (
    Processes,
    libpq_url,
    throwaway_database,
    wait_until,
)
from bench.prune import prune
from bench.retries import retries
from bench.streams import streams
from bench.tracing import tracing
from bench.workspaces import workspaces
from models.settings import DEFAULT_WORKER_CONCURRENCY, Settings


@dataclass(frozen=True)
class Sizes:
    ingress_seconds: float
    ingress_rounds: int
    open_rates: tuple[int, ...]
    concurrency: int
    e2e_deliveries: int
    e2e_workers: tuple[int, ...]
    e2e_rounds: int
    #: Keys per worker message at the relay (0: taskhook's default).
    e2e_keys_per_message: int
    storm_deliveries: int
    storm_compare: int
    storm_rounds: int
    scale_sizes: tuple[int, ...]
    scale_creates: int
    scale_rounds: int
    scale_ingress_seconds: float
    #: bench aliases: the two counts of alias rows, the aliases timed in
    #: each, and the rounds (taking turns).
    aliases_sizes: tuple[int, int]
    aliases_lookups: int
    aliases_rounds: int
    memory_deliveries: int
    sqlite_deliveries: int
    #: bench sqlite: rounds of each side (now, previous settings), taking turns.
    sqlite_rounds: int
    catchup_deliveries: int
    catchup_rounds: int
    brokers_deliveries: int
    brokers_rounds: int
    #: bench retries: deliveries per drain, deliveries waiting for retries
    #: beside it, rounds (the two cases taking turns).
    retries_deliveries: int
    retries_waiting: int
    retries_rounds: int
    #: bench prune: rows bulk-loaded and aged, deliveries per drain, seconds
    #: per ingress run, rounds.
    prune_rows: int
    prune_deliveries: int
    prune_ingress_seconds: float
    prune_rounds: int
    #: bench messages (one message per delivery): deliveries per drain,
    #: worker process counts, rounds, seconds of pgbench's bare create.
    messages_deliveries: int
    messages_workers: tuple[int, ...]
    messages_rounds: int
    messages_pgbench_seconds: float
    #: bench workspaces: creator processes, seconds per run, rounds, and the
    #: share (percent) of creates repeating an external id (Found).
    workspaces_creators: int
    workspaces_seconds: float
    workspaces_rounds: int
    workspaces_found_percent: int
    #: bench latency: open-loop rates and seconds at each; the ramp's first
    #: rate, its ceiling, seconds per step, and the factor it bisects down to.
    latency_rates: tuple[int, ...]
    latency_seconds: float
    latency_ramp_start: int
    latency_ramp_max: int
    latency_ramp_seconds: float
    latency_ramp_precision: float
    #: bench streams: SSE streams held open, seconds per closed-loop run,
    #: rounds, and the webhooks (and their rate) timed onto every stream;
    #: streams_listener=0 measures the streams polling instead (the old way).
    streams_open: int
    streams_seconds: float
    streams_rounds: int
    streams_latency_deliveries: int
    streams_latency_rate: int
    streams_listener: int
    #: bench fairness: the cases (1-4, bench/fairness.py), rounds, the storm's
    #: deliveries, the steady loads' rate (per s), a baseline's seconds, the
    #: quiet workspaces and each one's rate (per s), and the deliveries a
    #: catch-up recovers or a bulk replay sends.
    fairness_cases: tuple[int, ...]
    fairness_rounds: int
    fairness_storm: int
    fairness_steady_rate: int
    fairness_baseline_seconds: float
    fairness_quiet_workspaces: int
    fairness_quiet_rate: int
    fairness_background: int


SMOKE = Sizes(
    ingress_seconds=1.5,
    ingress_rounds=1,
    open_rates=(100,),
    concurrency=16,
    e2e_deliveries=300,
    e2e_workers=(1,),
    e2e_rounds=1,
    e2e_keys_per_message=0,
    storm_deliveries=150,
    storm_compare=300,
    storm_rounds=1,
    scale_sizes=(1_000, 5_000),
    scale_creates=40,
    scale_rounds=1,
    scale_ingress_seconds=1.5,
    aliases_sizes=(1_000, 10_000),
    aliases_lookups=30,
    aliases_rounds=1,
    memory_deliveries=600,
    sqlite_deliveries=60,
    sqlite_rounds=1,
    catchup_deliveries=200,
    catchup_rounds=1,
    brokers_deliveries=200,
    brokers_rounds=1,
    retries_deliveries=200,
    retries_waiting=200,
    retries_rounds=1,
    prune_rows=10_000,  # fewer, and the planner scans rather than uses the index the test checks
    prune_deliveries=200,
    prune_ingress_seconds=1.0,
    prune_rounds=1,
    messages_deliveries=100,
    messages_workers=(2,),
    messages_rounds=1,
    messages_pgbench_seconds=1.0,
    workspaces_creators=2,
    workspaces_seconds=1.0,
    workspaces_rounds=1,
    workspaces_found_percent=20,
    latency_rates=(40,),
    latency_seconds=1.0,
    latency_ramp_start=40,
    latency_ramp_max=40,
    latency_ramp_seconds=1.0,
    latency_ramp_precision=2.0,
    streams_open=50,
    streams_seconds=1.5,
    streams_rounds=1,
    streams_latency_deliveries=20,
    streams_latency_rate=20,
    streams_listener=1,
    fairness_cases=(1, 2, 3, 4, 5),
    fairness_rounds=1,
    fairness_storm=150,
    fairness_steady_rate=10,
    fairness_baseline_seconds=1.0,
    fairness_quiet_workspaces=5,
    fairness_quiet_rate=2,
    fairness_background=100,
)
DEFAULT = Sizes(
    ingress_seconds=8,
    ingress_rounds=3,
    open_rates=(250, 500, 1000),
    concurrency=32,
    e2e_deliveries=20_000,
    e2e_workers=(1, 2),
    e2e_rounds=3,
    e2e_keys_per_message=0,
    storm_deliveries=20_000,
    storm_compare=4_000,
    storm_rounds=3,
    scale_sizes=(10_000, 100_000, 1_000_000),
    scale_creates=300,
    scale_rounds=3,
    scale_ingress_seconds=6,
    aliases_sizes=(10_000, 1_000_000),
    aliases_lookups=300,
    aliases_rounds=4,
    memory_deliveries=40_000,
    sqlite_deliveries=2_000,
    sqlite_rounds=3,
    catchup_deliveries=10_000,
    catchup_rounds=3,
    brokers_deliveries=10_000,
    brokers_rounds=3,
    retries_deliveries=10_000,
    retries_waiting=200,
    retries_rounds=3,
    prune_rows=1_000_000,
    prune_deliveries=10_000,
    prune_ingress_seconds=8,
    prune_rounds=3,
    messages_deliveries=6_000,
    messages_workers=(1, 2),
    messages_rounds=3,
    messages_pgbench_seconds=8,
    workspaces_creators=4,
    workspaces_seconds=8,
    workspaces_rounds=3,
    workspaces_found_percent=20,
    latency_rates=(100, 300, 600),
    latency_seconds=10,
    latency_ramp_start=25,
    latency_ramp_max=3200,
    latency_ramp_seconds=5,
    # Each side's rate within 5 %: the ratio of the two within about 10 %.
    latency_ramp_precision=1.05,
    streams_open=1000,
    streams_seconds=8,
    streams_rounds=3,
    streams_latency_deliveries=300,
    streams_latency_rate=10,
    streams_listener=1,
    fairness_cases=(1, 2, 3, 4, 5),
    fairness_rounds=2,
    fairness_storm=20_000,
    fairness_steady_rate=5,
    fairness_baseline_seconds=30,
    fairness_quiet_workspaces=100,
    fairness_quiet_rate=1,
    fairness_background=10_000,
)
#: bench fairness's cases (bench/fairness.py).
FAIRNESS_CASES = {1, 2, 3, 4, 5}
FULL = replace(DEFAULT, ingress_rounds=5, memory_deliveries=200_000, scale_creates=1000)
SIZES = {"smoke": SMOKE, "default": DEFAULT, "full": FULL}


def parse_overrides(assignments: list[str]) -> dict[str, Any]:
    """``FIELD=N`` strings to typed :class:`Sizes` changes; ValueError names the bad one."""
    changes: dict[str, Any] = {}
    for assignment in assignments:
        field, equals, value = assignment.partition("=")
        if not equals or field not in Sizes.__dataclass_fields__:
            known = ", ".join(Sizes.__dataclass_fields__)
            raise ValueError(f"--set {assignment!r}: expected FIELD=N, FIELD one of {known}")
        current = getattr(DEFAULT, field)
        try:
            if isinstance(current, tuple):
                changes[field] = tuple(int(part) for part in value.split(","))
            else:
                changes[field] = type(current)(value)
        except ValueError:
            example = "a number list such as 1,2" if isinstance(current, tuple) else "a number"
            raise ValueError(f"--set {assignment!r}: {field} takes {example}") from None
        if field == "fairness_cases" and not set(changes[field]) <= FAIRNESS_CASES:
            raise ValueError(f"--set {assignment!r}: the cases are 1, 2, 3, 4 and 5")
    return changes


class Bench:
    """One benchmark's run: its sizes, its results folder, the processes it started."""

    def __init__(
        self,
        name: str,
        size: str,
        results: Path,
        log: Callable[[str], None] = print,
        logs: Path | None = None,
        brokers: tuple[str, ...] = ("redis", "rabbitmq"),
    ):
        self.name, self.size, self.sizes = name, size, SIZES[size]
        #: The brokers a benchmark that runs on either runs on (bench fairness).
        self.brokers = brokers
        self.results = results
        self.logs = (logs or results / "logs") / name
        shutil.rmtree(self.logs, ignore_errors=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.processes = Processes(self.logs)
        self.say = log
        #: When each tag's Jira bodies say they were sent: a load posted again
        #: under its tag resends the very bytes, as a sender's redelivery does.
        self.sent_at: dict[str, float] = {}

    def override(self, assignments: list[str]) -> None:
        """Apply ``FIELD=N`` overrides to the sizes (tuples as ``a,b,c``)."""
        changes = parse_overrides(assignments)
        if changes:
            self.sizes = replace(self.sizes, **changes)
            self.size = f"{self.size} ({', '.join(assignments)})"

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.processes.stop_all()

    def load(self, url: str, *, tag: str, **options: Any) -> dict[str, Any]:
        spec = {"url": url, "secret": taskhook.SECRET, "sources": taskhook.SOURCES, "tag": tag}
        spec["sent_at"] = self.sent_at.setdefault(tag, time.time())
        spec.setdefault("timeout", 900)
        return self.processes.loadgen({**spec, **options})

    def finish(
        self, result: dict[str, Any], rows: list[dict[str, Any]], title: str, **chart
    ) -> dict:
        result = {"size": self.size, "sizes": self.sizes.__dict__, **result}
        report.write(self.results, self.name, result)
        report.chart(self.results, self.name, title, rows, **chart)
        return result


def _brief(run: dict[str, Any]) -> str:
    latency = run["latency"]
    return (
        f"{run['throughput_rps']}/s, p50 {latency['p50_ms']} ms, p99 {latency['p99_ms']} ms,"
        f" errors {run['errors']}"
    )


def _row(label: str, runs: list[dict[str, Any]], latency_of: dict | None = None) -> dict:
    rates = [run["throughput_rps"] for run in runs]
    middle = sorted(runs, key=lambda run: run["throughput_rps"])[len(runs) // 2]
    latency = latency_of if latency_of is not None else middle["latency"]
    return {
        "label": label,
        "rate": report.median(rates),
        "low": min(rates),
        "high": max(rates),
        "p50_ms": latency["p50_ms"],
        "p95_ms": latency["p95_ms"],
        "p99_ms": latency["p99_ms"],
    }


# --- 1. ingress ---------------------------------------------------------------------------


def ingress(bench: Bench) -> dict[str, Any]:
    """taskhook's ingress against the tutorial app and a minimal durable one:
    closed-loop rounds, then open-loop rates, each in an order that rotates."""
    redis_url = bench.processes.redis()
    with throwaway_database() as database:
        servers = _ingress_servers(bench, database, redis_url)

        def reset() -> None:
            flush(redis_url)
            taskhook.reset(database)

        for name, url in servers.items():  # warm-up: imports, pools, caches
            bench.load(url, tag=taskhook.tag(f"warm-{name}"), duration=1.0, concurrency=8)
        closed = _closed_loop_rounds(bench, servers, reset)
        opened = _open_loop_rates(bench, servers, reset)
        reset()
    return _report_ingress(bench, closed, opened)


def _ingress_servers(bench: Bench, database: str, redis_url: str) -> dict[str, str]:
    """The three servers compared, by name, each at its URL."""
    procs = bench.processes
    taskhook.prepare(database)
    with psycopg.connect(libpq_url(database), autocommit=True) as connection:
        connection.execute(DURABLE_TABLE)
    base_env = taskhook.environment(
        database,
        redis_url,
        BENCH_SECRET=taskhook.SECRET,
        BENCH_BROKER_URL=redis_url,
        BENCH_DSN=libpq_url(database),
    )
    return {
        "tutorial": procs.uvicorn(
            "tutorial", "bench.baselines:tutorial_app", base_env, factory=True
        )[1],
        "minimal durable": procs.uvicorn(
            "durable", "bench.baselines:durable_app", base_env, factory=True
        )[1],
        "taskhook": procs.uvicorn("taskhook", "ingest.app:app", base_env)[1],
    }


def _rotated(names: list[str], by: int) -> list[str]:
    # Each round starts with the next server, so none always runs first.
    return names[by % 3 :] + names[: by % 3]


def _closed_loop_rounds(
    bench: Bench, servers: dict[str, str], reset: Callable[[], None]
) -> dict[str, list[dict]]:
    """Each server's closed-loop runs, one per round."""
    sizes, names = bench.sizes, list(servers)
    closed: dict[str, list[dict]] = {name: [] for name in names}
    for round_ in range(sizes.ingress_rounds):
        for name in _rotated(names, round_):
            reset()
            run = bench.load(
                servers[name],
                tag=taskhook.tag(f"{name}-{round_}"),
                duration=sizes.ingress_seconds,
                concurrency=sizes.concurrency,
            )
            closed[name].append(run)
            bench.say(f"  closed-loop {name} round {round_}: {_brief(run)}")
    return closed


def _open_loop_rates(
    bench: Bench, servers: dict[str, str], reset: Callable[[], None]
) -> dict[str, dict[int, dict]]:
    """Each server's open-loop run at each of ``open_rates``."""
    sizes, names = bench.sizes, list(servers)
    opened: dict[str, dict[int, dict]] = {name: {} for name in names}
    for index, rate in enumerate(sizes.open_rates):
        for name in _rotated(names, index):
            reset()
            run = bench.load(
                servers[name],
                tag=taskhook.tag(f"{name}-open-{rate}"),
                mode="open",
                rate=rate,
                duration=sizes.ingress_seconds,
                request_timeout=10,
            )
            opened[name][rate] = run
            bench.say(f"  open-loop {name} at {rate}/s: {_brief(run)}")
    return opened


def _report_ingress(
    bench: Bench, closed: dict[str, list[dict]], opened: dict[str, dict[int, dict]]
) -> dict[str, Any]:
    """The result and its chart: the ratios per round and their medians, and the goals."""
    sizes = bench.sizes
    per_round = _ingress_ratios_per_round(closed, sizes.ingress_rounds)
    vs_tutorial = statistics.median(row["vs_tutorial"] for row in per_round)
    vs_durable = statistics.median(row["vs_minimal_durable"] for row in per_round)
    at_500 = opened["taskhook"].get(500)
    result = {
        "closed_loop": {
            name: {
                "throughput_rps_median": report.median([run["throughput_rps"] for run in runs]),
                "runs": runs,
            }
            for name, runs in closed.items()
        },
        "open_loop": {
            name: {str(rate): run for rate, run in by_rate.items()}
            for name, by_rate in opened.items()
        },
        "ratios_per_round": per_round,
        "ratios": {"vs_tutorial": vs_tutorial, "vs_minimal_durable": vs_durable},
        "goals": {
            "throughput >= 1.0x tutorial": vs_tutorial >= 1.0,
            "throughput >= 0.7x minimal durable": vs_durable >= 0.7,
            "p99 < 50 ms at 500/s": None
            if at_500 is None
            else (at_500["latency"]["p99_ms"] < 50 and at_500["errors"] == 0),
        },
    }
    return bench.finish(
        result,
        _ingress_rows(bench.sizes, closed, opened),
        "Ingress: throughput (closed loop) and achieved rate (open loop)",
        rate_label="answers per s",
    )


def _ingress_ratios_per_round(closed: dict[str, list[dict]], rounds: int) -> list[dict]:
    """taskhook's closed-loop throughput over each baseline's, round by round."""

    def rate(name: str, round_: int) -> float:
        return closed[name][round_]["throughput_rps"]

    return [
        {
            "vs_tutorial": report.ratio(rate("taskhook", r), rate("tutorial", r)),
            "vs_minimal_durable": report.ratio(rate("taskhook", r), rate("minimal durable", r)),
        }
        for r in range(rounds)
    ]


def _ingress_rows(
    sizes: Sizes, closed: dict[str, list[dict]], opened: dict[str, dict[int, dict]]
) -> list[dict]:
    """The chart's bars: each server closed-loop, then each rate open-loop."""
    names = list(closed)
    rows = [_row(f"{name}\nclosed, c={sizes.concurrency}", closed[name]) for name in names]
    rows += [
        {**_row(f"{name}\nopen {rate}/s", [run]), "rate": run["throughput_rps"]}
        for rate in sizes.open_rates
        for name in names
        for run in [opened[name][rate]]
    ]
    return rows


# --- 2. end to end, and the RSS of its processes -------------------------------------------


def _worker_shape(keys_per_message: int) -> dict[str, Any]:
    """The pool and threads of each worker process: taskhook's defaults, which
    the workers started here (and the no-op baseline's) run with; and how many
    keys the relay put in one message."""
    fields = Settings.model_fields
    return {
        "pool": fields["worker_pool"].default,
        "concurrency": DEFAULT_WORKER_CONCURRENCY,  # on PostgreSQL
        "relay_keys_per_message": keys_per_message,
    }


def end_to_end(bench: Bench) -> dict[str, Any]:
    """taskhook's workers draining deliveries the ingress took, against Celery
    draining as many no-op tasks, for each worker count in ``e2e_workers``."""
    sizes = bench.sizes
    keys_per_message = _relay_keys_per_message(sizes)
    configs: dict[str, Any] = {}
    peaks: dict[str, dict] = {}
    with end_to_end_rig(bench, keys_per_message) as rig:
        for workers in sizes.e2e_workers:
            rounds, round_peaks = [], []
            for round_ in range(sizes.e2e_rounds):
                record, peak_rss_mib = rig.one_round(workers, round_)
                rounds.append(record)
                round_peaks.append(peak_rss_mib)
            configs[f"{workers} worker process(es)"] = summary_of_rounds(rounds)
            peaks[f"{workers}"] = peaks_across(round_peaks)
    return _report_end_to_end(bench, configs, peaks, keys_per_message)


def _relay_keys_per_message(sizes: Sizes) -> int:
    # 0: taskhook's default; --set e2e_keys_per_message=1 measures one key per message.
    return sizes.e2e_keys_per_message or Settings.model_fields["relay_keys_per_message"].default


def _report_end_to_end(
    bench: Bench, configs: dict[str, Any], peaks: dict[str, dict], keys_per_message: int
) -> dict[str, Any]:
    """The result and its chart: each worker count's two drain rates, and the goals."""
    n = bench.sizes.e2e_deliveries
    rows = drain_rows(configs)
    result = {
        "deliveries": n,
        "worker_shape": _worker_shape(keys_per_message),
        "configs": configs,
        "peak_rss_mib": peaks,
        "goals": {
            f"drain >= 0.5x no-op, {label}": config["ratio_vs_noop"] >= 0.5
            for label, config in configs.items()
        }
        | settled_goals(configs),
    }
    return bench.finish(
        result,
        rows,
        f"End to end: {n} deliveries drained vs {n} no-op tasks",
        rate_label="deliveries or tasks per s",
    )


# --- 3. redelivery storm ------------------------------------------------------------------------


def storm(bench: Bench) -> dict[str, Any]:
    """The duplicate path against the new path, then a storm of every delivery
    three times over, shuffled, with the workers running."""
    procs = bench.processes
    redis_url = procs.redis()
    with throwaway_database() as database:
        taskhook.prepare(database)
        env = taskhook.environment(database, redis_url)
        _, url = procs.uvicorn("taskhook", "ingest.app:app", env)
        watcher = psycopg.connect(libpq_url(database), autocommit=True)
        compare = _duplicate_vs_new_rounds(bench, url, database, redis_url)
        run = _redelivery_storm(bench, url, database, redis_url, env, watcher)
        watcher.close()
    return _report_storm(bench, compare, run)


def _duplicate_vs_new_rounds(bench: Bench, url: str, database: str, redis_url: str) -> list:
    """Per round: the same deliveries posted new, then again as duplicates."""
    sizes = bench.sizes
    compare = []
    for round_ in range(sizes.storm_rounds):
        flush(redis_url)
        taskhook.reset(database)
        tag = taskhook.tag(f"compare-{round_}")
        new = bench.load(url, tag=tag, requests=sizes.storm_compare, concurrency=sizes.concurrency)
        again = bench.load(
            url, tag=tag, requests=sizes.storm_compare, concurrency=sizes.concurrency
        )
        compare.append(
            {
                "new": new,
                "duplicate": again,
                "ratio": report.ratio(again["throughput_rps"], new["throughput_rps"]),
            }
        )
        bench.say(f"  new {new['throughput_rps']}/s, duplicate {again['throughput_rps']}/s")
    return compare


@dataclass(frozen=True)
class _StormRun:
    """What the storm posted, how long until every delivery settled, and what it left."""

    posted: dict[str, Any]
    posts: int
    elapsed_s: float
    counts: dict[str, Any]
    relay_published: float


def _redelivery_storm(
    bench: Bench,
    url: str,
    database: str,
    redis_url: str,
    env: dict[str, str],
    watcher: psycopg.Connection,
) -> _StormRun:
    """Every delivery three times, shuffled, with a worker running, until all settle."""
    procs, n = bench.processes, bench.sizes.storm_deliveries
    flush(redis_url)
    taskhook.reset(database)
    published_before = taskhook.relay_published(url)
    workers = procs.celery_worker("taskhook", "worker", env)
    order = [index for index in range(n) for _ in range(3)]
    random.Random(6).shuffle(order)
    started = time.monotonic()
    posted = bench.load(url, tag=taskhook.tag("storm"), order=order, concurrency=64)
    wait_until(
        lambda: taskhook.finished_count(watcher) >= n,
        timeout=1800,
        what="the storm to settle",
        every=0.1,
    )
    elapsed = time.monotonic() - started
    time.sleep(1.0)  # anything a duplicate might still have set off
    counts = taskhook.outcome_counts(database)
    published = taskhook.relay_published(url) - published_before
    procs.stop(workers)
    return _StormRun(posted, len(order), elapsed, counts, published)


def _storm_exact(n: int, run: _StormRun) -> bool:
    """Exactly one task, one create, one claim and one published key per
    delivery; one ``queued`` answer each, and ``duplicate`` for the rest."""
    counts, answers = run.counts, run.posted["by_answer"]
    return (
        counts["tasks"] == n
        and counts["distinct_external_ids"] == n
        and counts["deliveries_by_outcome"].get("created") == n
        and counts["claims_total"] == n
        and run.relay_published == n
        and answers.get("queued", {}).get("count") == n
        and answers.get("duplicate", {}).get("count") == 2 * n
    )


def _report_storm(bench: Bench, compare: list, run: _StormRun) -> dict[str, Any]:
    """The result and its chart: both paths' rates, the storm's, and the goals."""
    n, posted = bench.sizes.storm_deliveries, run.posted
    ratio = statistics.median(entry["ratio"] for entry in compare)
    rows = [
        _row("new deliveries\n(closed loop)", [entry["new"] for entry in compare]),
        _row("duplicates\n(closed loop)", [entry["duplicate"] for entry in compare]),
        {
            "label": "storm: posts\nanswered",
            "rate": posted["throughput_rps"],
            **{k: posted["latency"][k] for k in ("p50_ms", "p95_ms", "p99_ms")},
        },
        {"label": "storm: deliveries\nsettled", "rate": round(n / run.elapsed_s, 1)},
    ]
    kept = ("throughput_rps", "completed", "errors", "error_kinds", "latency", "by_answer")
    result = {
        "deliveries": n,
        "posts": run.posts,
        "storm": {
            "posted": {key: posted[key] for key in kept},
            "elapsed_to_settled_s": round(run.elapsed_s, 3),
            "relay_published": run.relay_published,
            "counts": run.counts,
        },
        "duplicate_vs_new": {"rounds": compare, "ratio_median": ratio},
        "goals": {
            "exactly one task and one create per delivery": _storm_exact(n, run),
            "duplicate path >= 1.5x new path": ratio >= 1.5,
        },
    }
    return bench.finish(result, rows, f"Redelivery storm: {n} deliveries x 3", rate_label="per s")


# --- 4. scale ------------------------------------------------------------------------------------


def _time_creates(database: str, count: int, prefix: str) -> list[float]:
    """``count`` creates of new external ids through ``models.tasks.create_task``, one
    session each, as a worker makes them; the latency of each."""
    from models.access import Caller
    from models.db import make_engine, make_session_factory, session_scope
    from models.tasks import NewTask, create_task

    engine = make_engine(database)
    sessions = make_session_factory(engine)
    with session_scope(sessions) as session:
        workspace_id = session.execute(text("SELECT id FROM workspaces")).scalar_one()
    caller = Caller.trusted("bench")
    latencies = []
    for index in range(count):
        new = NewTask(
            title=f"scale {prefix} {index}", external_id=f"gh-issue/scale/{prefix}#{index}"
        )
        started = time.perf_counter()
        with session_scope(sessions) as session:
            create_task(session=session, caller=caller, workspace_id=workspace_id, new=new)
        latencies.append(time.perf_counter() - started)
    engine.dispose()
    return latencies


def scale(bench: Bench) -> dict[str, Any]:
    from bench.loadgen import percentiles

    sizes, procs = bench.sizes, bench.processes
    redis_url = procs.redis()
    with contextlib.ExitStack() as stack:
        databases = {}
        loaded = {}
        for rows in sizes.scale_sizes:
            database = stack.enter_context(throwaway_database())
            taskhook.prepare(database)
            loaded[rows] = round(taskhook.bulk_load(database, rows), 1)
            databases[rows] = database
            bench.say(f"  bulk-loaded {rows} tasks and {rows} inbox rows in {loaded[rows]} s")
        creates: dict[int, list[float]] = {rows: [] for rows in databases}
        for round_ in range(sizes.scale_rounds):
            for rows, database in databases.items():
                creates[rows] += _time_creates(database, sizes.scale_creates, f"{round_}")
        servers = {}
        for rows, database in databases.items():
            _, servers[rows] = procs.uvicorn(
                f"taskhook-{rows}", "ingest.app:app", taskhook.environment(database, redis_url)
            )
            bench.load(servers[rows], tag=taskhook.tag(f"warm-{rows}"), duration=1.0, concurrency=8)
        ingress_runs: dict[int, list[dict]] = {rows: [] for rows in databases}
        for round_ in range(sizes.scale_rounds):
            for rows, url in servers.items():
                flush(redis_url)
                ingress_runs[rows].append(
                    bench.load(
                        url,
                        tag=taskhook.tag(f"scale-{rows}-{round_}"),
                        duration=sizes.scale_ingress_seconds,
                        concurrency=sizes.concurrency,
                    )
                )

    smallest, largest = sizes.scale_sizes[0], sizes.scale_sizes[-1]
    create_stats = {rows: percentiles(samples) for rows, samples in creates.items()}
    ingress_stats = {
        rows: report.median([run["throughput_rps"] for run in runs])
        for rows, runs in ingress_runs.items()
    }
    create_ratio = report.ratio(create_stats[largest]["mean_ms"], create_stats[smallest]["mean_ms"])
    create_p50_ratio = report.ratio(
        create_stats[largest]["p50_ms"], create_stats[smallest]["p50_ms"]
    )
    ingress_ratio = report.ratio(ingress_stats[smallest], ingress_stats[largest])
    rows = [
        {
            "label": f"create_task\n{rows:,} tasks",
            "rate": round(1000 / stats["mean_ms"], 1),
            **{k: stats[k] for k in ("p50_ms", "p95_ms", "p99_ms")},
        }
        for rows, stats in create_stats.items()
    ] + [_row(f"ingress\n{rows:,} inbox rows", runs) for rows, runs in ingress_runs.items()]
    result = {
        "bulk_load_seconds": loaded,
        "create_latency": {
            str(rows): {"creates": len(creates[rows]), **stats}
            for rows, stats in create_stats.items()
        },
        "ingress": {
            str(rows): {"throughput_rps_median": ingress_stats[rows], "runs": runs}
            for rows, runs in ingress_runs.items()
        },
        "ratios": {
            f"create mean latency {largest} / {smallest}": create_ratio,
            f"create p50 latency {largest} / {smallest}": create_p50_ratio,
            f"ingress time per delivery {largest} / {smallest}": ingress_ratio,
        },
        "goals": {
            f"create latency at {largest:,} within 1.2x of {smallest:,}": create_ratio <= 1.2,
            f"ingress at {largest:,} inbox rows within 1.2x of {smallest:,}": ingress_ratio <= 1.2,
        },
    }
    return bench.finish(
        result,
        rows,
        "Scale: create_task and the ingress over bulk-loaded tables",
        rate_label="creates or answers per s",
    )


# --- 5. memory ---------------------------------------------------------------------------


def memory(bench: Bench) -> dict[str, Any]:
    sizes, procs = bench.sizes, bench.processes
    n = sizes.memory_deliveries
    redis_url = procs.redis()
    with throwaway_database() as database:
        taskhook.prepare(database)
        env = taskhook.environment(database, redis_url)
        ingress_process, url = procs.uvicorn("taskhook", "ingest.app:app", env)
        workers = procs.celery_worker("taskhook", "worker", env)
        # A short run (the smoke size drains in a second or two) is sampled
        # more often, so that each half of it has samples to compare.
        every = 0.1 if n < 10_000 else 1.0
        sampler = Sampler({"ingress": ingress_process, "worker": workers}, every=every)
        sampler.start()
        watcher = psycopg.connect(libpq_url(database), autocommit=True)
        started = time.monotonic()
        posted = bench.load(
            url, tag=taskhook.tag("memory"), requests=n, concurrency=sizes.concurrency
        )
        wait_until(
            lambda: taskhook.finished_count(watcher) >= n,
            timeout=3600,
            what="every delivery done",
            every=0.5,
        )
        ended = time.monotonic()
        sampler.stop()
        counts = taskhook.outcome_counts(database)
        watcher.close()
    halves = sampler.halves(started, ended)
    worst = max((entry["growth"] for entry in halves.values()), default=0.0)
    timeline = [
        {
            "t_s": round(at - started, 1),
            **{label: round(rss / 2**20, 1) for label, rss in sample.items()},
        }
        for at, sample in sampler.samples
    ]
    rows = [
        {"label": f"{label}\n1st half", "rate": entry["first_half_peak_mib"]}
        for label, entry in halves.items()
    ] + [
        {"label": f"{label}\n2nd half", "rate": entry["second_half_peak_mib"]}
        for label, entry in halves.items()
    ]
    rows.sort(key=lambda row: row["label"])
    result = {
        "deliveries": n,
        "elapsed_s": round(ended - started, 1),
        "ingress_post": {key: posted[key] for key in ("throughput_rps", "completed", "errors")},
        "peak_rss_mib": sampler.peaks(),
        "halves": halves,
        "worst_growth": worst,
        "counts": counts,
        "timeline": timeline,
        "goals": {"RSS growth <= 10% between the halves": worst <= 0.10},
    }
    return bench.finish(
        result,
        rows,
        f"Memory: peak RSS over {n} deliveries, first vs second half",
        rate_label="peak RSS (MiB)",
    )


BENCHMARKS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "ingress": ingress,
    "e2e": end_to_end,
    "storm": storm,
    "scale": scale,
    "memory": memory,
    "sqlite": sqlite,
    "catch-up": catch_up,
    "brokers": brokers,
    "retries": retries,
    "prune": prune,
    "messages": messages,
    "workspaces": workspaces,
    "latency": latency,
    "streams": streams,
    "aliases": aliases,
    "fairness": fairness,
    "tracing": tracing,
}
