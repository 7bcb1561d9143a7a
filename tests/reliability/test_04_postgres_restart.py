"""Scenario 4: PostgreSQL restarted (``-m immediate``) during a 500-delivery burst,
and 100 more posted once it is back.

The database is a private cluster (see ``services.PrivatePostgres``): the
shared one on 5432 serves other engineers' suites and must not be restarted.
``pg_ctl restart -m immediate`` is what ``pg_ctlcluster ... restart -m
immediate`` does: no checkpoint, every connection cut, WAL replayed.

While it is down the ingress answers 503 with Retry-After, and never 2xx for a
delivery it did not store: every 2xx answer's delivery is in the database
after the crash. The sender retries its 503s (Jira does on its own; GitHub's
are redelivered by hand); every delivery then ends done, none dead. Figures:
the 503 count and how long after the database was back the ingress stored
again.

The second test cuts the ingress's connections with the TCP proxy instead (a
network failure: connections reset, new ones refused for 1 s).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from models.tables import Delivery as DeliveryRow
from tests.support.invariants import assert_invariants
from tests.support.proxy import TcpProxy
from tests.support.stack import (
    Stack,
    Tenant,
    add_tenant,
    database_view,
    outcomes,
    scaled,
    tasks_by_external_id,
    wait_drained,
)
from tests.support.traffic import Answers, post_all

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

SCENARIO = "4. PostgreSQL restarted during a 500-delivery burst"
RATE = 100.0  # deliveries per second


@dataclass
class Rig:
    stack: Stack
    url: str
    engine: Engine
    sessions: sessionmaker[Session]


@pytest.fixture(scope="module")
def rig(private_postgres, private_redis, stack_on):
    url = private_postgres.create_database()
    engine, sessions = database_view(url)
    stack = stack_on(url, private_redis.url)
    stack.beat()
    stack.worker("worker", pool="prefork", concurrency=2)
    try:
        yield Rig(stack, url, engine, sessions)
    finally:
        stack.stop_all()
        engine.dispose()


def stored_ids(sessions) -> set[str]:
    with sessions() as session:
        return set(session.scalars(select(DeliveryRow.delivery_id)))


def check_answers(answers: Answers, sessions) -> dict:
    """No 5xx but 503; every 503 says when to retry; every 2xx was stored."""
    statuses = answers.statuses()
    unanswered = [(a.delivery.delivery_id, a.error) for a in answers.answers if a.status == 0]
    assert set(statuses) <= {202, 503}, (statuses, unanswered)
    unavailable = [answer for answer in answers.answers if answer.status == 503]
    assert all(answer.body.get("error") for answer in unavailable)
    stored = stored_ids(sessions)
    not_stored = [
        a.delivery.delivery_id for a in answers.accepted() if a.delivery.delivery_id not in stored
    ]
    assert not_stored == [], "2xx answered for deliveries that are not in the database"
    return {
        "answered_503": len(unavailable),
        "answered_503_but_stored": sum(a.delivery.delivery_id in stored for a in unavailable),
    }


def retry_until_stored(url: str, answers: Answers, timeout: float = 60) -> int:
    """Send every 503'd delivery again, as Jira would, until each is answered 2xx."""
    pending = [answer.delivery for answer in answers.answers if not answer.accepted]
    rounds = 0
    deadline = time.monotonic() + timeout
    while pending:
        assert time.monotonic() < deadline, f"{len(pending)} deliveries never stored"
        rounds += 1
        again = post_all(url, pending, concurrency=10)
        assert set(again.statuses()) <= {202, 503}
        pending = [answer.delivery for answer in again.answers if not answer.accepted]
        if pending:
            time.sleep(0.5)
    return rounds


def reconnect_seconds(answers: Answers, back_at: float) -> float:
    """From the database being back to the first delivery stored after it."""
    after = [a.sent_at + a.seconds for a in answers.accepted() if a.sent_at >= back_at]
    return round(min(after) - back_at, 3) if after else float("nan")


#: How many deliveries a burst posts once its fault has ended: the senders go
#: on sending, so that how long the ingress took to store again is measured
#: whatever the fault took (a loaded machine restarts PostgreSQL slower than
#: the burst lasts).
TAIL = 100


@dataclass(frozen=True)
class Burst:
    answers: Answers
    #: When the fault ended (the database back, the partition healed).
    fault_ended_at: float
    #: Every delivery posted: the burst's and the tail's.
    posted: int


def burst(
    rig: Rig, tenant: Tenant, ingress_url: str, prefix: str, count: int, fault, at: float
) -> Burst:
    """Post ``count`` deliveries at RATE per second; run ``fault`` after ``at``
    seconds, in a thread; once both are over, post :data:`TAIL` more."""
    deliveries = [tenant.jira(f"{prefix}-{n}") for n in range(1, count + TAIL + 1)]
    fault_ended: list[float] = []

    def inject() -> None:
        time.sleep(at)
        fault()
        fault_ended.append(time.time())

    injector = threading.Thread(target=inject, daemon=True)
    injector.start()
    answers = post_all(ingress_url, deliveries[:count], concurrency=20, rate=RATE, timeout=30)
    injector.join(timeout=120)
    assert fault_ended, "the fault did not finish within 120 s"
    tail = post_all(ingress_url, deliveries[count:], concurrency=20, rate=RATE, timeout=30)
    return Burst(Answers(answers.answers + tail.answers), fault_ended[0], len(deliveries))


def test_a_postgres_restart_mid_burst_answers_503_and_loses_nothing(
    rig: Rig, private_postgres, secret_book, figures
):
    tenant = add_tenant(rig.sessions, secret_book, "restart", "RST")
    ingress = rig.stack.ingress()
    count = scaled(500)

    restarted: list[float] = []

    def restart() -> None:
        restarted.append(time.time())
        private_postgres.restart_immediate()

    posted = burst(rig, tenant, ingress.url, "PG", count, restart, at=1.5)
    answers, back_at, count = posted.answers, posted.fault_ended_at, posted.posted
    seen = check_answers(answers, rig.sessions)
    assert seen["answered_503"] > 0, "the restart went unnoticed: the scenario proved nothing"
    reconnect = reconnect_seconds(answers, back_at)
    assert reconnect < 5, (
        f"the ingress stored nothing for {reconnect} s after the database was back "
        "(nan: nothing posted after it was stored)"
    )
    rounds = retry_until_stored(ingress.url, answers)

    drained = wait_drained(rig.sessions, expected=count, logs=rig.stack.processes)
    assert tasks_by_external_id(rig.sessions, tenant.workspace_id) == {
        f"jira:PG-{n}": 1 for n in range(1, count + 1)
    }
    assert outcomes(rig.sessions, tenant.workspace_id) == {("done", "created"): count}
    assert_invariants(rig.engine)
    unavailable = [a for a in answers.answers if a.status == 503]
    figures.record(
        SCENARIO,
        deliveries=count,
        rate_per_s=RATE,
        answered_202_first_time=len(answers.accepted()),
        answered_503=seen["answered_503"],
        answered_503_but_stored_anyway=seen["answered_503_but_stored"],
        answered_other=0,
        outage_seen_by_senders_s=round(
            max(a.sent_at + a.seconds for a in unavailable) - min(a.sent_at for a in unavailable),
            3,
        ),
        restart_took_s=round(back_at - restarted[0], 3),
        reconnect_s_after_database_back=reconnect,
        retry_rounds_for_the_503s=rounds,
        done=count,
        dead=0,
        seconds_to_all_done_after_burst=round(drained, 1),
    )


def test_connections_cut_by_the_proxy_answer_503_and_lose_nothing(
    rig: Rig, private_postgres, secret_book, figures
):
    tenant = add_tenant(rig.sessions, secret_book, "cut", "CUT")
    proxy = TcpProxy("127.0.0.1", private_postgres.port, name="pg-proxy").start()
    try:
        through_proxy = make_url(rig.url).set(port=proxy.port).render_as_string(False)
        ingress = rig.stack.ingress(TASKHOOK_DATABASE_URL=through_proxy)
        count = scaled(300)  # 3 s: the partition is over a second before the burst

        def partition() -> None:
            proxy.refuse(True)
            proxy.cut()
            time.sleep(1.0)
            proxy.refuse(False)

        posted = burst(rig, tenant, ingress.url, "CUT", count, partition, at=0.7)
        answers, healed_at, count = posted.answers, posted.fault_ended_at, posted.posted
        seen = check_answers(answers, rig.sessions)
        assert seen["answered_503"] > 0
        reconnect = reconnect_seconds(answers, healed_at)
        assert reconnect < 5, f"the ingress stored nothing for {reconnect} s after the heal"
        retry_until_stored(ingress.url, answers)
        wait_drained(rig.sessions, expected=count, logs=rig.stack.processes)
    finally:
        proxy.stop()
    assert outcomes(rig.sessions, tenant.workspace_id) == {("done", "created"): count}
    assert_invariants(rig.engine)
    figures.record(
        SCENARIO,
        proxy_cut_deliveries=count,
        proxy_cut_connections_reset=proxy.cut_connections,
        proxy_cut_answered_503=seen["answered_503"],
        proxy_cut_reconnect_s_after_heal=reconnect,
    )
