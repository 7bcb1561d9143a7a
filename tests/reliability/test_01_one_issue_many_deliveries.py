"""Scenario 1: one Jira issue, a hundred concurrent posts, two worker processes -> one task.

Fifty concurrent posts of the very same delivery (one id, one body) and fifty
different deliveries for the same issue (fifty ids), interleaved, through a
real uvicorn; two Celery worker processes race on them. The ingress stores
the repeated delivery once; the workers make one task and find it 50 times.

A delivery "takes the backstop path" when its lookup missed the task and the
insert's unique index (``uniq_tasks_external_id``) found it instead -- the
backstop of docs/contract.md, "The create sequence". The worker logs each
one. The first test counts how often real concurrency takes it; the second
makes sure it is taken (both workers pause 0.2 s after a lookup miss) and
still makes one task.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from tests.support.invariants import assert_invariants
from tests.support.processes import Ingress, finished, wait_until
from tests.support.stack import (
    Stack,
    Tenant,
    add_tenant,
    backstops_in,
    database_view,
    outcomes,
    tasks_by_external_id,
)
from tests.support.traffic import post_all

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

SCENARIO = "1. one issue: 50 posts of one delivery + 50 deliveries, 2 workers"


@dataclass
class Race:
    stack: Stack
    ingress: Ingress
    engine: Engine
    sessions: sessionmaker[Session]
    tenant: Tenant


@pytest.fixture(scope="module")
def stack(private_redis, shared_database, stack_on):
    """One stack for the module; each test races in a workspace of its own, so
    that what one leaves behind is never counted by the other, in any order."""
    engine, sessions = database_view(shared_database.url)
    stack = stack_on(shared_database.url, private_redis.url)
    ingress = stack.ingress()
    try:
        yield stack, ingress, engine, sessions
    finally:
        stack.stop_all()
        engine.dispose()


_RACES = itertools.count(1)


@pytest.fixture
def race(stack, secret_book) -> Race:
    stack, ingress, engine, sessions = stack
    tenant = add_tenant(sessions, secret_book, f"race-{next(_RACES)}", "RACE")
    return Race(stack, ingress, engine, sessions, tenant)


def run_race(race: Race, key: str, *, same: int, different: int) -> dict:
    """Post ``same`` copies of one delivery and ``different`` deliveries for issue
    ``key``, all at once; wait for the workers; return what happened."""
    repeated = race.tenant.jira(key)
    others = [race.tenant.jira(key) for _ in range(different)]
    batch = [repeated] * same + others
    random.Random(key).shuffle(batch)

    started = time.monotonic()
    answers = post_all(race.ingress.url, batch, concurrency=len(batch))
    assert answers.statuses() == {202: len(batch)}, answers.statuses()
    of_repeated = [a.body["status"] for a in answers.answers if a.delivery is repeated]
    assert sorted(of_repeated) == ["duplicate"] * (same - 1) + ["queued"]
    pks = [a.body["delivery"] for a in answers.accepted() if a.body["status"] == "queued"]
    assert len(pks) == 1 + different

    wait_until(
        finished(race.sessions, *pks),
        timeout=90,
        what=f"{len(pks)} deliveries",
        logs=race.stack.processes,
    )
    return {
        "pks": pks,
        "seconds": round(time.monotonic() - started, 2),
        "slowest_answer_s": round(answers.slowest(), 3),
        "backstop": backstops_in(race.stack.logs()) & set(pks),
    }


def test_one_task_for_a_hundred_concurrent_posts_on_two_workers(race: Race, figures):
    race.stack.stop_all_workers()
    race.stack.worker("racer-a", beat=True)
    race.stack.worker("racer-b")

    seen = run_race(race, "RACE-1", same=50, different=50)

    assert tasks_by_external_id(race.sessions, race.tenant.workspace_id) == {"jira:RACE-1": 1}
    by_outcome = outcomes(race.sessions, race.tenant.workspace_id)
    assert by_outcome == {("done", "created"): 1, ("done", "found_settled"): 50}
    snapshot = assert_invariants(race.engine)
    figures.record(
        SCENARIO,
        posts=100,
        answers="202 x 100 (49 duplicate, 51 queued)",
        deliveries_stored=len(seen["pks"]),
        tasks=1,
        outcomes="created 1, found_settled 50",
        backstop_path_deliveries=len(seen["backstop"]),
        seconds_posts_to_all_done=seen["seconds"],
        slowest_answer_s=seen["slowest_answer_s"],
        invariants=f"held ({snapshot.tasks} tasks, deliveries {snapshot.deliveries})",
    )


def test_a_forced_lookup_race_takes_the_backstop_and_still_makes_one_task(race: Race, figures):
    race.stack.stop_all_workers()
    widen = {"TASKHOOK_FAILPOINT": "after_lookup:pause=0.2"}
    race.stack.worker("slow-lookup-a", beat=True, **widen)
    race.stack.worker("slow-lookup-b", **widen)

    seen = run_race(race, "RACE-2", same=1, different=49)

    assert tasks_by_external_id(race.sessions, race.tenant.workspace_id)["jira:RACE-2"] == 1
    assert seen["backstop"], "both workers missed the lookup; one must have hit the index"
    assert_invariants(race.engine)
    figures.record(
        SCENARIO,
        forced_race_deliveries=len(seen["pks"]),
        forced_race_backstop_path_deliveries=len(seen["backstop"]),
        forced_race_tasks=1,
    )
