"""``python -m bench sqlite``: the embedded default end to end, with its
default SQLite settings and with each opt-in, side by side.

``scripts/run``'s setup -- a SQLite file and the ``filesystem://`` broker --
with one ingress and one worker, as the Procfile starts them.
N deliveries are posted with 8 in flight while the worker runs, and the run
is timed from the first post until every inbox row is finished (every task
settled): the end-to-end rate. Three settings take turns, round by round, in
an order that rotates:

- **default**: taskhook's defaults (``TASKHOOK_SQLITE_SYNCHRONOUS=FULL``, an
  fsync per commit; writers queued on ``models.sqlite_writer``'s lock, handed
  over within half a millisecond; two worker threads);
- **busy_handler**: the defaults before that lock and thread count
  (``TASKHOOK_SQLITE_WRITER_LOCK=false``, four worker threads): writers wait
  in SQLite's busy handler, which sleeps between tries;
- **normal**: the opt-in ``TASKHOOK_SQLITE_SYNCHRONOUS=NORMAL``: no fsync per
  commit, durable against a process crash but not a power cut
  (docs/performance.md, §6).

Each run starts from an empty database and broker folder. Besides the rates
it records where the time went, in measures this shared machine's load moves
less than it moves time: the CPU the ingress and the worker spent per
delivery, and the worker messages the deliveries came in.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from bench import report, taskhook
from bench.processes import wait_until
from migrations import upgrade_to_head
from models.db import make_engine

#: The settings each side runs with (the environment of its processes).
SIDES: dict[str, dict[str, str]] = {
    "default": {},
    "busy_handler": {"TASKHOOK_SQLITE_WRITER_LOCK": "false", "TASKHOOK_WORKER_CONCURRENCY": "4"},
    "normal": {"TASKHOOK_SQLITE_SYNCHRONOUS": "NORMAL"},
}
GOAL_PER_S = 400
CONCURRENCY = 8


def sqlite(bench: Any) -> dict[str, Any]:
    sizes = bench.sizes
    n = sizes.sqlite_deliveries
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for round_ in range(sizes.sqlite_rounds):
        sides = list(SIDES)
        order = sides[round_ % len(sides) :] + sides[: round_ % len(sides)]
        for side in order:
            run = _one_run(bench, side, n)
            runs[side].append(run)
            bench.say(
                f"  round {round_ + 1}, {side}: posted at {run['posted_per_s']}/s, end to end "
                f"{run['end_to_end_per_s']}/s ({run['end_to_end_s']} s); CPU per delivery: "
                f"ingress {run['cpu_ms_per_delivery']['ingress']} ms, "
                f"worker {run['cpu_ms_per_delivery']['worker']} ms"
            )
    # Each opt-in's end-to-end rate against the default's, round by round.
    ratios = {
        side: [
            report.ratio(run["end_to_end_per_s"], default["end_to_end_per_s"])
            for run, default in zip(runs[side], runs["default"], strict=True)
        ]
        for side in SIDES
        if side != "default"
    }
    medians = {
        side: {
            "end_to_end_per_s": report.median([run["end_to_end_per_s"] for run in entries]),
            "posted_per_s": report.median([run["posted_per_s"] for run in entries]),
            "cpu_ms_per_delivery": {
                process: report.median([run["cpu_ms_per_delivery"][process] for run in entries])
                for process in ("ingress", "worker")
            },
        }
        for side, entries in runs.items()
    }
    default = medians["default"]["end_to_end_per_s"]
    result = {
        "deliveries": n,
        "concurrency": CONCURRENCY,
        "sides": {side: dict(settings) for side, settings in SIDES.items()},
        "runs": runs,
        "medians": medians,
        "ratios_vs_default": ratios,
        "every_run_exact": all(run["exact"] for entries in runs.values() for run in entries),
        "goals": {
            "end_to_end_per_s": default,
            f"end_to_end_at_least_{GOAL_PER_S}_per_s": default >= GOAL_PER_S,
            **{f"{side}_vs_default_median": report.median(r) for side, r in ratios.items()},
        },
    }
    rows = []
    for side in SIDES:
        rows.append(_rate_row(f"posted, {side}", [run["posted_per_s"] for run in runs[side]]))
        rows.append(
            _rate_row(f"end to end, {side}", [run["end_to_end_per_s"] for run in runs[side]])
        )
    return bench.finish(
        result,
        rows,
        f"Embedded default: {n} deliveries, SQLite + filesystem broker, three settings",
        rate_label="per s",
    )


def _rate_row(label: str, rates: list[float]) -> dict[str, Any]:
    return {"label": label, "rate": report.median(rates), "low": min(rates), "high": max(rates)}


def _one_run(bench: Any, side: str, n: int) -> dict[str, Any]:
    procs = bench.processes
    folder = bench.logs / f"embedded-{side}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = folder / "taskhook.db"
    database = f"sqlite:///{path}"
    engine = make_engine(database)
    with engine.begin() as connection:
        upgrade_to_head(connection)
    engine.dispose()
    taskhook.prepare(database)
    env = taskhook.environment(
        database,
        "filesystem://",
        TASKHOOK_BROKER_FOLDER=str(folder / "broker"),
        # Celery's "received" line per message is how the run counts the
        # worker's messages; off by default, it costs ~0.08 ms of CPU a message.
        TASKHOOK_WORKER_LOG_EACH_TASK="true",
        **SIDES[side],
    )
    ingress, url = procs.uvicorn(f"ingress-{side}", "ingest.app:app", env)
    worker = procs.celery_worker(f"worker-{side}", "worker", env)
    try:
        cpu_before = {"ingress": ingress.cpu_seconds(), "worker": worker.cpu_seconds()}
        started = time.monotonic()
        posted = bench.load(url, tag=f"sqlite-{side}", requests=n, concurrency=CONCURRENCY)
        # The posts that were answered: a post that failed stored nothing, and
        # waiting for it would hold the run to the timeout (the run is then
        # not exact, and its errors are recorded).
        accepted = posted["completed"]
        wait_until(
            lambda: _finished(path) >= accepted,
            timeout=1800,
            what="every accepted delivery finished",
            every=0.2,
        )
        elapsed = time.monotonic() - started
        cpu = {
            "ingress": ingress.cpu_seconds() - cpu_before["ingress"],
            "worker": worker.cpu_seconds() - cpu_before["worker"],
        }
    finally:
        procs.stop(worker)
        procs.stop(ingress)
    counts = _counts(path)
    messages = worker.log.read_text(errors="replace").count("] received")
    return {
        "posted_per_s": posted["throughput_rps"],
        "post_errors": posted["errors"],
        "post_error_kinds": posted.get("error_kinds", {}),
        "post_latency": posted["latency"],
        "end_to_end_s": round(elapsed, 2),
        "end_to_end_per_s": round(n / elapsed, 1),
        "cpu_ms_per_delivery": {
            name: round(seconds / n * 1000, 2) for name, seconds in cpu.items()
        },
        "worker_messages": messages,
        **counts,
        "exact": counts["tasks"] == counts["tasks_settled"] == counts["claims"] == n
        and posted["completed"] == n
        and posted["errors"] == 0,
    }


def _finished(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path, timeout=10)) as connection:
        placeholders = ",".join("?" * len(taskhook.FINISHED))
        return connection.execute(
            f"SELECT count(*) FROM deliveries WHERE status IN ({placeholders})",
            taskhook.FINISHED,
        ).fetchone()[0]


def _counts(path: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(path, timeout=10)) as connection:
        tasks, settled = connection.execute(
            "SELECT count(*), count(external_id_settled_at) FROM tasks"
        ).fetchone()
        claims = connection.execute("SELECT coalesce(sum(attempts), 0) FROM deliveries").fetchone()
    return {"tasks": tasks, "tasks_settled": settled, "claims": claims[0]}
