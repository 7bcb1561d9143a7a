"""Scenario 5: Redis frozen for 15 s (SIGSTOP, then SIGCONT) under load -> the
ingress keeps answering within 2 s, and nothing is lost.

The Redis is the scenario's own (the shared one must never be frozen). A
steady 20 deliveries a second go to a real uvicorn for 21 s; Redis is frozen
from the 3rd second to the 18th: its socket stays open and answers nothing,
the way a hung host or a long fork pause looks. The request path never waits
on the broker (the relay thread does, and gives up after its timeout), so
every answer must still come within 2 s. After the thaw, every delivery must
be done -- the relay's and the sweeper's messages between them.

The second test delays every byte to and from Redis by 3 s through the TCP
proxy instead (a slow link, not a dead one).
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.support.invariants import assert_invariants
from tests.support.proxy import TcpProxy
from tests.support.stack import (
    add_tenant,
    database_view,
    outcomes,
    scaled,
    tasks_by_external_id,
    wait_drained,
)
from tests.support.traffic import Answers, post_all

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

SCENARIO = "5. Redis frozen 15 s under load"
RATE = 20.0
ANSWER_WITHIN = 2.0


def _phase(answers: Answers, start: float, end: float) -> dict:
    times = sorted(a.seconds for a in answers.answers if start <= a.sent_at < end)
    if not times:
        return {"answers": 0}
    return {
        "answers": len(times),
        "p50_s": round(times[len(times) // 2], 3),
        "p99_s": round(times[min(len(times) - 1, int(0.99 * len(times)))], 3),
        "max_s": round(times[-1], 3),
    }


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


@pytest.fixture(scope="module")
def views(shared_database):
    engine, sessions = database_view(shared_database.url)
    try:
        yield engine, sessions
    finally:
        engine.dispose()


def test_a_frozen_redis_does_not_slow_the_ingress_and_loses_nothing(
    private_redis, shared_database, views, stack_on, secret_book, figures
):
    engine, sessions = views
    stack = stack_on(shared_database.url, private_redis.url)
    tenant = add_tenant(sessions, secret_book, "frozen", "FRZ")
    stack.beat()
    stack.worker("worker")
    ingress = stack.ingress()

    freeze_at, freeze_for, total = 3.0, 15.0, 21.0
    count = scaled(int(RATE * total))
    moments: dict[str, float] = {}

    def freeze_then_thaw() -> None:
        time.sleep(freeze_at)
        private_redis.freeze()
        moments["frozen"] = time.time()
        time.sleep(freeze_for)
        private_redis.thaw()
        moments["thawed"] = time.time()

    freezer = threading.Thread(target=freeze_then_thaw, daemon=True)
    freezer.start()
    try:
        deliveries = [tenant.jira(f"FRZ-{n}") for n in range(1, count + 1)]
        answers = post_all(ingress.url, deliveries, concurrency=20, rate=count / total)
    finally:
        freezer.join(timeout=freeze_at + freeze_for + 10)
        if private_redis.frozen:
            private_redis.thaw()

    assert answers.statuses() == {202: count}, answers.statuses()
    assert answers.slowest() < ANSWER_WITHIN, f"slowest answer {answers.slowest():.2f} s"

    drained = wait_drained(sessions, expected=count, logs=stack.processes)
    since_thaw = time.time() - moments["thawed"]
    assert tasks_by_external_id(sessions, tenant.workspace_id) == {
        f"jira:FRZ-{n}": 1 for n in range(1, count + 1)
    }
    assert outcomes(sessions, tenant.workspace_id) == {("done", "created"): count}
    assert_invariants(engine)
    figures.record(
        SCENARIO,
        deliveries=count,
        rate_per_s=RATE,
        answered_202=count,
        before_freeze=_phase(answers, 0, moments["frozen"]),
        while_frozen=_phase(answers, moments["frozen"], moments["thawed"]),
        after_thaw=_phase(answers, moments["thawed"], float("inf")),
        relay_dropped_keys=_metric(ingress.url, "taskhook_relay_dropped_total"),
        lost=0,
        seconds_thaw_to_all_done=round(since_thaw, 1),
        seconds_to_drain_after_the_load=round(drained, 1),
    )


def test_a_slow_redis_link_does_not_slow_the_ingress(
    private_redis, shared_database, views, stack_on, secret_book, figures
):
    engine, sessions = views
    proxy = TcpProxy("127.0.0.1", private_redis.port, name="redis-proxy").start()
    try:
        slow_broker = make_url(private_redis.url).set(port=proxy.port).render_as_string(False)
        stack = stack_on(shared_database.url, private_redis.url)
        tenant = add_tenant(sessions, secret_book, "slow", "SLOW")
        stack.beat()
        stack.worker("worker")
        ingress = stack.ingress(TASKHOOK_BROKER_URL=slow_broker)
        count = scaled(100)  # 5 s at RATE, the link slow from the 1st second to the 4th

        def slow_link() -> None:
            time.sleep(1)
            proxy.delay(3.0)
            time.sleep(3)
            proxy.delay(0)

        slower = threading.Thread(target=slow_link, daemon=True)
        slower.start()
        answers = post_all(
            ingress.url, [tenant.jira(f"SLOW-{n}") for n in range(1, count + 1)], rate=RATE
        )
        slower.join(timeout=20)
        assert answers.statuses() == {202: count}
        assert answers.slowest() < ANSWER_WITHIN, f"slowest answer {answers.slowest():.2f} s"
        wait_drained(sessions, expected=count, logs=stack.processes)
    finally:
        proxy.stop()
    assert outcomes(sessions, tenant.workspace_id) == {("done", "created"): count}
    assert_invariants(engine)
    figures.record(
        SCENARIO,
        slow_link_deliveries=count,
        slow_link_delay_s=3.0,
        slow_link_slowest_answer_s=round(answers.slowest(), 3),
        slow_link_p99_s=round(answers.percentile(0.99), 3),
    )
