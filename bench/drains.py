"""Worker processes draining a queue, timed and counted, and the end-to-end rig.

``bench e2e``, ``bench messages`` and ``bench prune`` each drain deliveries
(or Celery's no-op tasks) with worker processes they start here; ``e2e`` and
``messages`` share the rig that posts the deliveries through one ingress.
Shared by the benchmarks, so it lives below them (``bench.suites`` registers
them all and imports this module, never the other way round).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import redis
from celery import Celery

from bench import report, taskhook
from bench.noop import NOOP
from bench.processes import (
    BenchError,
    Process,
    Processes,
    libpq_url,
    server_cpu_seconds,
    throwaway_database,
    wait_until,
)
from models.broker.messages import DELIVERIES_QUEUE, DELIVERY_QUEUES
from models.settings import Settings
from worker.celery_app import celery_config


def flush(redis_url: str) -> None:
    """Empty the benchmark's Redis database: the broker starts each drain bare."""
    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        client.flushdb()


class Sampler(threading.Thread):
    """Samples the RSS of processes every ``every`` s, with a timestamp."""

    def __init__(self, processes: dict[str, Process], every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.processes, self.every = processes, every
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._done = threading.Event()
        self._lock = threading.Lock()

    def watch(self, name: str, process: Process) -> None:
        """Sample ``process`` too, from now on (the sampler may be running)."""
        with self._lock:
            self.processes[name] = process

    def run(self) -> None:
        while not self._done.is_set():
            now = time.monotonic()
            sample = {}
            with self._lock:
                watched = list(self.processes.items())
            for name, process in watched:
                for pid, rss in process.rss().items():
                    label = name if pid == process.pid else f"{name}/child-{pid}"
                    sample[label] = rss
            self.samples.append((now, sample))
            self._done.wait(self.every)

    def stop(self) -> None:
        self._done.set()
        self.join(5)

    def peaks(self) -> dict[str, float]:
        """Peak RSS in MiB, by process."""
        peaks: dict[str, int] = {}
        for _, sample in self.samples:
            for label, rss in sample.items():
                peaks[label] = max(peaks.get(label, 0), rss)
        return {label: round(rss / 2**20, 1) for label, rss in peaks.items()}

    def halves(self, start: float, end: float) -> dict[str, dict[str, float]]:
        """Peak and mean RSS (MiB) in the first and second half of [start, end]."""
        middle = (start + end) / 2
        halves: dict[str, dict[str, list[int]]] = {}
        for at, sample in self.samples:
            if not start <= at <= end:
                continue
            half = "first" if at < middle else "second"
            for label, rss in sample.items():
                halves.setdefault(label, {"first": [], "second": []})[half].append(rss)
        out = {}
        for label, parts in halves.items():
            if not parts["first"] or not parts["second"]:
                continue
            first, second = max(parts["first"]), max(parts["second"])
            out[label] = {
                "first_half_peak_mib": round(first / 2**20, 1),
                "second_half_peak_mib": round(second / 2**20, 1),
                "first_half_mean_mib": round(statistics.mean(parts["first"]) / 2**20, 1),
                "second_half_mean_mib": round(statistics.mean(parts["second"]) / 2**20, 1),
                "growth": round(second / first - 1, 4),
            }
        return out


def celery_client(redis_url: str) -> Celery:
    """A Celery app that sends as taskhook's processes do, through ``redis_url``."""
    app = Celery("bench-noop-client", set_as_current=False)
    app.conf.update(celery_config(Settings(broker_url=redis_url, database_url="sqlite://")))
    return app


def enqueue_noops(redis_url: str, count: int) -> None:
    enqueue(redis_url, NOOP, ([key] for key in range(count)))


def enqueue(redis_url: str, task: str, arguments: Iterable[list]) -> None:
    """One message of ``task`` on the deliveries queue for each list of arguments."""
    app = celery_client(redis_url)
    with app.producer_or_acquire() as producer:
        for args in arguments:
            app.send_task(task, args=args, queue=DELIVERIES_QUEUE, producer=producer)
    app.close()


def queue_length(client: redis.Redis) -> int:
    """Messages waiting on the deliveries queue, in either lane."""
    return sum(client.llen(queue) for queue in DELIVERY_QUEUES)


class Starter:
    """Starts ``count`` Celery worker processes when called (so a drain can
    time from its first message), and stops them by pid afterwards."""

    def __init__(
        self,
        procs: Processes,
        name: str,
        app: str,
        env: dict[str, str],
        count: int,
        sampler: Sampler | None = None,
    ) -> None:
        self.procs, self.name, self.app, self.env = procs, name, app, env
        self.count, self.sampler = count, sampler
        self.started: list[Process] = []

    def __call__(self) -> None:
        # All of them at once: a process that started a second late would
        # count its start-up against the shorter of the two drains.
        for index in range(self.count):
            name = f"{self.name}-{index}"
            process = self.procs.celery_worker(name, self.app, self.env, wait=False)
            self.started.append(process)
            if self.sampler is not None:
                self.sampler.watch(name, process)
        for process in self.started:
            self.procs.wait_ready(process)

    def cpu_seconds(self) -> float:
        return sum(process.cpu_seconds() for process in self.started)

    def stop(self) -> None:
        for process in self.started:
            self.procs.stop(process)


def _cpu_now(workers: Starter) -> dict[str, float]:
    return {
        "workers": workers.cpu_seconds(),
        "postgres": server_cpu_seconds("postgres"),
        "redis": server_cpu_seconds("redis-server"),
    }


def drain(
    workers: Starter, deliveries: int, messages: int, redis_url: str, done: Callable[[], bool]
) -> dict:
    """Start the workers on a queue holding ``messages`` messages for
    ``deliveries`` deliveries (the no-op's: one task each); time from the first
    message taken to ``done``, and count the CPU each side spent per delivery
    meanwhile (from the workers' ready, so their start-up is not counted)."""
    client = redis.Redis.from_url(redis_url)
    first_taken: list[float] = []

    def watch() -> None:
        while not first_taken:
            if queue_length(client) < messages:
                first_taken.append(time.monotonic())
                return
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    workers()
    cpu_before = _cpu_now(workers)
    wait_until(done, timeout=1800, what="the queue to drain", every=0.05)
    finished = time.monotonic()
    cpu_after = _cpu_now(workers)
    watcher.join(5)
    client.close()
    if not first_taken:
        raise BenchError("never saw the queue shrink")
    elapsed = finished - first_taken[0]
    return {
        "deliveries": deliveries,
        "messages": messages,
        "elapsed_s": round(elapsed, 3),
        "rate_per_s": round(deliveries / elapsed, 1),
        "cpu_ms_per_delivery": {
            side: round(1000 * (cpu_after[side] - cpu_before[side]) / deliveries, 3)
            for side in cpu_before
        },
    }


@dataclass
class EndToEndRig:
    """What every round of the end-to-end benchmark runs on: one ingress on a
    throwaway database, a private Redis as the broker, and a connection that
    watches the inbox."""

    bench: Any
    database: str
    redis_url: str
    client: redis.Redis
    env: dict[str, str]
    ingress_process: Process
    url: str
    watcher: psycopg.Connection

    @property
    def deliveries(self) -> int:
        return self.bench.sizes.e2e_deliveries

    def one_round(self, workers: int, round_: int) -> tuple[dict[str, Any], dict[str, float]]:
        """Both drains with ``workers`` processes, and their ratio; with the
        peak RSS of taskhook's processes meanwhile."""
        # The order alternates by round, the ratio is taken per round and the
        # median reported: a burst of load from a neighbour then hits one
        # round of both rather than one side of the comparison.
        if round_ % 2 == 0:
            noop = self.drain_noops(workers)
            run = self.drain_deliveries(workers)
        else:
            run = self.drain_deliveries(workers)
            noop = self.drain_noops(workers)
        ratio = report.ratio(run["drain"]["rate_per_s"], noop["rate_per_s"])
        self.bench.say(f"  round {round_}, {workers} process(es): {ratio}x no-op")
        record = {
            "noop_drain": noop,
            "taskhook_drain": run["drain"],
            "ratio": ratio,
            "ingress_post": run["ingress_post"],
            "counts": run["counts"],
            "exact": run["exact"],
        }
        return record, run["peak_rss_mib"]

    def drain_noops(self, workers: int) -> dict:
        """The baseline: Celery draining n no-op tasks with taskhook's settings."""
        n = self.deliveries
        flush(self.redis_url)
        enqueue_noops(self.redis_url, n)
        noop_workers = Starter(
            self.bench.processes, f"noop-p{workers}", "bench.noop", self.env, workers
        )
        noop = drain(noop_workers, n, n, self.redis_url, self.noop_done)
        noop_workers.stop()
        self.bench.say(
            f"  no-op drain, {workers} process(es): {noop['rate_per_s']}/s;"
            f" CPU ms per task {noop['cpu_ms_per_delivery']}"
        )
        return noop

    def drain_deliveries(self, workers: int) -> dict:
        """taskhook: n deliveries through the ingress (no worker yet), then the drain."""
        n = self.deliveries
        flush(self.redis_url)
        taskhook.reset(self.database)
        posted = self.post_deliveries(workers)
        messages = queue_length(self.client)
        sampler = Sampler({"ingress": self.ingress_process})
        sampler.start()
        taskhook_workers = Starter(
            self.bench.processes,
            f"taskhook-p{workers}",
            "worker",
            self.env,
            workers,
            sampler=sampler,
        )
        drained = drain(taskhook_workers, n, messages, self.redis_url, self.all_done)
        sampler.stop()
        counts = taskhook.outcome_counts(self.database)
        taskhook_workers.stop()
        self.bench.say(
            f"  taskhook drain, {workers} process(es): {drained['rate_per_s']}/s;"
            f" {messages} messages; CPU ms per delivery {drained['cpu_ms_per_delivery']};"
            f" ingress {posted['throughput_rps']}/s"
        )
        return {
            "drain": drained,
            "peak_rss_mib": sampler.peaks(),
            "ingress_post": {
                key: posted[key] for key in ("throughput_rps", "completed", "errors", "latency")
            },
            "counts": counts,
            "exact": _every_delivery_done(counts, n),
        }

    def post_deliveries(self, workers: int) -> dict:
        """n deliveries answered by the ingress, and every key published by its relay."""
        n = self.deliveries
        posted = self.bench.load(
            self.url,
            tag=taskhook.tag(f"e2e-{workers}"),
            requests=n,
            concurrency=self.bench.sizes.concurrency,
        )
        if posted["completed"] != n:
            raise BenchError(
                f"the ingress answered {posted['completed']} of {n}: {posted['error_kinds']}"
            )
        wait_until(
            lambda: taskhook.relay_published(self.url) >= n,
            timeout=120,
            what="the relay to publish every key",
        )
        return posted

    def noop_done(self) -> bool:
        return queue_length(self.client) == 0 and self.client.hlen("unacked") == 0

    def all_done(self) -> bool:
        # Counting the inbox costs the database CPU the workers need, so
        # it is counted only once the broker is empty (the no-ops' test).
        return self.noop_done() and taskhook.finished_count(self.watcher) >= self.deliveries


def _every_delivery_done(counts: dict[str, Any], n: int) -> bool:
    """Exactly one settled task per delivery, and every inbox row done."""
    return (
        counts["tasks"] == n
        and counts["tasks_settled"] == n
        and counts["deliveries_by_status"].get("done") == n
    )


@contextlib.contextmanager
def end_to_end_rig(bench: Any, keys_per_message: int, **extra_env: str) -> Iterator[EndToEndRig]:
    """The ingress started on a throwaway database, its relay putting
    ``keys_per_message`` keys in each message, with ``extra_env`` for it and
    its workers (``bench tracing``'s OTEL_* variables); all of it gone afterwards."""
    procs = bench.processes
    redis_url = procs.redis()
    with (
        contextlib.closing(redis.Redis.from_url(redis_url)) as client,
        throwaway_database() as database,
    ):
        taskhook.prepare(database)
        env = taskhook.environment(
            database,
            redis_url,
            TASKHOOK_RELAY_KEYS_PER_MESSAGE=str(keys_per_message),
            **extra_env,
        )
        ingress_process, url = procs.uvicorn("taskhook", "ingest.app:app", env)
        with psycopg.connect(libpq_url(database), autocommit=True) as watcher:
            yield EndToEndRig(
                bench, database, redis_url, client, env, ingress_process, url, watcher
            )


def summary_of_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One worker count's rounds: the median of each rate, CPU cost and ratio,
    with every round kept as measured."""
    return {
        "noop_drain": {
            "rate_per_s": report.median([r["noop_drain"]["rate_per_s"] for r in rounds])
        },
        "taskhook_drain": {
            "rate_per_s": report.median([r["taskhook_drain"]["rate_per_s"] for r in rounds]),
            "messages": report.median([r["taskhook_drain"]["messages"] for r in rounds]),
        },
        "cpu_ms_per_delivery": {
            side: {
                part: round(
                    statistics.median(r[key]["cpu_ms_per_delivery"][part] for r in rounds),
                    3,
                )
                for part in ("workers", "postgres", "redis")
            }
            for side, key in (("noop", "noop_drain"), ("taskhook", "taskhook_drain"))
        },
        "ratio_vs_noop": statistics.median(r["ratio"] for r in rounds),
        "ratios_per_round": [r["ratio"] for r in rounds],
        "rounds": rounds,
        "counts": rounds[-1]["counts"],
        "exact": all(r["exact"] for r in rounds),
    }


def drain_rows(configs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The chart's rows of drains summarized by :func:`summary_of_rounds`,
    by label: the no-op's rate, then taskhook's."""
    rows = []
    for label, config in configs.items():
        rows.append({"label": f"no-op drain\n{label}", "rate": config["noop_drain"]["rate_per_s"]})
        rows.append(
            {"label": f"taskhook drain\n{label}", "rate": config["taskhook_drain"]["rate_per_s"]}
        )
    return rows


def settled_goals(configs: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """The goal every drain has besides its rate, by label: every task settled
    once and every inbox row done."""
    return {
        f"every task settled, every row done, {label}": config["exact"]
        for label, config in configs.items()
    }


def peaks_across(round_peaks: list[dict[str, float]]) -> dict[str, float]:
    """The peak RSS of each process across every round."""
    merged: dict[str, float] = {}
    for peaks in round_peaks:
        for name, peak in peaks.items():
            merged[name] = max(merged.get(name, 0.0), peak)
    return merged
