"""``python -m bench fairness``: does a storm in one place delay everyone else?

Issue 34: the deliveries queue was first in, first out for every workspace,
so 3,000 deliveries posted to one workspace's source held ten posted to
another behind them (POST to task settled: a 44 ms median became 11.6 s).
This benchmark measures, as a black box, how much a storm delays the
deliveries that are not part of it, and what sharing costs the storm.

One stack per broker (a private ``redis-server``, or a virtual host of the
machine's RabbitMQ), started as the Procfile starts it: one ingress process,
the ``worker`` process on both lanes (``celery_worker``'s default queues, so
the queues it serves are whatever taskhook's own deployment serves) and the
``live`` process on the live lane alone. One throwaway PostgreSQL database,
emptied (``taskhook.reset``) before every run.

Places. Workspace **A** (two GitHub sources, **A1** and **A2**), workspace
**B** (one source) and, for case 2, ``fairness_quiet_workspaces`` quiet
workspaces (one source each). Every load posts GitHub ``issues.opened``
fixtures, each delivery a distinct issue.

Cases, each measured against its baseline in the same round, the rounds
alternating which goes first (the machine is small and noisy, so the
figures are ratios taken per round; the reported ratio is their median):

1. **storm in one workspace**: ``fairness_storm`` deliveries posted to A1 as
   fast as the load generator goes (closed loop), while B gets a steady
   ``fairness_steady_rate`` per second until the storm is drained. B's
   latency against B alone at that rate for ``fairness_baseline_seconds``
   (goal: p99 at most 2x), and the storm's drain rate against the storm
   posted alone (goal: at least 0.9x).
2. **many quiet workspaces**: the quiet workspaces at ``fairness_quiet_rate``
   per second each, with the storm and without it; the worst workspace's
   p99 against the worst without the storm (goal: at most 2x).
3. **one source inside a workspace**: A1 storms, A2 (same workspace) gets the
   steady rate; A2's p99 against A2 alone (goal: at most 2x).
4. **background work**: (a) ``taskhook catch-up github`` recovering
   ``fairness_background`` deliveries of A1 from a fake GitHub's delivery log
   (``bench.fakes.github_api``, as ``bench catch-up`` runs it), (b)
   ``taskhook deliveries replay-matching`` of ``fairness_background`` dead
   deliveries of A1, each while B gets the steady rate until the background
   work is drained. B's p99 against B alone (goal: at most 2x, both), and
   the catch-up's own rate (deliveries recovered per second of the command)
   against the catch-up with B idle (goal: at least 0.8x).
5. **the machine's floor**: B at the steady rate beside ``CPU_HOGS``
   processes that only spin, sharing nothing with taskhook but the CPUs.
   No goal: it says how much of the other cases' ratios any work that keeps
   this machine's cores busy costs B, however fairly taskhook shares.

Latency is POST to task settled, read from the rows as ``bench latency``
reads it: ``tasks.external_id_settled_at - deliveries.received_at``, both
stamped by Python's clock on this host. A drain rate is the deliveries of
the storm over the seconds from its first received to its last settled.
Every delivery posted must have finished (done, ignored, needs_operator or
dead) before a run's rows are read. Autovacuum is off for the benchmark's
tables (see ``bench retries``: statistics taken at a random moment of a run
make one drain fast and the next slow).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import redis
from sqlalchemy import text

from bench import catch_up, report, taskhook
from bench.fakes.github_api import FakeGitHub
from bench.loadgen import percentiles
from bench.processes import (
    BenchError,
    Process,
    libpq_url,
    rabbitmqctl,
    throwaway_database,
    wait_until,
)
from models.broker.lanes import Lane
from models.db import make_engine, make_session_factory, session_scope
from models.sources import add_source
from models.workspaces import create_workspace

#: Every load posts this one fixture, so every source is alike: a GitHub source.
KINDS = ["github:issues__opened"]
STORM_SOURCE = taskhook.SOURCES["github"]  # A1; catch-up recovers into it
SECOND_SOURCE = "fairness-a2"  # A2, in the same workspace
STEADY_SOURCE = "fairness-b"  # B, a workspace of its own
#: Issue numbers of each load start apart, so two loads into one workspace
#: never name the same issue.
FIRST_NUMBER = {"storm": 1, "steady": 1_000_001, "second": 2_000_001, "quiet": 3_000_001}
#: How long a run may take to drain, at most.
DRAIN_TIMEOUT = 1800.0
LATENCY_GOAL = 2.0
#: Case 5: as many spinning processes as this machine has cores.
CPU_HOGS = os.cpu_count() or 2
STORM_RATE_GOAL = 0.9
CATCH_UP_RATE_GOAL = 0.8

_ROWS = """
SELECT s.slug, extract(epoch FROM d.received_at), extract(epoch FROM t.external_id_settled_at),
       d.status, extract(epoch FROM t.created_at)
FROM deliveries d JOIN webhook_sources s ON s.id = d.source_id
LEFT JOIN tasks t ON t.id = d.task_id
"""
_FINISHED_OF = """
SELECT count(*), count(*) FILTER (WHERE d.status = ANY(%(finished)s))
FROM deliveries d JOIN webhook_sources s ON s.id = d.source_id
WHERE s.slug = ANY(%(slugs)s)
"""


@dataclass
class Rig:
    """One broker's stack and what the runs share."""

    broker: str
    database: str
    env: dict[str, str]
    url: str
    watcher: psycopg.Connection
    quiet_sources: list[str]
    flush_broker: Callable[[], None]
    #: The Procfile's ``worker`` (both lanes) and ``live`` (the live lane).
    workers: list[Process] = field(default_factory=list)
    runs: int = 0


@dataclass
class Load:
    """One load of a run: a steady one is open loop (``rate`` per second over
    ``sources``, round-robin) until the run's storm or background work is
    drained, or for the baseline's seconds when there is none; a storm is
    ``requests`` posted closed loop."""

    name: str
    sources: list[str]
    first_number: int
    rate: float = 0.0
    requests: int = 0

    @property
    def storm(self) -> bool:
        return self.requests > 0


@dataclass
class Background:
    """Work that is not a webhook: a command run to its end, whose deliveries
    land in ``source``; ``prepare`` runs before the run (not timed)."""

    name: str
    source: str
    count: int
    command: Callable[[Rig], list[str]]
    #: How many deliveries the command handled, from its ``--json`` answer.
    answered: Callable[[dict], int]
    prepare: Callable[[Any, Rig], None]


def fairness(bench: Any) -> dict[str, Any]:
    sizes = bench.sizes
    results: dict[str, dict[str, Any]] = {}
    with throwaway_database() as database, _fake_github(4 in sizes.fairness_cases) as github:
        quiet = _prepare(database, sizes.fairness_quiet_workspaces)
        if github is not None:
            catch_up._grant_log_access(database, github.base_url)
            catch_up._log_failed_deliveries(github, sizes.fairness_background)
        for broker in bench.brokers:
            bench.say(f"  {broker}:")
            with _rig(bench, broker, database, quiet) as rig:
                results[broker] = _cases(bench, rig)
    return _report(bench, results)


@contextlib.contextmanager
def _fake_github(wanted: bool) -> Iterator[FakeGitHub | None]:
    if not wanted:
        yield None
        return
    with FakeGitHub(token=catch_up.TOKEN) as github:
        yield github


def _prepare(database: str, quiet_count: int) -> list[str]:
    """Workspace A (the ``bench`` one, with A1, and A2 added), workspace B,
    and the quiet workspaces; the quiet sources' slugs."""
    taskhook.prepare(database)
    engine = make_engine(database)
    quiet = [f"fairness-quiet-{n}" for n in range(quiet_count)]
    try:
        with session_scope(make_session_factory(engine)) as session:
            a = session.execute(text("SELECT id FROM workspaces WHERE slug = 'bench'")).scalar_one()
            _github_source(session, a, SECOND_SOURCE)
            b = create_workspace(session=session, slug="fairness-b", name="B", task_prefix="FB")
            _github_source(session, b.id, STEADY_SOURCE)
            for n, slug in enumerate(quiet):
                workspace = create_workspace(
                    session=session, slug=slug, name=f"Quiet {n}", task_prefix=f"FQ{n}"
                )
                _github_source(session, workspace.id, slug)
    finally:
        engine.dispose()
    with psycopg.connect(libpq_url(database), autocommit=True) as connection:
        for table in ("tasks", "deliveries"):
            connection.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    return quiet


def _github_source(session: Any, workspace_id: int, slug: str) -> None:
    add_source(
        session=session,
        provider="github",
        workspace_id=workspace_id,
        slug=slug,
        secret=taskhook.SECRET,
        create_events=["issues.opened"],
    )


@contextlib.contextmanager
def _rig(bench: Any, broker: str, database: str, quiet: list[str]) -> Iterator[Rig]:
    """The broker, the ingress and one worker process, as the Procfile runs them."""
    procs = bench.processes
    if broker == "redis":
        url = procs.redis()

        def flush() -> None:
            with contextlib.closing(redis.Redis.from_url(url)) as client:
                client.flushdb()
    else:
        url = procs.rabbitmq()
        vhost = url.rsplit("/", 1)[1]

        def flush() -> None:
            listed = rabbitmqctl(
                "list_queues", "-p", vhost, "name", "--quiet", "--no-table-headers"
            )
            for name in listed.split():
                rabbitmqctl("purge_queue", "-p", vhost, name)

    env = taskhook.environment(database, url)
    ingress, ingress_url = procs.uvicorn(f"ingress-{broker}", "ingest.app:app", env)
    with psycopg.connect(libpq_url(database), autocommit=True) as watcher:
        rig = Rig(broker, database, env, ingress_url, watcher, quiet, flush)
        _start_workers(procs, rig)
        try:
            # The first deliveries pay for connections and caches: not measured.
            _run(bench, rig, [Load("warm-up", [STORM_SOURCE, STEADY_SOURCE], 1, requests=200)])
            yield rig
        finally:
            _stop_workers(procs, rig)
            procs.stop(ingress)


def _cases(bench: Any, rig: Rig) -> dict[str, Any]:
    """Every chosen case, ``fairness_rounds`` times, baselines and storms
    taking turns at going first."""
    sizes = bench.sizes
    rate, n = sizes.fairness_steady_rate, sizes.fairness_storm
    storm = Load("storm A1", [STORM_SOURCE], FIRST_NUMBER["storm"], requests=n)
    steady_b = Load("steady B", [STEADY_SOURCE], FIRST_NUMBER["steady"], rate=rate)
    steady_a2 = Load("steady A2", [SECOND_SOURCE], FIRST_NUMBER["second"], rate=rate)
    quiet = Load(
        "quiet",
        rig.quiet_sources,
        FIRST_NUMBER["quiet"],
        rate=sizes.fairness_quiet_rate * len(rig.quiet_sources),
    )
    catch_up_work = Background(
        "catch-up",
        STORM_SOURCE,
        sizes.fairness_background,
        lambda _: catch_up._cli(),
        prepare=_forget_catch_up,
        answered=lambda answer: len(answer["recovered"]),
    )
    replay_work = Background(
        "replay",
        STORM_SOURCE,
        sizes.fairness_background,
        _replay_command,
        prepare=_dead_deliveries,
        answered=lambda answer: answer["operation"]["done"],
    )
    # Per case: its runs by name, each a list of loads and background work.
    plans: dict[int, dict[str, tuple[list[Load], Background | None]]] = {
        1: {
            "B alone": ([steady_b], None),
            "storm alone": ([storm], None),
            "storm + B": ([storm, steady_b], None),
        },
        2: {"quiet alone": ([quiet], None), "storm + quiet": ([storm, quiet], None)},
        3: {"A2 alone": ([steady_a2], None), "storm A1 + A2": ([storm, steady_a2], None)},
        5: {"B alone": ([steady_b], None), "B beside CPU hogs": ([steady_b], None)},
        4: {
            "B alone": ([steady_b], None),
            "catch-up alone": ([], catch_up_work),
            "catch-up + B": ([steady_b], catch_up_work),
            "replay + B": ([steady_b], replay_work),
        },
    }
    rounds: list[dict[str, dict[str, Any]]] = []
    for round_ in range(sizes.fairness_rounds):
        measured: dict[str, dict[str, Any]] = {}
        for case in sizes.fairness_cases:
            names = list(plans[case])
            for name in names if round_ % 2 == 0 else names[::-1]:
                if name in measured:  # B alone serves cases 1 and 4 alike
                    continue
                loads, background = plans[case][name]
                hogs = CPU_HOGS if name == "B beside CPU hogs" else 0
                with _spinning(hogs):
                    measured[name] = _run(bench, rig, loads, background)
                bench.say(f"    round {round_ + 1}, {name}: {_brief(measured[name])}")
        rounds.append(measured)
    return {"rounds": rounds, "ratios": _ratios(rounds, sizes.fairness_cases)}


def _run(bench: Any, rig: Rig, loads: list[Load], background: Background | None = None) -> dict:
    """The loads and the background work together, on an emptied inbox;
    what each did, read from the rows once every delivery finished."""
    sizes = bench.sizes
    taskhook.reset(rig.database)
    if background is not None:
        background.prepare(bench, rig)
    rig.runs += 1
    stop = bench.processes.logs / f"stop-{rig.broker}-{rig.runs}"
    stop.unlink(missing_ok=True)
    storms = [load for load in loads if load.storm]
    lasting = bool(storms) or background is not None
    # A storm and background work go on to their end; steady loads until
    # they are drained, or for the baseline's seconds.
    busy_sources = [source for load in storms for source in load.sources]
    if background is not None:
        busy_sources.append(background.source)
    with concurrent.futures.ThreadPoolExecutor(len(loads) + 1) as pool:
        futures: dict[str, concurrent.futures.Future] = {}
        for load in loads:
            options: dict[str, Any] = {
                "kinds": KINDS,
                "source_sets": [{"github": source} for source in load.sources],
                "first_number": load.first_number,
                "timeout": DRAIN_TIMEOUT,
            }
            if load.storm:
                options.update(mode="closed", requests=load.requests, concurrency=sizes.concurrency)
            else:
                options.update(mode="open", rate=load.rate)
                # At least a second of it, however soon the storm drains.
                options.update(
                    duration=DRAIN_TIMEOUT if lasting else sizes.fairness_baseline_seconds,
                    stop_when_exists=str(stop),
                    least_before_stop=load.rate,
                )
            tag = taskhook.tag(f"fairness-{load.name}")
            futures[load.name] = pool.submit(bench.load, rig.url, tag=tag, **options)
        if background is not None:
            futures[background.name] = pool.submit(_background, bench, rig, background)
        try:
            if lasting:
                busy = sum(futures[load.name].result()["completed"] for load in storms)
                if background is not None:
                    busy += futures[background.name].result()["handled"]
                _drained(rig, busy_sources, busy)
        finally:
            # A baseline's steady load ends at its seconds; these end when the storm is drained.
            if lasting:
                stop.touch()
        posted = {name: future.result() for name, future in futures.items()}
    everything = [source for load in loads for source in load.sources] + busy_sources
    answered = sum(answer.get("completed", answer.get("handled", 0)) for answer in posted.values())
    _drained(rig, everything, answered)
    return _measured(rig, loads, background, posted)


def _background(bench: Any, rig: Rig, work: Background) -> dict[str, Any]:
    """Run the command to its end; its rate over the deliveries it handled."""
    procs = bench.processes
    process = procs.start(work.name, work.command(rig), rig.env)
    began = time.time()
    started = time.monotonic()
    while process.alive():
        time.sleep(0.05)
    seconds = time.monotonic() - started
    procs.stop(process)
    if process.popen.returncode != 0:
        raise BenchError(f"{work.name} failed\n{process.tail()}")
    output = process.log.read_text()
    answer = json.loads(output[output.index("{") :])
    handled = work.answered(answer)
    if handled != work.count:
        raise BenchError(f"{work.name} handled {handled} of {work.count}\n{process.tail()}")
    return {
        "handled": handled,
        "seconds": round(seconds, 2),
        "rate_per_s": round(handled / seconds, 1),
        "began": began,
    }


def _drained(rig: Rig, sources: list[str], at_least: int) -> None:
    """Wait until the ``sources`` have at least ``at_least`` deliveries, all finished."""

    def finished() -> bool:
        assert rig.workers
        for worker in rig.workers:
            worker.check_alive()
        rows, done = rig.watcher.execute(
            _FINISHED_OF, {"finished": list(taskhook.FINISHED), "slugs": sources}
        ).fetchone()
        return rows >= at_least and done == rows

    wait_until(
        finished,
        timeout=DRAIN_TIMEOUT,
        what=f"every delivery of {sources[:3]} finished",
        every=0.25,
    )


def _measured(
    rig: Rig, loads: list[Load], background: Background | None, posted: dict[str, dict]
) -> dict[str, Any]:
    by_source: dict[str, list[tuple[float, float | None, str]]] = {}
    # Received -> claimed (the task's created_at: on the fast path the claim
    # statement's own time): the relay, the broker and the wait for a worker
    # thread. Claimed -> settled: the worker's statements.
    claimed_by_source: dict[str, list[tuple[float, float, float]]] = {}
    for slug, received, settled, status, claimed in rig.watcher.execute(_ROWS).fetchall():
        by_source.setdefault(slug, []).append(
            (float(received), None if settled is None else float(settled), status)
        )
        if claimed is not None and settled is not None:
            claimed_by_source.setdefault(slug, []).append(
                (float(received), float(claimed), float(settled))
            )
    run: dict[str, Any] = {}
    for load in loads:
        rows = [row for source in load.sources for row in by_source.get(source, [])]
        sent = posted[load.name]
        entry = {
            "posted": sent["completed"],
            "errors": sent["errors"],
            "error_kinds": sent["error_kinds"],
            "posted_per_s": sent["throughput_rps"],
            **_latency(rows),
            **_stages(
                [row for source in load.sources for row in claimed_by_source.get(source, [])]
            ),
        }
        if not 0 < sent["completed"] <= entry["settled"] == entry["rows"]:
            raise BenchError(
                f"{load.name}: {sent['sent']} sent, {sent['completed']} answered "
                f"(errors {sent['error_kinds']}), {entry['rows']} stored, "
                f"{entry['settled']} settled: every delivery must become a settled task"
            )
        if load.storm:
            entry["drain"] = _drain(rows)
        if len(load.sources) > 1:
            worst = [
                (_latency(by_source.get(source, []))["latency"]["p99_ms"], source)
                for source in load.sources
            ]
            entry["worst_source"] = {"p99_ms": max(worst)[0], "source": max(worst)[1]}
        run[load.name] = entry
    if background is not None:
        rows = by_source.get(background.source, [])
        done = posted[background.name]
        run[background.name] = {
            **done,
            # From the command's start: a replay's deliveries were received before it.
            "drain": _drain(rows, since=done["began"]),
            "statuses": _statuses(rows),
        }
    return run


def _stages(rows: list[tuple[float, float, float]]) -> dict[str, Any]:
    """Where a delivery's time went: received -> claimed, claimed -> settled."""
    return {
        "received_to_claimed": percentiles([claimed - received for received, claimed, _ in rows]),
        "claimed_to_settled": percentiles([settled - claimed for _, claimed, settled in rows]),
    }


def _latency(rows: list[tuple[float, float | None, str]]) -> dict[str, Any]:
    settled = [end - start for start, end, _ in rows if end is not None]
    return {
        "rows": len(rows),
        "settled": len(settled),
        "statuses": _statuses(rows),
        "latency": percentiles(settled),
    }


def _statuses(rows: list[tuple[float, float | None, str]]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for *_, status in rows:
        counted[status] = counted.get(status, 0) + 1
    return counted


def _drain(
    rows: list[tuple[float, float | None, str]], since: float | None = None
) -> dict[str, Any]:
    """Deliveries per second from the first received (or ``since``) to the last settled."""
    if not rows:
        return {"deliveries": 0, "seconds": 0.0, "rate_per_s": 0.0}
    first = min(start for start, _, _ in rows) if since is None else since
    last = max((end for _, end, _ in rows if end is not None), default=first)
    seconds = max(last - first, 1e-3)
    return {
        "deliveries": len(rows),
        "seconds": round(seconds, 2),
        "rate_per_s": round(len(rows) / seconds, 1),
    }


def _ratios(rounds: list[dict[str, dict[str, Any]]], cases: tuple[int, ...]) -> dict[str, Any]:
    """Per round, each storm's figure over its baseline's; and their medians."""

    def p99(run: str, load: str) -> Callable[[dict], float]:
        return lambda measured: measured[run][load]["latency"]["p99_ms"]

    def worst(run: str) -> Callable[[dict], float]:
        return lambda measured: measured[run]["quiet"]["worst_source"]["p99_ms"]

    def rate(run: str, what: str, key: str) -> Callable[[dict], float]:
        return lambda measured: measured[run][what][key]["rate_per_s"]

    def own_rate(run: str) -> Callable[[dict], float]:
        return lambda measured: measured[run]["catch-up"]["rate_per_s"]

    wanted: dict[str, tuple[Callable, Callable]] = {}
    if 1 in cases:
        wanted["1: B p99, storm / alone"] = (
            p99("storm + B", "steady B"),
            p99("B alone", "steady B"),
        )
        wanted["1: storm drain, with B / alone"] = (
            rate("storm + B", "storm A1", "drain"),
            rate("storm alone", "storm A1", "drain"),
        )
    if 2 in cases:
        wanted["2: worst quiet p99, storm / alone"] = (worst("storm + quiet"), worst("quiet alone"))
    if 3 in cases:
        wanted["3: A2 p99, storm A1 / alone"] = (
            p99("storm A1 + A2", "steady A2"),
            p99("A2 alone", "steady A2"),
        )
    if 4 in cases:
        wanted["4a: B p99, catch-up / alone"] = (
            p99("catch-up + B", "steady B"),
            p99("B alone", "steady B"),
        )
        wanted["4a: catch-up rate, with B / alone"] = (
            own_rate("catch-up + B"),
            own_rate("catch-up alone"),
        )
        wanted["4b: B p99, replay / alone"] = (
            p99("replay + B", "steady B"),
            p99("B alone", "steady B"),
        )
    if 5 in cases:
        wanted["5: B p99, CPU hogs / alone"] = (
            p99("B beside CPU hogs", "steady B"),
            p99("B alone", "steady B"),
        )
    ratios = {}
    for name, (top, bottom) in wanted.items():
        per_round = [report.ratio(top(measured), bottom(measured)) for measured in rounds]
        ratios[name] = {"per_round": per_round, "median": round(statistics.median(per_round), 3)}
    return ratios


#: Each ratio's goal: at most (latency) or at least (rates) this.
GOALS = {
    "1: B p99, storm / alone": ("<=", LATENCY_GOAL),
    "1: storm drain, with B / alone": (">=", STORM_RATE_GOAL),
    "2: worst quiet p99, storm / alone": ("<=", LATENCY_GOAL),
    "3: A2 p99, storm A1 / alone": ("<=", LATENCY_GOAL),
    "4a: B p99, catch-up / alone": ("<=", LATENCY_GOAL),
    "4a: catch-up rate, with B / alone": (">=", CATCH_UP_RATE_GOAL),
    "4b: B p99, replay / alone": ("<=", LATENCY_GOAL),
    "5: B p99, CPU hogs / alone": ("no goal", None),
}


def _report(bench: Any, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    goals: dict[str, Any] = {}
    rows = []
    bench.say("  summary (median over rounds of each round's ratio):")
    for broker, result in results.items():
        for name, ratio in result["ratios"].items():
            sign, goal = GOALS[name]
            goals[f"{broker} {name}"] = ratio["median"]
            if goal is None:
                bench.say(
                    f"    {broker:8} {name:38} {ratio['median']:>9.3f}  "
                    f"(no goal; rounds {ratio['per_round']})"
                )
                continue
            met = ratio["median"] <= goal if sign == "<=" else ratio["median"] >= goal
            goals[f"{broker} {name} {sign} {goal}"] = met
            bench.say(
                f"    {broker:8} {name:38} {ratio['median']:>9.3f}  (goal {sign} {goal}: "
                f"{'met' if met else 'NOT met'}; rounds {ratio['per_round']})"
            )
        errors = sum(
            entry.get("errors", 0)
            for measured in result["rounds"]
            for run in measured.values()
            for entry in run.values()
        )
        goals[f"{broker} every POST answered"] = errors == 0
        last = result["rounds"][-1]
        for run_name, run in last.items():
            for load_name, entry in run.items():
                if "latency" in entry:
                    rows.append(
                        {
                            "label": f"{broker}\n{run_name}\n{load_name}",
                            "rate": entry.get("drain", {}).get("rate_per_s", 0.0),
                            **{
                                key: entry["latency"][key] for key in ("p50_ms", "p95_ms", "p99_ms")
                            },
                        }
                    )
    result = {"brokers": list(results), "results": results, "goals": goals}
    return bench.finish(
        result,
        rows,
        "Fair share: storms' drain rates (per s), last round",
        rate_label="storm drain (deliveries per s)",
    )


def _brief(run: dict[str, Any]) -> str:
    parts = []
    for name, entry in run.items():
        if "latency" in entry:
            latency = entry["latency"]
            text = (
                f"{name} p50 {latency['p50_ms']:.0f} / p95 {latency['p95_ms']:.0f} / p99 "
                f"{latency['p99_ms']:.0f} / max {latency['max_ms']:.0f} ms "
                f"({entry['settled']}/{entry['rows']})"
            )
            if "drain" not in entry:
                waited, ran = entry["received_to_claimed"], entry["claimed_to_settled"]
                text += (
                    f" [to claimed p50 {waited['p50_ms']:.0f} / p99 {waited['p99_ms']:.0f}, "
                    f"claimed to settled p50 {ran['p50_ms']:.0f} / p99 {ran['p99_ms']:.0f} ms]"
                )
        else:
            text = f"{name} {entry['rate_per_s']}/s"
        if "drain" in entry:
            text += f", drained at {entry['drain']['rate_per_s']}/s"
        parts.append(text)
    return "; ".join(parts)


# --- background work: a catch-up, a bulk replay ------------------------------------------


def _forget_catch_up(bench: Any, rig: Rig) -> None:
    """Forget what earlier runs recovered, so this one recovers all again."""
    rig.watcher.execute("TRUNCATE catchup_runs RESTART IDENTITY")


def _replay_command(rig: Rig) -> list[str]:
    name = f"fairness-{uuid.uuid4().hex[:8]}"
    return [
        sys.executable,
        "-m",
        "worker.cli",
        "deliveries",
        "replay-matching",
        "--source",
        STORM_SOURCE,
        "--status",
        "dead",
        "--name",
        name,
        "--operator",
        "bench",
        "--json",
    ]


def _dead_deliveries(bench: Any, rig: Rig) -> None:
    """``fairness_background`` deliveries of A1 that ended dead, never run:
    posted with the worker stopped, their messages purged from the broker,
    marked dead, as deliveries a broken deployment gave up on are."""
    procs = bench.processes
    _stop_workers(procs, rig)
    n = bench.sizes.fairness_background
    published = taskhook.relay_published(rig.url)
    posted = bench.load(
        rig.url,
        tag=taskhook.tag("fairness-dead"),
        kinds=KINDS,
        source_sets=[{"github": STORM_SOURCE}],
        first_number=FIRST_NUMBER["storm"],
        requests=n,
        concurrency=bench.sizes.concurrency,
    )
    if posted["completed"] != n:
        raise BenchError(f"the ingress answered {posted['completed']} of {n}")
    # The relay publishes soon after the answer: wait for it, then purge.
    wait_until(
        lambda: taskhook.relay_published(rig.url) - published >= n,
        timeout=120,
        what=f"the relay to publish {n} deliveries",
        every=0.2,
    )
    rig.flush_broker()
    marked = rig.watcher.execute(
        "UPDATE deliveries SET status = 'dead', status_reason = 'bench: given up on' "
        "WHERE status = 'queued'"
    ).rowcount
    if marked != n:
        raise BenchError(f"marked {marked} of {n} deliveries dead")
    _start_workers(procs, rig)


@contextlib.contextmanager
def _spinning(count: int) -> Iterator[None]:
    """``count`` processes that keep a core busy each and touch nothing else."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _start_workers(procs: Any, rig: Rig) -> None:
    """The deliveries workers as the Procfile runs them: ``worker`` on both
    lanes, ``live`` on the live lane alone (its threads are never all held
    by a flood's messages)."""
    rig.workers = [
        procs.celery_worker(f"worker-{rig.broker}", "worker", rig.env),
        procs.celery_worker(f"live-{rig.broker}", "worker", rig.env, queues=Lane.LIVE.value),
    ]


def _stop_workers(procs: Any, rig: Rig) -> None:
    for worker in rig.workers:
        procs.stop(worker)
    rig.workers = []
