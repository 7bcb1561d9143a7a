"""``python -m bench retries``: the drain on RabbitMQ while deliveries wait for retries.

A delivery that finds its issue's create unsettled waits and is sent again
with a countdown (docs/runbook.md, "RabbitMQ"). On RabbitMQ the message waits
in the broker's delayed-delivery queues; a worker that held such messages
instead would hold them unacknowledged, beside the work it should be doing.

Both cases start from the same database: W tasks whose creates never settled
(inserted unsettled, as a worker that died after its insert leaves them).
Then, each round in turn first, each on a virtual host of its own:

- **none waiting** (the baseline): N deliveries posted with no worker
  running, then one worker process (threads, as the Procfile starts it)
  drains them;
- **waiting**: first W deliveries of those held issues are taken by a
  worker, which finds each create unsettled and sends the delivery to wait
  for a retry minutes away; that worker stops (what it held goes back to the
  broker), the N are posted, and a new worker drains them while the W wait.

The held tasks are in both, and autovacuum is off for the benchmark's
tables: 200 tasks analyzed into the tasks table's statistics before a burst
of 10,000 creates halve the drain by themselves (the claim's lookup is then
planned for a tiny table; docs/performance.md, "Noticed and left alone"), and
whether autovacuum got there first made each run fast or slow at random. The
question here is what the waiting messages cost.

Timed from the worker's ready to the N done, as ``bench brokers`` times its
drains. Reported: each case's rate, the ratio waiting : none per round, and
how many of the W messages waited in RabbitMQ's delayed-delivery queues.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

import psycopg
from amqp.exceptions import NotFound
from kombu import Connection
from kombu.transport.native_delayed_delivery import MAX_LEVEL, level_name

from bench import report, taskhook
from bench.deliveries import DeliveryFactory
from bench.processes import BenchError, libpq_url, throwaway_database, wait_until
from models.providers import PROVIDERS

CASES = ("none_waiting", "waiting")

#: The waiting deliveries' issue numbers start here, far from the drained ones'.
WAITING_FIRST_NUMBER = 1_000_001

#: A first wait of 5-10 minutes: the W wait through the whole drain.
RETRY_SETTINGS = {"TASKHOOK_RETRY_BASE_SECONDS": "600", "TASKHOOK_RETRY_MAX_SECONDS": "1200"}

_UNSETTLED_TASK = """
INSERT INTO tasks (workspace_id, identifier, title, step_id, created_at, updated_at,
                   external_id, stable_key, external_id_settled_at, created_by_delivery)
VALUES (%(workspace)s, %(identifier)s, 'a create that never settled', %(step)s, now(), now(),
        %(external_id)s, %(stable_key)s, NULL, NULL)
"""


def retries(bench: Any) -> dict[str, Any]:
    sizes = bench.sizes
    n, waiting = sizes.retries_deliveries, sizes.retries_waiting
    runs: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    with throwaway_database() as database:
        taskhook.prepare(database)
        with psycopg.connect(libpq_url(database), autocommit=True) as watcher:
            for table in ("tasks", "deliveries"):
                watcher.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
            for round_ in range(sizes.retries_rounds):
                order = CASES if round_ % 2 == 0 else tuple(reversed(CASES))
                for case in order:
                    held = waiting if case == "waiting" else 0
                    run = _drain_beside(bench, database, watcher, n, held, round_)
                    runs[case].append(run)
                    bench.say(
                        f"  round {round_ + 1}, {case}: drained at {run['rate_per_s']}/s "
                        f"({run['waiting_in_broker']} waiting in RabbitMQ)"
                    )
    ratios = [
        report.ratio(held["rate_per_s"], none["rate_per_s"])
        for none, held in zip(runs["none_waiting"], runs["waiting"], strict=True)
    ]
    medians = {case: report.median([run["rate_per_s"] for run in runs[case]]) for case in CASES}
    result = {
        "benchmark": "retries",
        "deliveries": n,
        "waiting": waiting,
        "runs": runs,
        "ratios_waiting_vs_none": ratios,
        "goals": {
            "none_waiting_drain_per_s": medians["none_waiting"],
            "waiting_drain_per_s": medians["waiting"],
            # report.median keeps one decimal, too few for a ratio.
            "waiting_vs_none": round(statistics.median(ratios), 3),
            "waiting_vs_none >= 0.9": statistics.median(ratios) >= 0.9,
            "every waiting message waits in RabbitMQ": all(
                run["waiting_in_broker"] == waiting for run in runs["waiting"]
            ),
        },
    }
    rows = [{"label": case.replace("_", " "), "rate": rate} for case, rate in medians.items()]
    return bench.finish(
        result, rows, f"Drain of {n} deliveries on RabbitMQ, {waiting} waiting for retries (per s)"
    )


def _drain_beside(
    bench: Any, database: str, watcher: psycopg.Connection, n: int, waiting: int, round_: int
) -> dict[str, Any]:
    procs = bench.processes
    taskhook.reset(database)
    _unsettled_tasks(database, taskhook.tag(f"retries-held-{round_}"), bench.sizes.retries_waiting)
    url = procs.rabbitmq()
    env = taskhook.environment(database, url, **RETRY_SETTINGS)
    ingress, ingress_url = procs.uvicorn(f"ingress-retries-{round_}", "ingest.app:app", env)
    try:
        if waiting:
            _wait_for_retries(bench, database, watcher, ingress_url, env, waiting, round_)
        in_broker = _waiting_in_broker(url)
        posted = bench.load(
            ingress_url,
            tag=taskhook.tag(f"retries-{round_}-{waiting}"),
            requests=n,
            concurrency=bench.sizes.concurrency,
        )
        if posted["completed"] != n:
            raise BenchError(f"the ingress answered {posted['completed']} of {n}")
        seconds = taskhook.timed_drain(
            procs,
            f"worker-retries-{round_}-{waiting}",
            env,
            watcher,
            n,
            what=f"{n} deliveries done beside {waiting} waiting",
        )
        counts = taskhook.outcome_counts(database)
    finally:
        procs.stop(ingress)
    statuses = counts["deliveries_by_status"]
    if statuses.get("done") != n or statuses.get("processing", 0) != waiting:
        raise BenchError(f"expected {n} done and {waiting} waiting: {counts}")
    if counts["tasks_settled"] != n or counts["tasks"] != n + bench.sizes.retries_waiting:
        raise BenchError(f"not one settled task per delivery: {counts}")
    return {
        "seconds": round(seconds, 2),
        "rate_per_s": round(n / seconds, 1),
        "waiting_in_broker": in_broker,
    }


def _wait_for_retries(
    bench: Any,
    database: str,
    watcher: psycopg.Connection,
    ingress_url: str,
    env: dict[str, str],
    waiting: int,
    round_: int,
) -> None:
    """``waiting`` deliveries of the held issues (:func:`_unsettled_tasks`),
    each sent by a worker to wait for its retry; that worker stopped."""
    tag = taskhook.tag(f"retries-held-{round_}")
    posted = bench.load(
        ingress_url, tag=tag, requests=waiting, first_number=WAITING_FIRST_NUMBER, concurrency=8
    )
    if posted["completed"] != waiting:
        raise BenchError(f"the ingress answered {posted['completed']} of {waiting}")
    procs = bench.processes
    worker = procs.celery_worker(f"worker-holds-{round_}", "worker", env, wait=False)
    try:
        procs.wait_ready(worker)
        wait_until(
            lambda: _count_waiting(watcher) >= waiting,
            timeout=600,
            what=f"{waiting} deliveries waiting for their retries",
            every=0.1,
        )
    finally:
        procs.stop(worker)


def _unsettled_tasks(database: str, tag: str, count: int) -> None:
    """A task for each of the ``count`` deliveries' issues, inserted and never
    settled; its names are the ones the worker reads from that delivery."""
    factory = DeliveryFactory(
        secret=taskhook.SECRET,
        sources=taskhook.SOURCES,
        tag=tag,
        first_number=WAITING_FIRST_NUMBER,
    )
    with psycopg.connect(libpq_url(database), autocommit=True) as connection:
        workspace, step = connection.execute(
            "SELECT w.id, s.id FROM workspaces w JOIN workflow_steps s ON s.workspace_id = w.id "
            "ORDER BY s.position LIMIT 1"
        ).fetchone()
        with connection.transaction():
            for index in range(count):
                chosen = factory.templates[index % len(factory.templates)]
                payload = json.loads(factory.delivery(index).body)
                draft = PROVIDERS[chosen.provider].to_draft(chosen.event, payload)
                connection.execute(
                    _UNSETTLED_TASK,
                    {
                        "workspace": workspace,
                        "step": step,
                        "identifier": f"HELD-{index + 1}",
                        "external_id": draft.external_id,
                        "stable_key": draft.stable_key,
                    },
                )


def _count_waiting(watcher: psycopg.Connection) -> int:
    return watcher.execute(
        "SELECT count(*) FROM deliveries WHERE status = 'processing' "
        "AND status_reason LIKE 'waiting:%%'"
    ).fetchone()[0]


def _waiting_in_broker(url: str) -> int:
    """Messages in RabbitMQ's delayed-delivery queues now (none declared: 0)."""
    total = 0
    with Connection(url) as connection:
        for level in range(MAX_LEVEL + 1):
            try:
                declared = connection.default_channel.queue_declare(level_name(level), passive=True)
            except NotFound:  # no worker declared them yet
                return total
            total += declared.message_count
    return total
