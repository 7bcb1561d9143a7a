"""The relay's publisher on a real Redis: a small batch spreads over the
worker's threads while nothing waits in the queue, and fills its messages once
messages wait (the workers are behind), which it tells the relay.

Redis: a database of its own (TASKHOOK_TEST_REDIS_URL, default db 13),
flushed before each test; unreachable, the test fails.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest
import redis

from ingest.relay import celery_publisher
from models.broker.messages import DELIVERIES_QUEUE, PROCESS_DELIVERIES, PROCESS_DELIVERY
from models.settings import Settings
from tests.support.processes import REDIS_URL


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except redis.RedisError as error:
        pytest.fail(f"Redis is not reachable at {REDIS_URL} ({error})", pytrace=False)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def _queued(client: redis.Redis) -> list[tuple[str, object]]:
    """The messages waiting in the deliveries queue, oldest first: (task, argument)."""
    messages = []
    for raw in reversed(client.lrange(DELIVERIES_QUEUE, 0, -1)):  # LPUSH: newest first
        message = json.loads(raw)
        body = json.loads(base64.b64decode(message["body"]))
        messages.append((message["headers"]["task"], body[0][0]))
    return messages


def _publisher(threads: int):
    settings = Settings(broker_url=REDIS_URL, relay_keys_per_message=16, worker_concurrency=threads)
    return celery_publisher(settings)


def test_a_small_batch_spreads_over_the_threads_when_nothing_waits(client) -> None:
    # Not behind: the relay goes on ending its lingers at a lull.
    assert _publisher(threads=4)([1, 2, 3, 4, 5, 6, 7, 8, 9]) is False
    assert _queued(client) == [
        (PROCESS_DELIVERIES, [1, 2, 3]),
        (PROCESS_DELIVERIES, [4, 5]),
        (PROCESS_DELIVERIES, [6, 7]),
        (PROCESS_DELIVERIES, [8, 9]),
    ]


def test_a_small_batch_fills_one_message_when_messages_wait(client) -> None:
    publish = _publisher(threads=4)
    publish([1])  # a message the workers have not taken
    # Behind: the relay fills its next batch.
    assert publish([2, 3, 4, 5, 6]) is True
    assert _queued(client) == [(PROCESS_DELIVERY, 1), (PROCESS_DELIVERIES, [2, 3, 4, 5, 6])]


def test_a_batch_that_fills_as_many_messages_as_threads_is_not_spread(client) -> None:
    _publisher(threads=2)(list(range(1, 21)))
    assert _queued(client) == [
        (PROCESS_DELIVERIES, list(range(1, 17))),
        (PROCESS_DELIVERIES, list(range(17, 21))),
    ]


def test_a_lone_key_tells_whether_messages_wait(client) -> None:
    publish = _publisher(threads=4)
    assert publish([1]) is False  # the queue was empty
    assert publish([2]) is True  # the first still waits: the workers are behind
    assert _queued(client) == [(PROCESS_DELIVERY, 1), (PROCESS_DELIVERY, 2)]
