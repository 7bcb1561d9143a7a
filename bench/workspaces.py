"""``python -m bench workspaces``: creates per second into one busy workspace
against the same creates spread over eight.

Every create that allocates an identifier holds its workspace's counter row
(``workspaces.task_sequence``) locked until its transaction commits, so
creates into one workspace queue on that row, while creates into eight
mostly do not. Several creator processes (each with its own engine, as the
REST, MCP and CLI surfaces have) call ``models.tasks.create_task`` for a fixed
time, round-robin over their workspaces; a share of the calls into each
workspace (the second, then every fifth at 20 %) repeat an external id the creator made there
before, which the lookup answers Found. The two
layouts take turns at going first, round by round, and the ratio
rate(1) : rate(8) is taken per round; its median is the figure.

After every run each workspace's identifiers are checked gapless: numbers 1
to N, N the workspace's counter and its count of tasks -- a Found outcome
must never burn a number.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import statistics
import time
import uuid
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import psycopg

from bench import report
from bench.processes import BenchError, libpq_url, throwaway_database
from models.access import Caller
from models.db import make_engine, make_session_factory, session_scope
from models.tasks import NewTask, create_task
from models.workspaces import create_workspace

#: Issue 20, section 5.
GOAL = 0.7
LAYOUTS = (1, 8)
#: How long before the first create the creators are handed their run, so
#: that every one of them starts at the same moment.
_START_MARGIN_S = 0.3

# One engine per creator process, built by its pool's initializer.
_sessions = None


def _connect(database_url: str) -> None:
    global _sessions
    _sessions = make_session_factory(make_engine(database_url, pool_size=1))


def create_for(
    *,
    workspace_ids: list[int],
    start_at: float,
    seconds: float,
    found_percent: int,
    tag: str,
    seed: int,
) -> dict[str, Any]:
    """One creator's run: ``create_task`` round-robin over ``workspace_ids``
    from ``start_at`` for ``seconds``; ``found_percent`` of the calls into
    each workspace repeat an external id this creator made there. Runs in a pool process."""
    rng = random.Random(seed)
    made: dict[int, list[str]] = {workspace_id: [] for workspace_id in workspace_ids}
    visits: Counter[int] = Counter()
    # Calls 1, 1 + period, 1 + 2 * period ... into each workspace repeat one.
    period = max(1, 100 // found_percent) if found_percent else 1
    outcomes: Counter[str] = Counter()
    caller = Caller.trusted("bench workspaces")
    time.sleep(max(0.0, start_at - time.time()))
    end = start_at + seconds
    calls = 0
    while time.time() < end:
        workspace_id = workspace_ids[calls % len(workspace_ids)]
        earlier = made[workspace_id]
        # The same share of repeats in every workspace, from its first calls
        # on: a Found costs less than a create, so 1 workspace and 8 must get
        # as many of them.
        visit = visits[workspace_id]
        visits[workspace_id] += 1
        if found_percent and earlier and visit % period == 1 % period:
            external_id = rng.choice(earlier)
        else:
            external_id = f"{tag}-{calls}"
            earlier.append(external_id)
        with session_scope(_sessions) as session:
            result = create_task(
                session=session,
                caller=caller,
                workspace_id=workspace_id,
                new=NewTask(title=f"busy workspace {external_id}", external_id=external_id),
            )
        outcomes[result.outcome.value] += 1
        calls += 1
    return {"calls": calls, "elapsed_s": time.time() - start_at, "outcomes": dict(outcomes)}


def _prepare(database_url: str, count: int) -> list[int]:
    engine = make_engine(database_url)
    try:
        with session_scope(make_session_factory(engine)) as session:
            return [
                create_workspace(
                    session=session, slug=f"busy-{n}", name=f"Busy {n}", task_prefix=f"BUSY{n}"
                ).id
                for n in range(count)
            ]
    finally:
        engine.dispose()


def gaps(database_url: str) -> dict[str, Any]:
    """Each workspace's identifiers against its counter: gapless when numbers
    1..N each appear once, N being both the counter and the count of tasks."""
    with psycopg.connect(libpq_url(database_url)) as connection:
        rows = connection.execute(
            """
            SELECT w.id, w.task_sequence, count(t.id),
                   count(DISTINCT split_part(t.identifier, '-', 2)::int),
                   coalesce(min(split_part(t.identifier, '-', 2)::int), 0),
                   coalesce(max(split_part(t.identifier, '-', 2)::int), 0)
            FROM workspaces w LEFT JOIN tasks t ON t.workspace_id = w.id
            GROUP BY w.id, w.task_sequence ORDER BY w.id
            """
        ).fetchall()
    per_workspace = {
        str(workspace_id): {"counter": counter, "tasks": tasks, "highest": highest}
        for workspace_id, counter, tasks, _distinct, _lowest, highest in rows
    }
    gapless = all(
        counter == tasks == distinct == highest and (tasks == 0 or lowest == 1)
        for _id, counter, tasks, distinct, lowest, highest in rows
    )
    return {"gapless": gapless, "workspaces": per_workspace}


def workspaces(bench: Any) -> dict[str, Any]:
    sizes = bench.sizes
    creators = sizes.workspaces_creators
    runs: dict[int, list[dict[str, Any]]] = {layout: [] for layout in LAYOUTS}
    checks: list[dict[str, Any]] = []
    pids: list[int] = []
    with throwaway_database() as database:
        ids = _prepare(database, max(LAYOUTS))
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            creators, mp_context=spawn, initializer=_connect, initargs=(database,)
        ) as pool:
            pids = sorted(set(pool.map(_pid_after_start, range(creators * 4))))
            for round_ in range(sizes.workspaces_rounds):
                order = LAYOUTS if round_ % 2 == 0 else tuple(reversed(LAYOUTS))
                for layout in order:
                    run = _run(pool, ids[:layout], creators, sizes, f"r{round_}-w{layout}")
                    runs[layout].append(run)
                    checks.append(gaps(database))
                    bench.say(
                        f"  round {round_}, {layout} workspace(s): {run['rate_per_s']} creates/s"
                        f" {run['outcomes']}; gapless {checks[-1]['gapless']}"
                    )
    return _report(bench, runs, checks, pids)


def _pid_after_start(_: int) -> int:
    # Also what makes every creator import and connect before the first run.
    time.sleep(0.05)
    return os.getpid()


def _run(
    pool: ProcessPoolExecutor, workspace_ids: list[int], creators: int, sizes: Any, name: str
) -> dict[str, Any]:
    start_at = time.time() + _START_MARGIN_S
    tag = f"{name}-{uuid.uuid4().hex[:6]}"
    futures = [
        pool.submit(
            create_for,
            # Each creator starts at a different workspace, so 8 workspaces
            # are all busy from the first call.
            workspace_ids=workspace_ids[n % len(workspace_ids) :]
            + workspace_ids[: n % len(workspace_ids)],
            start_at=start_at,
            seconds=sizes.workspaces_seconds,
            found_percent=sizes.workspaces_found_percent,
            tag=f"{tag}-c{n}",
            seed=n,
        )
        for n in range(creators)
    ]
    results = [future.result(timeout=sizes.workspaces_seconds + 120) for future in futures]
    outcomes: Counter[str] = Counter()
    for result in results:
        outcomes.update(result["outcomes"])
    calls = sum(result["calls"] for result in results)
    elapsed = max(result["elapsed_s"] for result in results)
    if calls == 0:
        raise BenchError(f"{name}: no create finished in {sizes.workspaces_seconds} s")
    return {
        "workspaces": len(workspace_ids),
        "calls": calls,
        "elapsed_s": round(elapsed, 3),
        "rate_per_s": round(calls / elapsed, 1),
        "outcomes": dict(outcomes),
    }


def _report(
    bench: Any, runs: dict[int, list[dict[str, Any]]], checks: list[dict[str, Any]], pids: list[int]
) -> dict[str, Any]:
    one, eight = LAYOUTS
    ratios = [
        report.ratio(busy["rate_per_s"], spread["rate_per_s"])
        for busy, spread in zip(runs[one], runs[eight], strict=True)
    ]
    ratio = statistics.median(ratios)
    found = sum(
        count
        for entries in runs.values()
        for run in entries
        for outcome, count in run["outcomes"].items()
        if outcome.startswith("found")
    )
    gapless = all(check["gapless"] for check in checks)
    rows = [
        {
            "label": f"{layout} workspace(s)",
            "rate": report.median([run["rate_per_s"] for run in entries]),
            "low": min(run["rate_per_s"] for run in entries),
            "high": max(run["rate_per_s"] for run in entries),
        }
        for layout, entries in runs.items()
    ]
    result = {
        "creators": bench.sizes.workspaces_creators,
        "creator_pids": pids,
        "runs": {f"{layout} workspace(s)": entries for layout, entries in runs.items()},
        "ratio_1_vs_8": ratio,
        "ratios_per_round": ratios,
        "found_outcomes": found,
        "identifiers": checks[-1],
        "goals": {
            f"1 workspace >= {GOAL}x 8 workspaces": ratio >= GOAL,
            "identifiers gapless in every workspace, with Found outcomes": gapless and found > 0,
        },
    }
    result["identifiers"]["gapless_after_every_run"] = [check["gapless"] for check in checks]
    return bench.finish(
        result,
        rows,
        f"create_task from {bench.sizes.workspaces_creators} processes: 1 workspace vs 8",
        rate_label="creates per s",
    )
