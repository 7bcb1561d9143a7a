"""``python -m bench catch-up``: recover N deliveries from GitHub's delivery log.

N issues were opened while the ingress was down: the fake GitHub
(``bench.fakes.github_api``, a real HTTP server in this process) logs N failed
deliveries. Two readers of that log run side by side, each in a process of its
own, each round in turn first:

- **the bare read** (the baseline): one httpx client lists the log and GETs
  every delivery, storing nothing -- the floor any catch-up pays for GitHub's
  API;
- **taskhook**: ``taskhook catch-up github`` as an operator runs it, which
  also looks each guid up in the inbox, reads and stores each delivery
  through the ingress's own path (one commit each) and hands it to the broker.

Reported: deliveries per second of each and their ratio, each process's peak
RSS (sampled every 0.1 s), and that a second run finds nothing to recover.
No worker runs: the tasks are the worker's business, measured by ``e2e``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import psycopg

from bench import report, taskhook
from bench.fakes.github_api import FakeGitHub
from bench.processes import BenchError, Process, libpq_url, throwaway_database
from models.catchup import set_log_access
from models.db import make_engine, make_session_factory, session_scope

TOKEN = "ghp_bench_catch_up"
REPO = "bench/widgets"
HOOK_ID = "4242"
HOOK = f"repos/{REPO}/hooks/{HOOK_ID}"
SOURCE = taskhook.SOURCES["github"]
SAMPLE_EVERY = 0.1


def catch_up(bench: Any) -> dict[str, Any]:
    sizes, procs = bench.sizes, bench.processes
    n = sizes.catchup_deliveries
    redis_url = procs.redis()
    with throwaway_database() as database, FakeGitHub(token=TOKEN) as github:
        taskhook.prepare(database)
        _grant_log_access(database, github.base_url)
        started = time.monotonic()
        _log_failed_deliveries(github, n)
        bench.say(f"  logged {n} failed deliveries in {time.monotonic() - started:.1f} s")
        env = taskhook.environment(database, redis_url)
        runs: dict[str, list[dict[str, Any]]] = {"bare read": [], "taskhook": []}
        reruns: list[dict[str, Any]] = []
        for round_ in range(sizes.catchup_rounds):
            order = ["bare read", "taskhook"] if round_ % 2 == 0 else ["taskhook", "bare read"]
            for name in order:
                if name == "taskhook":
                    _forget_recovered(database)
                    runs[name].append(_timed(procs, "taskhook", _cli(), env, n))
                    reruns.append(_timed(procs, "taskhook-again", _cli(), env, 0))
                else:
                    runs[name].append(_timed(procs, "bare-read", _bare(github.base_url), env, n))
                bench.say(f"  round {round_ + 1}, {name}: {_brief(runs[name][-1])}")
        stored = _recovered_count(database)

    if stored != n or any(run["recovered"] for run in reruns):
        raise BenchError(f"catch-up stored {stored} of {n}; reruns: {reruns}")
    medians = {
        name: {
            "rate_per_s": report.median([run["rate_per_s"] for run in entries]),
            "peak_rss_mib": max(run["peak_rss_mib"] for run in entries),
        }
        for name, entries in runs.items()
    }
    ratio = medians["taskhook"]["rate_per_s"] / medians["bare read"]["rate_per_s"]
    result = {
        "benchmark": "catch-up",
        "deliveries": n,
        "runs": runs,
        "reruns": reruns,
        "medians": medians,
        "goals": {
            "rate_vs_bare_read": round(ratio, 3),
            "taskhook_rate_per_s": round(medians["taskhook"]["rate_per_s"], 1),
            "taskhook_peak_rss_mib": medians["taskhook"]["peak_rss_mib"],
            "rerun_recovered": max(run["recovered"] for run in reruns),
        },
    }
    rows = [{"label": name, "rate": entry["rate_per_s"]} for name, entry in medians.items()]
    return bench.finish(result, rows, f"Catch-up of {n} deliveries from GitHub's log (per s)")


def _grant_log_access(database: str, api_base_url: str) -> None:
    engine = make_engine(database)
    try:
        with session_scope(make_session_factory(engine)) as session:
            set_log_access(
                session=session,
                slug=SOURCE,
                target=f"repos/{REPO}",
                hook_id=HOOK_ID,
                token=TOKEN,
                api_base_url=api_base_url,
            )
    finally:
        engine.dispose()


def _log_failed_deliveries(github: FakeGitHub, n: int) -> None:
    for number in range(1, n + 1):
        github.log_delivery(
            hook=HOOK,
            event="issues",
            action="opened",
            payload=_issue(number),
            status_code=0,  # the ingress was down: GitHub got no answer
        )


def _issue(number: int) -> dict[str, Any]:
    return {
        "action": "opened",
        "issue": {
            "number": number,
            "title": f"Opened during the outage, #{number}",
            "body": "Steps to reproduce: ...",
            "html_url": f"https://github.com/{REPO}/issues/{number}",
        },
        "repository": {"full_name": REPO},
    }


def _forget_recovered(database: str) -> None:
    """Empty the inbox and the runs, so each round recovers all N again."""
    taskhook.reset(database)
    with psycopg.connect(libpq_url(database), autocommit=True) as connection:
        connection.execute("TRUNCATE catchup_runs RESTART IDENTITY")


def _recovered_count(database: str) -> int:
    with psycopg.connect(libpq_url(database)) as connection:
        return connection.execute(
            "SELECT count(*) FROM deliveries WHERE origin = 'catch-up'"
        ).fetchone()[0]


def _cli() -> list[str]:
    return [sys.executable, "-m", "worker.cli", "catch-up", "github", "--source", SOURCE, "--json"]


def _bare(api_base_url: str) -> list[str]:
    return [sys.executable, "-m", "bench.bare_log_read", api_base_url, HOOK, TOKEN]


def _timed(procs: Any, name: str, args: list[str], env: dict[str, str], n: int) -> dict:
    """Run ``args`` to its end, sampling its RSS; its rate over ``n`` deliveries."""
    process: Process = procs.start(name, args, env)
    started = time.monotonic()
    peak = 0
    while process.alive():
        peak = max(peak, sum(process.rss().values()))
        time.sleep(SAMPLE_EVERY)
    seconds = time.monotonic() - started
    procs.stop(process)
    if process.popen.returncode != 0:
        raise BenchError(f"{name} failed\n{process.tail()}")
    output = process.log.read_text()
    answer = json.loads(output[output.index("{") :])
    if len(answer["recovered"]) != n:
        raise BenchError(f"{name} recovered {len(answer['recovered'])} of {n}\n{process.tail()}")
    return {
        "seconds": round(seconds, 2),
        "rate_per_s": round(n / seconds, 1) if n else 0.0,
        "peak_rss_mib": round(peak / 2**20, 1),
        "recovered": len(answer["recovered"]),
    }


def _brief(run: dict[str, Any]) -> str:
    return f"{run['rate_per_s']}/s in {run['seconds']} s, peak RSS {run['peak_rss_mib']} MiB"
