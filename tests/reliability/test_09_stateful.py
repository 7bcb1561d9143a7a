"""Scenario 9: a hypothesis state machine against a simple model -> after every
step, the invariants hold.

Steps, in any order hypothesis likes: deliver, redeliver (the same delivery
again), deliver another for the same issue (a few at once), kill a worker
(SIGKILL to the whole process while a delivery is in flight; a new one
starts, as a supervisor would start it), flush the broker (FLUSHALL with a
delivery just sent), release an identity (the operator's code), run the
sweeper. Everything is real: uvicorn, two Celery workers, beat, a Redis of
the scenario's own, PostgreSQL.

After every step the system is given time to settle (bounded), then the SQL
invariants must hold and the database must match the model: an issue has one
task per "epoch" -- the first delivery opens one, and a delivery after a
release opens the next -- and a task holds the issue's identity exactly when
the model says it is held.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from models.broker.messages import PROCESS_DELIVERY
from models.db import session_scope
from models.settings import Settings
from models.tables import Task, TaskSource
from tests.support.invariants import assert_invariants
from tests.support.processes import WorkerProcess, wait_until
from tests.support.services import PrivateRedis
from tests.support.stack import (
    Stack,
    Tenant,
    add_tenant,
    database_view,
    kill_process,
    scaled,
    unfinished,
)
from tests.support.traffic import Delivery, post_all
from worker import sweeper
from worker.celery_app import make_celery_app
from worker.operator import release_identity

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

SCENARIO = "9. stateful: random steps, invariants after each"
TIMINGS = {"TASKHOOK_TASK_TIME_LIMIT_SECONDS": "2", "TASKHOOK_LEASE_SECONDS": "3"}
SETTLE_WITHIN = 60.0


@dataclass
class Rig:
    stack: Stack
    redis: PrivateRedis
    ingress_url: str
    engine: Engine
    sessions: sessionmaker[Session]
    tenant: Tenant
    workers: list[WorkerProcess]
    client: object
    steps: Counter = field(default_factory=Counter)
    settle_seconds: list[float] = field(default_factory=list)
    examples: int = 0


@pytest.fixture(scope="module")
def rig(private_redis, shared_database, stack_on, secret_book):
    engine, sessions = database_view(shared_database.url)
    stack = stack_on(shared_database.url, private_redis.url, **TIMINGS)
    tenant = add_tenant(sessions, secret_book, "model", "MODEL")
    ingress = stack.ingress()
    stack.beat()
    workers = [stack.worker("model-a"), stack.worker("model-b")]
    client = make_celery_app(
        Settings(database_url=shared_database.url, broker_url=private_redis.url)
    )
    try:
        yield Rig(stack, private_redis, ingress.url, engine, sessions, tenant, workers, client)
    finally:
        client.close()
        stack.stop_all()
        engine.dispose()


ISSUES = range(1, 4)


class Inbox(RuleBasedStateMachine):
    def __init__(self, rig: Rig) -> None:
        super().__init__()
        self.rig = rig

    @initialize()
    def start(self) -> None:
        self.rig.examples += 1
        self.project = f"M{self.rig.examples}X"
        self.sent: list[Delivery] = []
        self.held: dict[int, bool] = dict.fromkeys(ISSUES, False)
        self.epochs: Counter = Counter()

    def key(self, issue: int) -> str:
        return f"{self.project}-{issue}"

    def _deliver(self, issue: int, count: int = 1) -> None:
        deliveries = [self.rig.tenant.jira(self.key(issue)) for _ in range(count)]
        answers = post_all(self.rig.ingress_url, deliveries, concurrency=count)
        assert answers.results() == {"queued": count}, answers.statuses()
        self.sent.extend(deliveries)
        if not self.held[issue]:
            self.epochs[issue] += 1
            self.held[issue] = True

    @rule(issue=st.sampled_from(ISSUES))
    def deliver(self, issue: int) -> None:
        self.rig.steps["deliver"] += 1
        self._deliver(issue)

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def redeliver(self, data) -> None:
        self.rig.steps["redeliver"] += 1
        again = data.draw(st.sampled_from(self.sent))
        answers = post_all(self.rig.ingress_url, [again])
        assert answers.results() == {"duplicate": 1}, answers.statuses()

    @rule(issue=st.sampled_from(ISSUES), count=st.integers(2, 4))
    def deliver_another_for_the_same_issue(self, issue: int, count: int) -> None:
        self.rig.steps["deliver another for the same issue"] += 1
        self._deliver(issue, count)

    @rule(issue=st.sampled_from(ISSUES), which=st.integers(0, 1), delay=st.floats(0, 0.3))
    def kill_a_worker(self, issue: int, which: int, delay: float) -> None:
        self.rig.steps["kill a worker"] += 1
        self._deliver(issue, 2)
        time.sleep(delay)
        doomed = self.rig.workers[which]
        kill_process(doomed)
        self.rig.workers[which] = self.rig.stack.worker(f"model-{'ab'[which]}")

    @rule(issue=st.sampled_from(ISSUES))
    def flush_the_broker(self, issue: int) -> None:
        self.rig.steps["flush the broker"] += 1
        self._deliver(issue)
        self.rig.redis.flushall()

    @rule(issue=st.sampled_from(ISSUES))
    def release(self, issue: int) -> None:
        self.rig.steps["release"] += 1
        with session_scope(self.rig.sessions) as session:
            answer = release_identity(
                session=session,
                workspace_id=self.rig.tenant.workspace_id,
                external_id=f"jira:{self.key(issue)}",
                operator="the model",
                reason="a step of the stateful test",
            )
        assert answer["released"] is self.held[issue], answer
        self.held[issue] = False

    @rule()
    def run_the_sweeper(self) -> None:
        self.rig.steps["run the sweeper"] += 1
        with session_scope(self.rig.sessions) as session:
            sweeper.sweep(
                session=session,
                queued_grace_seconds=1.0,
                send=lambda pk: self.rig.client.send_task(PROCESS_DELIVERY, args=[pk]),
            )

    @invariant()
    def the_promises_hold(self) -> None:
        started = time.monotonic()
        wait_until(
            lambda: unfinished(self.rig.sessions) == 0,
            timeout=SETTLE_WITHIN,
            what="every delivery finished",
            logs=self.rig.stack.processes,
        )
        self.rig.settle_seconds.append(time.monotonic() - started)
        assert_invariants(self.rig.engine)
        with self.rig.sessions() as session:
            for issue in ISSUES:
                key = self.key(issue)
                holders = session.scalar(
                    select(func.count()).select_from(Task).where(Task.external_id == f"jira:{key}")
                )
                tasks = session.scalar(
                    select(func.count()).select_from(TaskSource).where(TaskSource.remote_key == key)
                )
                assert holders == int(self.held[issue]), (key, holders, self.held[issue])
                assert tasks == self.epochs[issue], (key, tasks, self.epochs[issue])


def test_a_tour_of_every_step_keeps_every_promise(rig: Rig):
    """Every kind of step at least once, in an order that makes each one bite:
    the kill and the flush come while deliveries are in flight."""
    machine = Inbox(rig)
    machine.start()
    tour = [
        lambda: machine.deliver(1),
        lambda: machine.deliver_another_for_the_same_issue(1, 3),
        lambda: machine.redeliver(_Draw(machine.sent[0])),
        lambda: machine.kill_a_worker(2, 0, 0.05),
        lambda: machine.flush_the_broker(3),
        lambda: machine.release(1),
        lambda: machine.deliver(1),
        lambda: machine.run_the_sweeper(),
        lambda: machine.release(2),
        lambda: machine.kill_a_worker(2, 1, 0.0),
    ]
    for step in tour:
        step()
        machine.the_promises_hold()
    assert machine.epochs == {1: 2, 2: 2, 3: 1}


class _Draw:
    """Stands in for hypothesis's ``data`` in a fixed tour."""

    def __init__(self, value: object) -> None:
        self.value = value

    def draw(self, strategy) -> object:
        return self.value


def test_random_steps_keep_every_promise(rig: Rig, figures):
    run_state_machine_as_test(
        lambda: Inbox(rig),
        settings=settings(
            max_examples=scaled(4),
            stateful_step_count=10,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    with rig.sessions() as session:
        tasks = session.scalar(select(func.count()).select_from(Task))
    figures.record(
        SCENARIO,
        examples=rig.examples,
        steps=dict(rig.steps),
        steps_total=sum(rig.steps.values()),
        tasks=tasks,
        settle_s_median=round(sorted(rig.settle_seconds)[len(rig.settle_seconds) // 2], 2),
        settle_s_max=round(max(rig.settle_seconds), 2),
    )
