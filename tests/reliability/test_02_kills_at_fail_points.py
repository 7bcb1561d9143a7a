"""Scenario 2: workers SIGKILLed at each fail point, 100 deliveries per point ->
nothing lost, no duplicate.

For each fail point (after the insert commits, before settle, after settle
before the inbox row is done, after commit before the broker ack), 100
deliveries -- 80 Jira issues, 20 of them delivered twice -- go through a real
uvicorn to two workers that SIGKILL themselves at that point on one hit in ten
(``TASKHOOK_FAILPOINT=<point>:kill@0.1``):

- a prefork worker (two children): a killed child's message is rejected back
  to the queue and the pool forks a new child;
- a worker in the shape taskhook ships (the threads pool, 4 threads): the
  whole process dies with every message it was running unacknowledged in
  Redis; a supervisor (as systemd would) starts it again.

Beat runs apart, as in the Procfile. Every delivery must end done, every
issue must have exactly one settled task with one source link. Recovery time
is measured per kill, from the fail point's line (it prints the delivery and
the time) to that delivery's row becoming done; it is dominated by the lease
(3 s here; 90 s in production) and the sweep interval (1 s here; 30 s).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from models.db import session_scope
from models.tables import Delivery as DeliveryRow
from models.tables import Task, TaskSource, WebhookSource
from models.tokens import issue_token
from tests.support.invariants import assert_invariants
from tests.support.processes import Ingress, WorkerProcess, wait_until
from tests.support.stack import (
    Stack,
    add_tenant,
    database_view,
    kills_in,
    outcomes,
    scaled,
    taskhook,
    tasks_by_external_id,
)
from tests.support.traffic import post_all

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

SCENARIO = "2. SIGKILL at each fail point, 100 deliveries per point"
POINTS = ["after_insert", "before_settle", "after_settle", "before_ack"]
KILL_CHANCE = 0.1
#: A short lease, so a dead worker's delivery is sent again within seconds; a
#: queued row is re-sent only after 5 s, so the backlog is not sent twice.
TIMINGS = {
    "TASKHOOK_TASK_TIME_LIMIT_SECONDS": "2",
    "TASKHOOK_LEASE_SECONDS": "3",
    "TASKHOOK_QUEUED_GRACE_SECONDS": "5",
}
MAX_RESTARTS = 60


@dataclass
class Rig:
    stack: Stack
    ingress: Ingress
    engine: Engine
    sessions: sessionmaker[Session]


@pytest.fixture(scope="module")
def rig(private_redis, shared_database, stack_on):
    engine, sessions = database_view(shared_database.url)
    stack = stack_on(shared_database.url, private_redis.url, **TIMINGS)
    ingress = stack.ingress()
    stack.beat()
    try:
        yield Rig(stack, ingress, engine, sessions)
    finally:
        stack.stop_all()
        engine.dispose()


@dataclass
class Supervisor:
    """Starts the threads worker again whenever it dies, as systemd's Restart=always."""

    stack: Stack
    name: str
    env: dict[str, str]
    current: WorkerProcess | None = None
    restarts: int = 0
    stopping: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    errors: list[str] = field(default_factory=list)

    def start(self) -> None:
        self.current = self.stack.worker(self.name, **self.env)
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopping.wait(0.1):
            if self.current.process.poll() is None:
                continue
            if self.restarts >= MAX_RESTARTS:
                self.errors.append(f"{self.name} died more than {MAX_RESTARTS} times")
                return
            self.restarts += 1
            self.current = self.stack.worker(self.name, wait=False, **self.env)

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=10)


def recovery_seconds(rig: Rig, kills: list[dict]) -> list[float]:
    """For each kill: from its line to its delivery's row becoming done."""
    pks = {int(kill["delivery"]) for kill in kills if kill["delivery"]}
    with rig.sessions() as session:
        done_at = dict(
            session.execute(
                select(DeliveryRow.id, DeliveryRow.updated_at).where(DeliveryRow.id.in_(pks))
            ).all()
        )
    return [
        max(0.0, done_at[int(kill["delivery"])].timestamp() - float(kill["at"]))
        for kill in kills
        if kill["delivery"]
    ]


@pytest.mark.parametrize("point", POINTS)
def test_kills_at_a_fail_point_lose_nothing_and_duplicate_nothing(
    rig: Rig, point: str, secret_book, figures
):
    tenant = add_tenant(rig.sessions, secret_book, f"kill-{point.replace('_', '-')}", "KILL")
    issues = scaled(80)
    keys = [f"K-{n}" for n in range(1, issues + 1)]
    twice = keys[: scaled(20)]
    deliveries = [tenant.jira(key) for key in keys + twice]
    random.Random(point).shuffle(deliveries)

    kill = {
        "TASKHOOK_FAILPOINT": f"{point}:kill@{KILL_CHANCE}",
        # A threads worker killed here loses every attempt it held, and the
        # sweeper hands those deliveries to the next worker together: at one
        # kill in ten hits a delivery can be in five dying workers in a row
        # and be parked for an operator (TASKHOOK_MAX_LOST_ATTEMPTS, 5: for a
        # message that kills every worker), which this scenario is not about
        # (tests/integration/worker/test_lost_attempts.py is).
        "TASKHOOK_MAX_LOST_ATTEMPTS": "100",
    }
    logs_before = len(rig.stack.processes)
    pool = rig.stack.worker(f"pool-{point}", pool="prefork", concurrency=2, wait=False, **kill)
    threads = Supervisor(rig.stack, f"threads-{point}", kill)
    threads.start()
    pool.wait_ready()
    try:
        started = time.monotonic()
        answers = post_all(rig.ingress.url, deliveries, concurrency=20)
        assert answers.statuses() == {202: len(deliveries)}
        pks = [answer.body["delivery"] for answer in answers.accepted()]

        def all_done() -> bool:
            with rig.sessions() as session:
                return session.scalar(
                    select(func.count())
                    .select_from(DeliveryRow)
                    .where(DeliveryRow.id.in_(pks), DeliveryRow.status.in_(["done"]))
                ) == len(pks)

        wait_until(
            all_done, timeout=180, what=f"{len(pks)} deliveries done", logs=rig.stack.processes
        )
        elapsed = time.monotonic() - started
    finally:
        threads.stop()
        for process in rig.stack.processes[logs_before:]:
            process.stop()
    assert threads.errors == []

    text = "\n".join(process.text() for process in rig.stack.processes[logs_before:])
    kills = [kill for kill in kills_in(text) if kill["point"] == point]
    assert kills, f"nothing was killed at {point}: the scenario proved nothing"
    whole_worker = threads.restarts

    # Nothing lost: every delivery done; no duplicate: one task per issue.
    assert tasks_by_external_id(rig.sessions, tenant.workspace_id) == {
        f"jira:{key}": 1 for key in keys
    }
    assert outcomes(rig.sessions, tenant.workspace_id) == {
        ("done", "created"): issues,
        ("done", "found_settled"): len(twice),
    }
    with rig.sessions() as session:
        unsettled = session.scalar(
            select(func.count())
            .select_from(Task)
            .where(Task.workspace_id == tenant.workspace_id, Task.external_id_settled_at.is_(None))
        )
        links = session.scalar(
            select(func.count())
            .select_from(TaskSource)
            .join(Task, Task.id == TaskSource.task_id)
            .where(Task.workspace_id == tenant.workspace_id)
        )
        retried = session.scalar(
            select(func.count())
            .select_from(DeliveryRow)
            .join(WebhookSource, WebhookSource.id == DeliveryRow.source_id)
            .where(WebhookSource.workspace_id == tenant.workspace_id, DeliveryRow.attempts > 1)
        )
    assert (unsettled, links) == (0, issues)
    assert_invariants(rig.engine)

    recovery = recovery_seconds(rig, kills)
    figures.record(
        SCENARIO,
        **{
            point: {
                "deliveries": len(pks),
                "issues": issues,
                "kills": len(kills),
                "of_them_whole_threads_worker": whole_worker,
                "deliveries_claimed_more_than_once": retried,
                "tasks": issues,
                "duplicates": 0,
                "lost": 0,
                "recovery_s_median": round(statistics.median(recovery), 2) if recovery else None,
                "recovery_s_max": round(max(recovery), 2) if recovery else None,
                "seconds_posts_to_all_done": round(elapsed, 1),
            }
        },
    )


@pytest.mark.parametrize("fast_path", ["true", "false"], ids=["fast-path-on", "fast-path-off"])
def test_a_task_deleted_after_its_worker_died_is_not_created_again(
    rig: Rig, fast_path: str, secret_book, module_logs
):
    """A worker SIGKILLed right after the insert leaves the task unsettled; an
    operator deletes it over REST; when the sweeper sends the delivery again,
    it parks as needs_operator instead of creating the task again, and
    ``taskhook explain`` names the deleted task (docs/contract.md, "Fencing
    the create")."""
    tenant = add_tenant(rig.sessions, secret_book, f"deleted-{fast_path}", "DEL")
    with session_scope(rig.sessions) as session:
        token = issue_token(
            session=session, name="ops", role="operator", workspace_ids=[tenant.workspace_id]
        ).token
    path = {"TASKHOOK_WORKER_FAST_PATH": fast_path}
    logs_before = len(rig.stack.processes)
    killed = rig.stack.worker(f"killed-{fast_path}", TASKHOOK_FAILPOINT="after_insert:kill", **path)
    try:
        (answer,) = post_all(rig.ingress.url, [tenant.jira("DEL-1")], concurrency=1).accepted()
        pk = answer.body["delivery"]
        wait_until(lambda: killed.process.poll() is not None, timeout=30, what="the kill")
        with rig.sessions() as session:
            (task,) = session.scalars(
                select(Task).where(Task.workspace_id == tenant.workspace_id)
            ).all()
        assert (task.external_id, task.external_id_settled_at) == ("jira:DEL-1", None)

        deleted = httpx.delete(
            f"{rig.ingress.url}/api/v1/tasks/{task.id}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert deleted.status_code == 204
        rig.stack.worker(f"healthy-{fast_path}", **path)

        def parked() -> bool:
            with rig.sessions() as session:
                return session.get(DeliveryRow, pk).status == "needs_operator"

        wait_until(parked, timeout=60, what="the delivery parked", logs=rig.stack.processes)
    finally:
        for process in rig.stack.processes[logs_before:]:
            process.stop()

    with rig.sessions() as session:
        row = session.get(DeliveryRow, pk)
        left = session.scalar(
            select(func.count()).select_from(Task).where(Task.workspace_id == tenant.workspace_id)
        )
    assert "deleted before its creation settled" in row.status_reason
    assert (left, row.created_task_id, row.attempts) == (0, task.id, 2)
    explained = taskhook(
        rig.stack.database_url,
        rig.stack.broker_url,
        module_logs / "taskhook-cli.log",
        "explain",
        "--workspace",
        tenant.slug,
        "jira:DEL-1",
    )
    assert explained.returncode == 0, explained.stderr
    assert f"Deleted: task {task.id} held it" in explained.stdout
    assert f"(deliveries that touched it: {pk})" in explained.stdout
    assert_invariants(rig.engine)
