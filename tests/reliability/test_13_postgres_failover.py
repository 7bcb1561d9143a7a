"""Scenario 13: the PostgreSQL primary fails during a storm of GitHub deliveries,
and its streaming standby is promoted.

Two clusters of our own (``tests/support/replication.py``), each a primary and
a standby made by ``pg_basebackup -R``; every process -- the ingress, the
worker, beat, the CLI -- is given one URL naming both hosts with
``target_session_attrs=read-write``, as docs/deploy.md recommends. Mid-storm
the primary is stopped hard (``pg_ctl stop -m immediate``: the host is gone)
and, a second later (a failover manager's decision, made short), the standby
is promoted (``pg_ctl promote``). Nobody restarts or reconfigures taskhook.

- Synchronous replication (``synchronous_standby_names`` names the standby):
  every delivery answered 2xx is on the promoted standby -- none lost.
- Asynchronous replication: the standby's stream is held for the last second
  before the stop (a lag, made certain instead of left to luck); the
  deliveries answered 2xx in that second are missing on the promoted standby.
  The figure is how many.

In both, the ingress answers 503 while no host takes writes, and the
deliveries it refused are GitHub's, which GitHub never sends again. ``taskhook
stats`` names that stretch (``ingest.refusals``); a catch-up from the fake
GitHub's delivery log (``bench/fakes``) stores them -- and, asynchronous,
the lost ones too, whose guids the log has and the inbox lacks. In the end
every issue of the storm is one task: none lost, none twice.

Figures: how long the ingress answered 503 (first to last non-2xx answer),
how long after the stop the worker created a task again, the counts. The
storm is ``scaled(420)`` deliveries at 60 a second (7 s, the stop 3 s in); a
longer one: ``TASKHOOK_RELIABILITY_SCALE=10`` (70 s, the stop 30 s in).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from bench.fakes.github_api import FakeGitHub
from models.catchup import set_log_access
from models.db import session_scope
from models.tables import Delivery as DeliveryRow
from models.tables import Task
from tests.support.invariants import assert_invariants
from tests.support.replication import ReplicatedPostgres
from tests.support.stack import (
    SCALE,
    Stack,
    Tenant,
    add_tenant,
    database_view,
    outcomes,
    scaled,
    taskhook,
    tasks_by_external_id,
    wait_drained,
)
from tests.support.traffic import Answers, post_all

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

SCENARIO = "13. PostgreSQL primary fails over to its standby"
RATE = 60.0  # deliveries per second
#: When, into the storm, the primary stops (later in a longer storm).
STOP_AT = 3.0 * SCALE
#: Asynchronous: how long before the stop the standby stops receiving.
HELD_FOR = 1.0
#: From the stop to the promotion: a failover manager's decision, made short.
PROMOTE_AFTER = 1.0
TOKEN = "ghp_failover_catch_up"
REPOSITORY = "acme/api"  # tests.support.traffic's GitHub deliveries
HOOK = f"repos/{REPOSITORY}/hooks/4242"


@dataclass
class Rig:
    cluster: ReplicatedPostgres
    stack: Stack
    url: str
    engine: Engine
    sessions: sessionmaker[Session]
    mode: str


@pytest.fixture(params=["synchronous", "asynchronous"])
def rig(request, module_logs, secret_book, private_redis, stack_on):
    mode = request.param
    cluster = ReplicatedPostgres(
        secret_book.new("pg-password"), module_logs, synchronous=mode == "synchronous"
    )
    engine = stack = None
    try:
        cluster.start()
        url = cluster.url()
        private_redis.flushall()  # nothing left from the other mode's run
        engine, sessions = database_view(url)
        stack = stack_on(url, private_redis.url)
        stack.beat()
        stack.worker("worker")
        yield Rig(cluster, stack, url, engine, sessions, mode)
    finally:
        if stack is not None:
            stack.stop_all()
        if engine is not None:
            engine.dispose()
        cluster.destroy()


@dataclass(frozen=True)
class Failover:
    answers: Answers
    held_at: float | None
    stopping_at: float
    stopped_at: float
    promoted_at: float


def storm(rig: Rig, tenant: Tenant, ingress_url: str, count: int) -> Failover:
    """Post ``count`` GitHub deliveries at RATE a second; fail over meanwhile."""
    deliveries = [tenant.github(number) for number in range(1, count + 1)]
    times: dict[str, float] = {}

    def fail_over() -> None:
        time.sleep(STOP_AT - (0 if rig.cluster.synchronous else HELD_FOR))
        if not rig.cluster.synchronous:
            times["held"] = time.time()
            rig.cluster.hold_replication()
            time.sleep(HELD_FOR)
        times["stopping"] = time.time()
        rig.cluster.stop_primary()
        times["stopped"] = time.time()  # pg_ctl -w: it is gone by now
        time.sleep(PROMOTE_AFTER)
        rig.cluster.promote()
        times["promoted"] = time.time()

    thread = threading.Thread(target=fail_over, daemon=True)
    thread.start()
    answers = post_all(ingress_url, deliveries, concurrency=20, rate=RATE, timeout=30)
    thread.join(timeout=120)
    assert "promoted" in times, "the failover did not finish within 120 s"
    return Failover(
        answers, times.get("held"), times["stopping"], times["stopped"], times["promoted"]
    )


def stored_guids(sessions) -> set[str]:
    with sessions() as session:
        return set(session.scalars(select(DeliveryRow.delivery_id)))


def first_task_after(sessions, moment: float) -> float | None:
    with sessions() as session:
        first = session.scalar(
            select(func.min(Task.created_at)).where(
                Task.created_at > datetime.fromtimestamp(moment, UTC)
            )
        )
    return None if first is None else first.timestamp()


def answered_at(answer) -> float:
    return answer.sent_at + answer.seconds


def stats(rig: Rig, log) -> dict:
    done = taskhook(rig.url, rig.stack.broker_url, log, "stats", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def when(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_a_failover_mid_storm_loses_nothing_acknowledged_and_catch_up_recovers_the_503s(
    rig: Rig, secret_book, figures, module_logs
):
    tenant = add_tenant(rig.sessions, secret_book, f"fo-{rig.mode[:4]}", "FO")
    ingress = rig.stack.ingress()
    count = scaled(420)
    cli_log = module_logs / f"cli-{rig.mode}.log"

    failover = storm(rig, tenant, ingress.url, count)
    answers = failover.answers
    statuses = answers.statuses()
    assert set(statuses) <= {202, 503}, statuses
    refused = [a for a in answers.answers if a.status == 503]
    assert refused, "the failover went unnoticed: the scenario proved nothing"
    assert all(a.body.get("error") for a in refused)

    # What the promoted standby holds of what the ingress acknowledged.
    stored = stored_guids(rig.sessions)
    lost = [a for a in answers.accepted() if a.delivery.delivery_id not in stored]
    if rig.cluster.synchronous:
        assert lost == [], "deliveries answered 2xx are missing after a synchronous failover"
    else:
        assert lost, "the standby was held a second behind: some 2xx deliveries should be lost"
        # Only those acknowledged while the standby was held (or just before).
        assert min(answered_at(a) for a in lost) >= failover.held_at - 0.5

    # The worker resumed on the promoted standby by itself.
    resumed = first_task_after(rig.sessions, failover.promoted_at)
    assert resumed is not None, "no task was created after the failover"
    wait_drained(rig.sessions, expected=len(stored), logs=rig.stack.processes)

    # taskhook stats names the stretch the ingress refused deliveries.
    found = stats(rig, cli_log)
    windows = found["uncovered"].get(tenant.github_source, [])
    assert any(
        window["refused"]
        and when(window["start"]) <= min(answered_at(a) for a in refused)
        and when(window["end"]) >= max(a.sent_at for a in refused)
        for window in windows
    ), windows

    # GitHub's log has every delivery with what the ingress answered; a
    # catch-up stores those the inbox lacks: refused, or lost after a 2xx.
    with FakeGitHub(token=TOKEN) as github:
        for answer in answers.answers:
            github.log_delivery(
                hook=HOOK,
                guid=answer.delivery.delivery_id,
                event="issues",
                payload=json.loads(answer.delivery.body),
                status_code=answer.status,
                delivered_at=datetime.fromtimestamp(answer.sent_at, UTC),
            )
        with session_scope(rig.sessions) as session:
            set_log_access(
                session=session,
                slug=tenant.github_source,
                target=f"repos/{REPOSITORY}",
                hook_id="4242",
                token=TOKEN,
                api_base_url=github.base_url,
            )
        run = ("catch-up", "github", "--source", tenant.github_source, "--json")
        done = taskhook(rig.url, rig.stack.broker_url, cli_log, *run)
        assert done.returncode == 0, done.stderr
        caught_up = json.loads(done.stdout)
    missing = {a.delivery.delivery_id for a in answers.answers} - stored
    assert sorted(caught_up["missed"]) == sorted(missing)
    assert len(caught_up["recovered"]) == len(missing)
    drained = wait_drained(rig.sessions, expected=count, logs=rig.stack.processes)

    # Every issue of the storm is one task, made by a delivery that is done.
    assert tasks_by_external_id(rig.sessions, tenant.workspace_id) == {
        f"gh-issue/{REPOSITORY}#{n}": 1 for n in range(1, count + 1)
    }
    assert outcomes(rig.sessions, tenant.workspace_id) == {("done", "created"): count}
    assert_invariants(rig.engine)
    after = stats(rig, cli_log)
    assert tenant.github_source not in after["uncovered"], after["uncovered"]

    later = [a for a in answers.accepted() if a.sent_at > failover.promoted_at]
    figures.record(
        SCENARIO,
        **{
            f"{rig.mode}_{name}": value
            for name, value in {
                "deliveries": count,
                "rate_per_s": RATE,
                "answered_202": len(answers.accepted()),
                "answered_503": len(refused),
                "answered_503_but_stored_anyway": sum(
                    a.delivery.delivery_id in stored for a in refused
                ),
                "ingress_503_window_s": round(
                    max(answered_at(a) for a in refused) - min(a.sent_at for a in refused), 3
                ),
                "ingress_first_503_s_after_stop_began": round(
                    min(answered_at(a) for a in refused) - failover.stopping_at, 3
                ),
                "ingress_last_503_s_after_promotion": round(
                    max(answered_at(a) for a in refused) - failover.promoted_at, 3
                ),
                "ingress_first_2xx_s_after_promotion": round(
                    min(answered_at(a) for a in later) - failover.promoted_at, 3
                ),
                "primary_stop_took_s": round(failover.stopped_at - failover.stopping_at, 3),
                "stop_to_promoted_s": round(failover.promoted_at - failover.stopped_at, 3),
                "no_host_took_writes_s": round(failover.promoted_at - failover.stopping_at, 3),
                "worker_resumed_s_after_stop": round(resumed - failover.stopped_at, 3),
                "worker_first_task_s_after_promotion": round(resumed - failover.promoted_at, 3),
                "lost_after_2xx": len(lost),
                "recovered_by_catch_up": len(caught_up["recovered"]),
                "duplicate_tasks": 0,
                "seconds_to_all_done_after_catch_up": round(drained, 1),
            }.items()
        },
    )
