"""``python -m bench latency``: how long a delivery takes to become a task, as a sender feels it.

Two stacks run side by side on this machine, each with one ingress process, one
worker process (Celery's threads pool, taskhook's default concurrency), a
private ``redis-server`` as its broker, and the same throwaway PostgreSQL
database:

- **taskhook**: its ingress (``ingest.app:app``) and its worker, as ``bench e2e``
  starts them;
- **the stock stack** (``bench.stock``): the tutorial receiver, ``.delay(body)``,
  and a plain Celery task doing create-if-absent with the SQLAlchemy ORM.

**Latency.** The load generator posts deliveries open-loop at each rate of
``latency_rates`` for ``latency_seconds``; after the drain, each delivery's
latency is its task's settled time minus its received time, read from the rows.
For taskhook: ``tasks.external_id_settled_at - deliveries.received_at`` (the
contract's "settled": the create's required work done); for the stock stack:
``stock_tasks.created_at - stock_tasks.received_at``. Every one of these stamps
is Python's clock (``datetime.now(UTC)`` / ``time.time()``) on this one host,
never PostgreSQL's ``now()``. For taskhook the rows also split the time in two:
received -> claimed (``tasks.created_at``: on the fast path, the claim
statement's own time; the answer, the relay's linger, the broker, the worker's
pickup and the wait behind earlier keys of the same message all fall here) and
claimed -> settled (the worker's statements). No publish time is on a row. The
rates run one stack after the other, the first stack alternating by rate.

**Highest flat-backlog rate.** For each stack, steps of ``latency_ramp_seconds``
at one rate each: doubling from ``latency_ramp_start`` until a step is not flat,
then bisecting (geometrically) between the last flat rate and the first that
was not, until they are within a factor ``latency_ramp_precision``. The backlog
at time t is the deliveries received by t minus the tasks settled by t (both
from the rows, so nothing polls the database during a step). A step is **flat**
when every request was answered without error and the median backlog over its
last quarter is at most the median over its second quarter plus a bound of
``max(5, rate x 0.1 s)`` -- a backlog growing by more than a tenth of a second's
arrivals in half a step means the worker falls behind -- and that median is at
most a quarter second's arrivals (``FLAT_QUEUE_SECONDS``): a steady queue
longer than that is a wait every sender feels (by Little's law, the backlog
over the rate is the time a delivery spends in it), and a step that merely
held on to a queue it built early is not one the stack keeps up with. The two
ramps run in lockstep, a step of one then a step of the other, so that a
machine whose speed drifts over the minutes they take drifts for both alike.
Each step starts on an empty broker and inbox (a step that did not drain
within its timeout has its worker restarted on a flushed broker).

Reported: p50/p95/p99/max per rate and stack, taskhook's stages, the answer's
latency as the load generator saw it, the worker and ingress CPU per delivery,
each ramp step, and the goals, each against the stock stack in the same run:
p99 at 100/s at most the stock stack's + 5 ms; p99 at 300/s at most a tenth
of the stock stack's (and the older absolute goal, under 100 ms); no POST
errors from taskhook at 600/s; taskhook's highest flat rate at least 2x the
stock stack's.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import statistics
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import redis

from bench import stock, taskhook
from bench.drains import Starter, drain, enqueue_noops, queue_length
from bench.loadgen import percentiles
from bench.processes import BenchError, Process, libpq_url, throwaway_database

#: How long a run may take to drain after its last request: at least the
#: floor, and this many seconds per second of load. A delivery whose task did
#: not settle by then counts as infinitely late in the percentiles (``None``).
DRAIN_TIMEOUT_FLOOR = 20.0
DRAIN_TIMEOUT_PER_SECOND = 3.0
#: The warm-up: a burst that keeps every worker thread busy (each opens its
#: connection and prepares its statements, which psycopg does at a
#: statement's sixth run), then a trickle. Warmed with the trickle alone, the
#: first measured run paid for the threads it never reached (issue 39).
WARM_UP = ((300, 1.0), (50, 1.0))
#: A ramp's step is flat only if its backlog holds at most this many seconds'
#: arrivals (see the module's docstring).
FLAT_QUEUE_SECONDS = 0.25
#: The no-op tasks the machine's speed is measured by (fewer at the smoke size).
NOOP_DELIVERIES = 5_000

_TASKHOOK_TIMES = """
SELECT extract(epoch FROM d.received_at), extract(epoch FROM t.created_at),
       extract(epoch FROM t.external_id_settled_at)
FROM deliveries d LEFT JOIN tasks t ON t.id = d.task_id
WHERE d.received_at >= to_timestamp(%s)
"""
_STOCK_TIMES = """
SELECT extract(epoch FROM received_at), NULL, extract(epoch FROM created_at)
FROM stock_tasks WHERE received_at >= to_timestamp(%s)
"""


@dataclass
class Stack:
    """One stack under load: its ingress, its worker, and where its rows are."""

    name: str
    url: str
    ingress: Process
    redis_url: str
    start_worker: Callable[[], Process]
    times_sql: str
    clear: Callable[[psycopg.Connection], None]
    worker: Process | None = None
    #: Issue numbers posted so far: every run posts issues no earlier run did.
    numbers_used: int = 0

    def cpu_seconds(self) -> dict[str, float]:
        assert self.worker is not None
        return {"ingress": self.ingress.cpu_seconds(), "worker": self.worker.cpu_seconds()}


def latency(bench: Any) -> dict[str, Any]:
    """The machine's speed that day; both stacks at each rate, the first
    alternating by rate; then their ramps, in lockstep."""
    sizes = bench.sizes
    speed = _machine_speed(bench)
    with _stacks(bench) as (stacks, watcher):
        for stack in stacks:
            # The first deliveries pay for connections, caches and imports: not measured.
            for rate, seconds in WARM_UP:  # no faster than the runs (the smoke size's)
                _run(bench, stack, watcher, min(rate, max(sizes.latency_rates)), seconds)
        runs: dict[str, dict[str, Any]] = {stack.name: {} for stack in stacks}
        for index, rate in enumerate(sizes.latency_rates):
            order = stacks if index % 2 == 0 else stacks[::-1]
            for stack in order:
                run = _run(bench, stack, watcher, rate, sizes.latency_seconds)
                runs[stack.name][str(rate)] = run
                bench.say(f"  {stack.name} at {rate}/s: {_brief(run)}")
        ramps = _ramps(bench, stacks, watcher)
    return _report(bench, runs, ramps, speed)


def _machine_speed(bench: Any) -> dict[str, Any]:
    """How fast this machine is today: one Celery worker process (taskhook's
    settings, threads) draining no-op tasks from a private Redis, as ``bench
    e2e``'s baseline does. The latencies of runs on different days compare
    only in its light."""
    redis_url = bench.processes.redis()
    count = min(NOOP_DELIVERIES, bench.sizes.e2e_deliveries)
    enqueue_noops(redis_url, count)
    env = taskhook.environment("sqlite://", redis_url)
    workers = Starter(bench.processes, "speed-noop", "bench.noop", env, 1)
    client = redis.Redis.from_url(redis_url)
    try:
        drained = drain(
            workers,
            count,
            count,
            redis_url,
            lambda: queue_length(client) == 0 and client.hlen("unacked") == 0,
        )
    finally:
        workers.stop()
        client.close()
    bench.say(f"  machine speed: no-op drain {drained['rate_per_s']}/s (1 process)")
    return {"noop_drain_per_s": drained["rate_per_s"], "noop_tasks": count}


@contextlib.contextmanager
def _stacks(bench: Any) -> Iterator[tuple[list[Stack], psycopg.Connection]]:
    """Both stacks started on one throwaway database, each on a private Redis,
    and a connection that reads their rows."""
    procs = bench.processes
    taskhook_redis, stock_redis = procs.redis(), procs.redis()
    with throwaway_database() as database:
        taskhook.prepare(database)
        stock.create_table(database)
        env = taskhook.environment(database, taskhook_redis)
        ingress, url = procs.uvicorn("taskhook", "ingest.app:app", env)
        stock_env = taskhook.environment(
            database,
            stock_redis,
            BENCH_SECRET=taskhook.SECRET,
            BENCH_BROKER_URL=stock_redis,
            BENCH_DATABASE_URL=database,
        )
        stock_ingress, stock_url = procs.uvicorn(
            "stock", "bench.stock:stock_app", stock_env, factory=True
        )
        stacks = [
            Stack(
                "taskhook",
                url,
                ingress,
                taskhook_redis,
                lambda: procs.celery_worker("taskhook-worker", "worker", env),
                _TASKHOOK_TIMES,
                lambda _: taskhook.reset(database),
            ),
            Stack(
                "stock",
                stock_url,
                stock_ingress,
                stock_redis,
                lambda: procs.celery_worker(
                    "stock-worker", "bench.stock", stock_env, queues="stock"
                ),
                _STOCK_TIMES,
                lambda connection: connection.execute("TRUNCATE stock_tasks"),
            ),
        ]
        for stack in stacks:
            stack.worker = stack.start_worker()
        with psycopg.connect(libpq_url(database), autocommit=True) as watcher:
            yield stacks, watcher


def _run(
    bench: Any, stack: Stack, watcher: psycopg.Connection, rate: int, seconds: float
) -> dict[str, Any]:
    """``rate`` deliveries a second for ``seconds`` into ``stack``, drained; the latencies."""
    stack.clear(watcher)
    started = time.time()
    cpu_before = stack.cpu_seconds()
    posted = bench.load(
        stack.url,
        tag=f"latency-{stack.name}-{rate}-{int(started * 1000)}",
        mode="open",
        rate=rate,
        duration=seconds,
        # Issues no earlier run posted: a stock task still running from an
        # earlier run could otherwise find this run's issue already created.
        first_number=stack.numbers_used + 1,
    )
    stack.numbers_used += posted["sent"]
    answered = posted["completed"]
    timeout = max(DRAIN_TIMEOUT_FLOOR, DRAIN_TIMEOUT_PER_SECOND * seconds)
    drained = _drain(stack, watcher, started, answered, timeout=timeout)
    cpu_after = stack.cpu_seconds()
    times = watcher.execute(stack.times_sql, (started,)).fetchall()
    if not drained:
        _restart_worker(bench, stack)
    return _measured(rate, seconds, posted, times, drained, cpu_before, cpu_after)


def _drain(
    stack: Stack, watcher: psycopg.Connection, started: float, answered: int, *, timeout: float
) -> bool:
    """Wait until every answered delivery's task settled, and every stored
    row's; False if ``timeout`` passed first."""
    count = (
        "SELECT count(*), count(settled)"
        f" FROM ({stack.times_sql}) AS times(received, claimed, settled)"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert stack.worker is not None
        stack.worker.check_alive()
        rows, settled = watcher.execute(count, (started,)).fetchone()
        if settled >= answered and settled == rows:
            return True
        time.sleep(0.2)
    return False


def _restart_worker(bench: Any, stack: Stack) -> None:
    """A fresh worker on an empty broker: what the last run left must not run in the next."""
    assert stack.worker is not None
    bench.processes.stop(stack.worker)
    with contextlib.closing(redis.Redis.from_url(stack.redis_url)) as client:
        client.flushdb()
    stack.worker = stack.start_worker()


def _measured(
    rate: int,
    seconds: float,
    posted: dict[str, Any],
    times: list[tuple],
    drained: bool,
    cpu_before: dict[str, float],
    cpu_after: dict[str, float],
) -> dict[str, Any]:
    answered = posted["completed"]
    received = [float(row[0]) for row in times]
    settled = [float(row[2]) for row in times if row[2] is not None]
    latencies = [float(row[2]) - float(row[0]) for row in times if row[2] is not None]
    # Rows whose task never settled in time; for the stock stack, which has no
    # row before its task, the answered deliveries without one.
    late = max(len(times), answered) - len(latencies)
    stages = {}
    claimed = [row for row in times if row[1] is not None and row[2] is not None]
    if claimed:
        stages = {
            "received_to_claimed": percentiles([float(c) - float(r) for r, c, _ in claimed]),
            "claimed_to_settled": percentiles([float(s) - float(c) for _, c, s in claimed]),
        }
    return {
        "rate": rate,
        "seconds": seconds,
        "sent": posted["sent"],
        "answered": answered,
        "errors": posted["errors"],
        "error_kinds": posted["error_kinds"],
        "answer_latency": posted["latency"],
        "rows": len(times),
        "settled": len(latencies),
        "drained": drained,
        "not_settled_in_time": late,
        "latency": _percentiles_counting_late(latencies, late),
        "stages": stages,
        "cpu_ms_per_delivery": {
            side: round(1000 * (cpu_after[side] - cpu_before[side]) / max(answered, 1), 3)
            for side in cpu_before
        },
        "flat": _flat(rate, seconds, received, settled, posted),
    }


def _percentiles_counting_late(latencies: list[float], late: int) -> dict[str, float | None]:
    """Percentiles over every answered delivery, the ``late`` ones (never
    settled in the drain's time) as infinitely late: ``None`` where one falls."""
    measured = percentiles(latencies + [math.inf] * late)
    return {name: None if math.isinf(value) else value for name, value in measured.items()}


def _flat(
    rate: int, seconds: float, received: list[float], settled: list[float], posted: dict
) -> dict[str, Any]:
    """Whether the backlog stayed flat (see the module's docstring), and the two medians."""
    if not received:
        return {"flat": False, "why": "no rows"}
    received, settled = sorted(received), sorted(settled)
    start = received[0]

    def backlog_over(first: float, last: float) -> float:
        samples = [
            bisect.bisect_right(received, at) - bisect.bisect_right(settled, at)
            for at in _steps(start + first * seconds, start + last * seconds, 0.05)
        ]
        return statistics.median(samples)

    second_quarter, last_quarter = backlog_over(0.25, 0.5), backlog_over(0.75, 1.0)
    bound = max(5.0, rate * 0.1)
    queue_bound = max(5.0, rate * FLAT_QUEUE_SECONDS)
    answered_all = posted["errors"] == 0 and posted["completed"] == posted["sent"]
    return {
        "flat": (
            answered_all and last_quarter <= second_quarter + bound and last_quarter <= queue_bound
        ),
        "backlog_second_quarter": second_quarter,
        "backlog_last_quarter": last_quarter,
        "bound": bound,
        "queue_bound": queue_bound,
        "answered_all": answered_all,
    }


def _steps(first: float, last: float, every: float) -> list[float]:
    count = max(1, int((last - first) / every))
    return [first + index * every for index in range(count + 1)]


def _ramps(bench: Any, stacks: list[Stack], watcher: psycopg.Connection) -> dict[str, dict]:
    """Each stack's highest flat rate (:class:`_Ramp`), the stacks' steps
    taken in turn, the first of each round alternating."""
    ramps = {stack.name: _Ramp(bench.sizes) for stack in stacks}
    steps: dict[str, list[dict[str, Any]]] = {stack.name: [] for stack in stacks}
    round_ = 0
    while any(ramp.rate is not None for ramp in ramps.values()):
        for stack in stacks if round_ % 2 == 0 else stacks[::-1]:
            ramp = ramps[stack.name]
            if ramp.rate is None:
                continue
            run = _run(bench, stack, watcher, ramp.rate, bench.sizes.latency_ramp_seconds)
            steps[stack.name].append(run)
            flat = run["flat"]["flat"]
            bench.say(f"  ramp {stack.name} at {ramp.rate}/s: flat {flat}, {_brief(run)}")
            ramp.tell(flat)
        round_ += 1
    return {
        name: {
            **ramp.bracket,
            "steps": [
                {key: step[key] for key in ("rate", "answered", "errors", "latency", "flat")}
                for step in steps[name]
            ],
        }
        for name, ramp in ramps.items()
    }


class _Ramp:
    """One stack's search for its highest flat rate (:func:`_search`): the
    rate to try next (None once done), told after each step whether it was
    flat; its bracket once done."""

    def __init__(self, sizes: Any) -> None:
        self._search = _search(sizes)
        self.bracket: dict[str, Any] = {}
        self.rate: int | None = self._next(None)

    def tell(self, flat: bool) -> None:
        self.rate = self._next(flat)

    def _next(self, flat: bool | None) -> int | None:
        try:
            return next(self._search) if flat is None else self._search.send(flat)
        except StopIteration as done:
            self.bracket = done.value
            return None


def _search(sizes: Any) -> Generator[int, bool, dict[str, Any]]:
    """The rates one ramp tries, each sent back whether it was flat: doubling
    from ``latency_ramp_start``, then bisecting (geometrically) between the
    highest flat rate and the lowest that was not; its bracket."""
    highest_flat, lowest_not = 0, 0
    rate = sizes.latency_ramp_start
    while rate <= sizes.latency_ramp_max:
        if not (yield rate):
            lowest_not = rate
            break
        highest_flat, rate = rate, rate * 2
    if lowest_not and highest_flat:
        while lowest_not / highest_flat > sizes.latency_ramp_precision:
            middle = round(math.sqrt(highest_flat * lowest_not))
            if middle in (highest_flat, lowest_not):
                break
            if (yield middle):
                highest_flat = middle
            else:
                lowest_not = middle
    return {
        "highest_flat_rate": highest_flat,
        "lowest_rising_rate": lowest_not or None,
        "capped": not lowest_not,
    }


def _brief(run: dict[str, Any]) -> str:
    shown = {
        name: "late" if value is None else f"{value:.0f}" for name, value in run["latency"].items()
    }
    return (
        f"p50 {shown['p50_ms']} / p95 {shown['p95_ms']} / p99 {shown['p99_ms']} ms;"
        f" {run['settled']}/{run['answered']} settled, {run['errors']} errors"
    )


def _under(run: dict[str, Any], milliseconds: float) -> bool:
    p99 = run["latency"]["p99_ms"]
    return p99 is not None and p99 < milliseconds


def _ratio_bounds(ours: dict[str, Any], theirs: dict[str, Any]) -> list[float | None]:
    """The ratio of the highest flat rates, at its least and its most, from
    each ramp's bracket (the highest flat rate, the lowest rising one)."""

    def ratio(top: float | None, bottom: float | None) -> float | None:
        return round(top / bottom, 3) if top and bottom else None

    return [
        ratio(ours["highest_flat_rate"], theirs["lowest_rising_rate"]),
        ratio(ours["lowest_rising_rate"], theirs["highest_flat_rate"]),
    ]


def _within(runs: dict[str, dict], rate: str, bound_of: Callable[[float], float]) -> bool | None:
    """Whether taskhook's p99 at ``rate`` is at most ``bound_of(the stock
    stack's p99)`` in the same run; None when the rate was not run. A stock
    stack that never settled some (p99 None) bounds nothing: met, if taskhook's
    all settled."""
    ours, theirs = runs["taskhook"].get(rate), runs["stock"].get(rate)
    if ours is None or theirs is None:
        return None
    our_p99, their_p99 = ours["latency"]["p99_ms"], theirs["latency"]["p99_ms"]
    if our_p99 is None:
        return False
    return their_p99 is None or our_p99 <= bound_of(their_p99)


def _report(
    bench: Any, runs: dict[str, dict], ramps: dict[str, dict], speed: dict[str, Any]
) -> dict[str, Any]:
    at_300 = runs["taskhook"].get("300")
    taskhook_best = ramps["taskhook"]["highest_flat_rate"]
    stock_best = ramps["stock"]["highest_flat_rate"]
    ratio = round(taskhook_best / stock_best, 3) if stock_best else None
    # Every row stored became a settled task; a request the client gave up on
    # may still have been stored, so there can be more rows than answers.
    exact = all(
        run["settled"] == run["rows"] >= run["answered"] and run["drained"]
        for run in runs["taskhook"].values()
    )
    if not exact:
        raise BenchError(f"taskhook did not settle every delivery: {runs['taskhook']}")
    result = {
        "clock": "Python's datetime.now(UTC) / time.time() on this host, for every stamp",
        "machine_speed": speed,
        "runs": runs,
        "ramps": ramps,
        "highest_flat_rate": {
            "taskhook": taskhook_best,
            "stock": stock_best,
            "ratio": ratio,
            # What the ramps' brackets allow: the least and the most the ratio can be.
            "ratio_bounds": _ratio_bounds(ramps["taskhook"], ramps["stock"]),
        },
        "goals": {
            "p99 at 100/s at most the stock stack's + 5 ms": _within(
                runs, "100", lambda stock_p99: stock_p99 + 5.0
            ),
            "p99 at 300/s at most 0.1x the stock stack's": _within(
                runs, "300", lambda stock_p99: stock_p99 * 0.1
            ),
            "no POST errors from taskhook at 600/s": (
                runs["taskhook"]["600"]["errors"] == 0 if "600" in runs["taskhook"] else None
            ),
            "p99 under 100 ms at 300/s": _under(at_300, 100.0) if at_300 else None,
            "highest flat rate >= 2x the stock stack's": (ratio >= 2) if ratio else None,
            "every taskhook delivery settled": exact,
        },
    }
    rows = []
    for name, by_rate in runs.items():
        for rate, run in by_rate.items():
            rows.append(
                {
                    "label": f"{name}\n{rate}/s",
                    "rate": run["settled"] / run["seconds"],
                    "p50_ms": run["latency"]["p50_ms"],
                    "p95_ms": run["latency"]["p95_ms"],
                    "p99_ms": run["latency"]["p99_ms"],
                }
            )
    return bench.finish(
        result,
        rows,
        "POST to task settled: taskhook vs the stock stack (open loop)",
        rate_label="tasks settled per s",
    )
