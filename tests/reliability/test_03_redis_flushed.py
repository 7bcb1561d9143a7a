"""Scenario 3: Redis flushed (FLUSHALL) and restarted with 1,000 deliveries queued
-> all 1,000 done, through the sweeper.

The ingress takes 1,000 deliveries (1,000 Jira issues) while no worker runs:
every message waits in Redis. Then Redis loses them all -- FLUSHALL, and a
restart of a server that keeps nothing on disk. Only then do a worker and
beat start: every delivery can reach them only because the inbox row is
durable and the sweeper sends it again. Drain time is from Redis being back
to the last delivery done. The ingress, which stayed up through the restart,
must hand new deliveries to the new Redis as well.
"""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import func, select

from models.tables import Delivery as DeliveryRow
from tests.support.invariants import assert_invariants
from tests.support.processes import wait_until
from tests.support.stack import (
    add_tenant,
    database_view,
    outcomes,
    scaled,
    swept_in,
    tasks_by_external_id,
    wait_drained,
)
from tests.support.traffic import post_all

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

SCENARIO = "3. Redis flushed and restarted with 1,000 deliveries queued"


def test_a_flushed_and_restarted_redis_loses_no_delivery(
    private_redis, shared_database, stack_on, secret_book, figures
):
    engine, sessions = database_view(shared_database.url)
    stack = stack_on(shared_database.url, private_redis.url)
    tenant = add_tenant(sessions, secret_book, "flush", "FLUSH")
    count = scaled(1000)
    ingress = stack.ingress()

    started = time.monotonic()
    answers = post_all(ingress.url, (tenant.jira(f"F-{n}") for n in range(count)), concurrency=20)
    posting = time.monotonic() - started
    assert answers.statuses() == {202: count}
    # The relay hands every key to Redis; nothing consumes them yet.
    wait_until(
        lambda: private_redis.keys_queued() == count,
        timeout=60,
        what=f"{count} keys in Redis's messages",
        logs=[ingress.process],
    )

    messages = private_redis.queue_length()  # keys that arrived together share one
    private_redis.flushall()
    assert private_redis.dbsize() == 0
    private_redis.restart()
    back = time.monotonic()
    assert private_redis.dbsize() == 0

    stack.beat()
    stack.worker("drainer", pool="prefork", concurrency=2)
    drained = wait_drained(sessions, expected=count, logs=stack.processes)
    drain = time.monotonic() - back

    assert tasks_by_external_id(sessions, tenant.workspace_id) == {
        f"jira:F-{n}": 1 for n in range(count)
    }
    assert outcomes(sessions, tenant.workspace_id) == {("done", "created"): count}
    swept = swept_in(stack.logs())
    assert swept >= count, "every delivery was lost with Redis: only the sweeper can send it"

    # The ingress survived the restart: a new delivery goes to the new Redis.
    fresh = post_all(ingress.url, [tenant.jira("AFTER-1")])
    assert fresh.statuses() == {202: 1}
    wait_drained(sessions, expected=count + 1, logs=stack.processes)
    metrics = _metrics(ingress.url)
    assert metrics.get("taskhook_relay_published_total", 0) >= count + 1

    snapshot = assert_invariants(engine)
    with sessions() as session:
        attempts = session.scalar(select(func.sum(DeliveryRow.attempts)))
    engine.dispose()
    figures.record(
        SCENARIO,
        deliveries=count,
        posting_seconds=round(posting, 1),
        keys_in_redis_before_flush=count,
        messages_in_redis_before_flush=messages,
        messages_after_restart=0,
        sent_again_by_the_sweeper=swept,
        claims=attempts,
        drain_seconds_from_redis_back=round(drain, 1),
        drain_seconds_from_worker_ready=round(drained, 1),
        throughput_per_s=round(count / drained, 1),
        relay_published_after_restart="yes",
        invariants=f"held ({snapshot.tasks} tasks)",
    )


def _metrics(url: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values
