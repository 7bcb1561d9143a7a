"""``python -m bench messages``: the drain with one message per delivery, and
PostgreSQL's CPU per delivery against pgbench's bare create, in the same run.

The relay's shared messages (``TASKHOOK_RELAY_KEYS_PER_MESSAGE``) spread
Celery's cost per message over many deliveries; here each delivery is its own
message, as a sender whose deliveries arrive one at a time gets. Each round
drains the same deliveries as ``bench e2e`` does (the no-op drain first in
even rounds, last in odd ones) with 1 and then 2 worker processes, then runs
``bench.pgcreate``'s pgbench bare create on the same database with as many
connections as the two processes' threads. The ratios are taken per round and
their medians reported:

- the drain against the Celery no-op drain (goal: >= 0.7x with 2 processes),
  and beside it, with the most processes, the drain of the bare create in a
  Celery task (``bench.bare_create``): the ceiling of that goal for any
  worker that creates a task per message;
- PostgreSQL's CPU per delivery against its CPU per bare create (goal:
  <= 1.3x): the CPU of the benchmark database's own backends over the
  2-process drain, and over pgbench's steady window; and beside it, pgbench
  running the contract's writes in plain SQL (``bench/pgbench_contract.sql``,
  on deliveries stored for it), the least any implementation of the
  contract asks of PostgreSQL per create. The CPU of every
  ``postgres`` process (as ``bench e2e`` counts it) is reported beside it; on
  a shared server a neighbour's queries, and backends that exit, move that one.
"""

from __future__ import annotations

import statistics
import uuid
from dataclasses import fields, replace
from typing import Any

from bench import pgcreate, report
from bench.bare_create import BARE_CREATE
from bench.drains import (
    EndToEndRig,
    Starter,
    drain,
    drain_rows,
    end_to_end_rig,
    enqueue,
    flush,
    queue_length,
    settled_goals,
    summary_of_rounds,
)
from models.settings import DEFAULT_WORKER_CONCURRENCY

#: Goals of issue 20, section 2.
DRAIN_GOAL = 0.7
POSTGRES_CPU_GOAL = 1.3
ONE_KEY_PER_MESSAGE = 1


def messages(bench: Any) -> dict[str, Any]:
    sizes = bench.sizes
    # The rig drains e2e_deliveries; this benchmark's own count stands in.
    bench.sizes = replace(sizes, e2e_deliveries=sizes.messages_deliveries)
    threads = DEFAULT_WORKER_CONCURRENCY  # its workers run on PostgreSQL
    clients = threads * max(sizes.messages_workers)
    drains: dict[int, list[dict[str, Any]]] = {workers: [] for workers in sizes.messages_workers}
    baselines: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    with end_to_end_rig(bench, ONE_KEY_PER_MESSAGE) as shared:
        pgcreate.pgbench_path()  # before the first drain: say it is missing early
        workspace_id = pgcreate.prepare_workspace(shared.database)
        rig = _backends_counted(shared)
        for round_ in range(sizes.messages_rounds):
            for workers in sizes.messages_workers:
                record, _peaks = rig.one_round(workers, round_)
                drained = record["taskhook_drain"]
                drained["database_backends_cpu_ms_per_delivery"] = rig.backends_cpu_ms_per_delivery
                drained["database_backends_deliveries_counted"] = rig.counted
                bench.say(
                    f"  round {round_}, {workers} process(es): the database's backends spent "
                    f"{rig.backends_cpu_ms_per_delivery} ms of CPU per delivery "
                    f"(the last {rig.counted})"
                )
                if workers == max(sizes.messages_workers):
                    bare = _drain_bare_creates(rig, workers, workspace_id)
                    record["bare_create_drain"] = bare
                    record["bare_create_ratio"] = report.ratio(
                        bare["rate_per_s"], record["noop_drain"]["rate_per_s"]
                    )
                    bench.say(
                        f"  round {round_}, {workers} process(es): the bare create in a Celery"
                        f" task drains at {record['bare_create_ratio']}x no-op"
                    )
                drains[workers].append(record)
            for what, pgbench, measured in (
                ("bare create", pgcreate.bare_create, baselines),
                ("contract's writes", pgcreate.contract_floor, floors),
            ):
                one = pgbench(
                    bench.processes,
                    rig.database,
                    workspace_id=workspace_id,
                    clients=clients,
                    seconds=sizes.messages_pgbench_seconds,
                )
                measured.append(one)
                bench.say(
                    f"  round {round_}, pgbench {what}, {clients} clients: "
                    f"{one['rate_per_s']}/s; CPU ms per create {one['cpu_ms_per_create']}"
                )
    bench.sizes = sizes
    return _report(bench, drains, baselines, floors, clients)


class _BackendsWindow:
    """The CPU of a database's backends over a drain of ``total`` one-delivery
    messages, after its first tenth: the workers' connections are new, and
    each plans its statements on their first executions (psycopg prepares
    them on the fifth), as pgbench's connections do in its warm-up. Read when
    the broker has handed out a tenth of the messages, and again when the
    drain is found done. Unlike every ``postgres`` process's CPU, this leaves
    out a neighbour's work on the shared server, and a backend that exits
    meanwhile cannot make it negative."""

    def __init__(self, watcher: Any, total: int) -> None:
        self.watcher, self.total = watcher, total
        #: CPU seconds of the counted part, and its deliveries.
        self.cpu, self.counted = 0.0, 0
        self._before: dict[int, float] | None = None
        self._taken_before = 0

    def check(self, queued: int, done: bool) -> None:
        """Called with the queue's length, and whether the drain is done."""
        # One message per delivery: a message gone from the queue is a delivery taken.
        taken = self.total - queued
        if self._before is None and not self.counted and taken >= self.total // 10:
            self._before = pgcreate.database_backends_cpu(self.watcher)
            self._taken_before = taken
        if done and self._before is not None:
            after = pgcreate.database_backends_cpu(self.watcher)
            self.cpu = pgcreate.backends_cpu_between(self._before, after)
            self.counted = self.total - self._taken_before
            self._before = None

    @property
    def ms_per_delivery(self) -> float:
        return round(1000 * self.cpu / self.counted, 3) if self.counted else 0.0


def _backends_counted(rig: Any) -> Any:
    """``rig`` (``bench.drains``' end-to-end rig), also counting the CPU of its
    database's backends over each taskhook drain (:class:`_BackendsWindow`)."""

    class BackendsCounted(EndToEndRig):
        window: _BackendsWindow | None = None

        def post_deliveries(self, workers: int) -> dict:
            self.window = _BackendsWindow(self.watcher, self.deliveries)
            return super().post_deliveries(workers)

        def all_done(self) -> bool:
            queued = queue_length(self.client)
            done = super().all_done()
            self.window.check(queued, done)
            return done

        @property
        def backends_cpu_ms_per_delivery(self) -> float:
            return self.window.ms_per_delivery

        @property
        def counted(self) -> int:
            return self.window.counted

    return BackendsCounted(**{field.name: getattr(rig, field.name) for field in fields(rig)})


def _drain_bare_creates(rig: Any, workers: int, workspace_id: int) -> dict[str, Any]:
    """The ceiling: ``workers`` Celery processes draining one bare create per
    message (``bench.bare_create``), as many as the taskhook drain's
    deliveries; its rate, its CPU per create, and whether each created and
    settled exactly one task."""
    n = rig.deliveries
    run = uuid.uuid4().hex[:12]
    flush(rig.redis_url)
    enqueue(rig.redis_url, BARE_CREATE, ([workspace_id, f"bare-{run}-{i}"] for i in range(n)))
    window = _BackendsWindow(rig.watcher, n)

    def done() -> bool:
        queued = queue_length(rig.client)
        finished = rig.noop_done()
        window.check(queued, finished)
        return finished

    starter = Starter(
        rig.bench.processes, f"bare-p{workers}", "bench.bare_create", rig.env, workers
    )
    try:
        drained = drain(starter, n, n, rig.redis_url, done)
    finally:
        starter.stop()
    created, settled = rig.watcher.execute(
        "SELECT count(*), count(external_id_settled_at) FROM tasks"
        " WHERE workspace_id = %s AND external_id LIKE %s",
        (workspace_id, f"bare-{run}-%"),
    ).fetchone()
    drained["database_backends_cpu_ms_per_create"] = window.ms_per_delivery
    drained["database_backends_creates_counted"] = window.counted
    drained["exact"] = created == settled == n
    rig.bench.say(
        f"  bare create in a Celery task, {workers} process(es): {drained['rate_per_s']}/s;"
        f" CPU ms per create {drained['cpu_ms_per_delivery']},"
        f" the database's backends {window.ms_per_delivery}"
    )
    return drained


def _bare_create_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The ceiling's rounds: its drain against the no-op's (how near the drain
    goal a worker that only creates gets), taskhook's drain against it, and
    PostgreSQL's CPU per create in Celery's shape beside taskhook's."""
    ratios = [r["bare_create_ratio"] for r in rounds]
    taskhook_vs_bare = [
        report.ratio(r["taskhook_drain"]["rate_per_s"], r["bare_create_drain"]["rate_per_s"])
        for r in rounds
    ]
    postgres_vs_bare = [
        report.ratio(
            r["taskhook_drain"]["database_backends_cpu_ms_per_delivery"],
            r["bare_create_drain"]["database_backends_cpu_ms_per_create"],
        )
        for r in rounds
    ]
    return {
        "rounds": [r["bare_create_drain"] for r in rounds],
        "ratio_vs_noop": statistics.median(ratios),
        "ratios_vs_noop_per_round": ratios,
        "taskhook_drain_vs_bare_create": statistics.median(taskhook_vs_bare),
        "taskhook_drain_vs_bare_create_per_round": taskhook_vs_bare,
        "postgres_cpu_taskhook_vs_bare_create": statistics.median(postgres_vs_bare),
        "postgres_cpu_taskhook_vs_bare_create_per_round": postgres_vs_bare,
        "exact": all(r["bare_create_drain"]["exact"] for r in rounds),
    }


def _per_round(numerators: list[float], denominators: list[float]) -> list[float]:
    return [report.ratio(n, d) for n, d in zip(numerators, denominators, strict=True)]


def _report(
    bench: Any,
    drains: dict[int, list[dict[str, Any]]],
    baselines: list[dict[str, Any]],
    floors: list[dict[str, Any]],
    clients: int,
) -> dict[str, Any]:
    configs = {workers: summary_of_rounds(rounds) for workers, rounds in drains.items()}
    labelled = {f"{workers} process(es)": config for workers, config in configs.items()}
    most = max(configs)
    taskhook_postgres = [
        r["taskhook_drain"]["database_backends_cpu_ms_per_delivery"] for r in drains[most]
    ]
    bare_postgres = [b["cpu_ms_per_create"]["database_backends"] for b in baselines]
    floor_postgres = [f["cpu_ms_per_create"]["database_backends"] for f in floors]
    cpu_ratios = _per_round(taskhook_postgres, bare_postgres)
    server_ratios = _per_round(
        [r["taskhook_drain"]["cpu_ms_per_delivery"]["postgres"] for r in drains[most]],
        [b["cpu_ms_per_create"]["postgres"] for b in baselines],
    )
    cpu_ratio = statistics.median(cpu_ratios)
    drain_ratio = configs[most]["ratio_vs_noop"]
    rows = drain_rows(labelled)
    rows.append(
        {
            "label": f"pgbench bare create\n{clients} clients",
            "rate": report.median([b["rate_per_s"] for b in baselines]),
        }
    )
    bare = _bare_create_summary(drains[most])
    floor_ratios = _per_round(taskhook_postgres, floor_postgres)
    floor_vs_bare = _per_round(floor_postgres, bare_postgres)
    rows.append(
        {
            "label": f"bare create task\n{most} process(es)",
            "rate": report.median([r["bare_create_drain"]["rate_per_s"] for r in drains[most]]),
        }
    )
    result = {
        "deliveries": bench.sizes.messages_deliveries,
        "bare_create_in_celery": bare,
        "relay_keys_per_message": ONE_KEY_PER_MESSAGE,
        "configs": {f"{workers} worker process(es)": config for workers, config in configs.items()},
        "pgbench_bare_create": {
            "clients": clients,
            "rounds": baselines,
            "rate_per_s": report.median([b["rate_per_s"] for b in baselines]),
            "cpu_ms_per_create": {
                side: round(statistics.median(b["cpu_ms_per_create"][side] for b in baselines), 3)
                for side in ("postgres", "database_backends")
            },
        },
        # The contract's writes in plain SQL (bench/pgbench_contract.sql): what
        # any implementation of docs/contract.md writes per create, against the
        # bare create, and taskhook against it.
        "pgbench_contract_writes": {
            "clients": clients,
            "rounds": floors,
            "cpu_ms_per_create": report.median(
                [f["cpu_ms_per_create"]["database_backends"] for f in floors]
            ),
            "vs_bare_create": statistics.median(floor_vs_bare),
            "vs_bare_create_per_round": floor_vs_bare,
            "taskhook_vs_contract_writes": statistics.median(floor_ratios),
            "taskhook_vs_contract_writes_per_round": floor_ratios,
        },
        "postgres_cpu_per_delivery_vs_bare_create": {
            "worker_processes": most,
            "taskhook_ms_per_delivery": taskhook_postgres,
            "pgbench_ms_per_create": bare_postgres,
            "ratio": cpu_ratio,
            "ratios_per_round": cpu_ratios,
            # The same, over every postgres process (as bench e2e counts it):
            # a neighbour's work on the shared server, and backends exiting, move it.
            "every_postgres_process_ratios_per_round": server_ratios,
        },
        "goals": {
            f"drain >= {DRAIN_GOAL}x no-op, one message per delivery, {most} processes": (
                drain_ratio >= DRAIN_GOAL
            ),
            f"PostgreSQL CPU per delivery <= {POSTGRES_CPU_GOAL}x pgbench's bare create": (
                cpu_ratio <= POSTGRES_CPU_GOAL
            ),
        }
        | settled_goals(labelled),
    }
    return bench.finish(
        result,
        rows,
        f"One message per delivery: {bench.sizes.messages_deliveries} deliveries",
        rate_label="deliveries, tasks or creates per s",
    )
