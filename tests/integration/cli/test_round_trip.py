"""The real round trip: ``taskhook`` processes, Redis and a Celery operator
worker, where the other CLI tests use a fake app."""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from models.broker.messages import DELIVERIES_QUEUE, OPERATOR_QUEUE, PROCESS_DELIVERY
from models.inbox import DeliveryStatus
from tests.support.cli import BIN, REDIS_URL, RELEASE, ROOT, held_by, process_env, taskhook_process
from tests.support.scenarios import (
    EXTERNAL_ID,
    a_delivery,
    a_source,
    an_unfinished_create,
    settle_as,
)
from tests.support.stores import Store
from worker.cli import EXIT_NO_ANSWER


@pytest.fixture
def redis_broker() -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as error:
        pytest.fail(f"Redis is not reachable at {REDIS_URL} ({error})", pytrace=False)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@contextmanager
def operator_worker_process(store: Store, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A worker worker -Q operator``, as the Procfile's operator line runs it."""
    with log.open("wb") as output:
        worker = subprocess.Popen(
            [
                str(BIN / "celery"),
                "-A",
                "worker",
                "worker",
                "-Q",
                OPERATOR_QUEUE,
                "--concurrency",
                "1",
                "--loglevel",
                "INFO",
                "-n",
                f"operator-{uuid.uuid4().hex[:8]}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=ROOT,
            env=process_env(store),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            yield worker
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


@pytest.mark.e2e
@pytest.mark.redis
def test_release_round_trip_through_a_real_operator_worker(store: Store, redis_broker, tmp_path):
    workspace_id, task_id, _, _ = an_unfinished_create(store)

    with operator_worker_process(store, tmp_path / "operator.log"):
        result = taskhook_process(
            store,
            *RELEASE,
            "--reason",
            "worker died",
            "--operator",
            "alice",
            "--yes",
            "--timeout",
            "60",
            "--json",
        )

    assert result.returncode == 0, result.stderr + (tmp_path / "operator.log").read_text()
    assert "Traceback" not in result.stderr
    answer = json.loads(result.stdout)
    assert (
        answer.items()
        >= {
            "released": True,
            "workspace_id": workspace_id,
            "task_id": task_id,
            "identifier": "ACME-1",
            "external_id": EXTERNAL_ID,
            "operator": "alice",
        }.items()
    )
    assert held_by(store) is None
    assert store.scalar("SELECT reason FROM identity_releases") == "worker died"


@pytest.mark.e2e
@pytest.mark.redis
def test_an_unanswered_release_says_so_and_still_runs_when_a_worker_starts(
    store: Store, redis_broker, tmp_path
):
    an_unfinished_create(store)

    result = taskhook_process(store, *RELEASE, "--reason", "r", "--yes", "--timeout", "1")

    assert result.returncode == EXIT_NO_ANSWER, result.stderr
    assert "the operator worker did not answer within 1s" in result.stderr
    assert "Traceback" not in result.stderr
    assert held_by(store) == "ACME-1"
    # What the message warns about is true: the request waits in the queue.
    with operator_worker_process(store, tmp_path / "operator.log"):
        deadline = time.monotonic() + 60
        while held_by(store) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
    assert held_by(store) is None, (tmp_path / "operator.log").read_text()


@pytest.mark.redis
def test_replay_puts_the_delivery_on_the_real_deliveries_queue(store: Store, redis_broker):
    source_id = a_source(store, store.workspace().id)
    dead = a_delivery(store, source_id, "d-1")
    settle_as(store, dead, DeliveryStatus.DEAD, error="database went away")

    result = taskhook_process(store, "deliveries", "replay", str(dead))

    assert result.returncode == 0, result.stderr
    assert "sent to the worker" in result.stdout
    (message,) = [json.loads(raw) for raw in redis_broker.lrange(DELIVERIES_QUEUE, 0, -1)]
    assert message["headers"]["task"] == PROCESS_DELIVERY
    args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    assert args == [dead]
