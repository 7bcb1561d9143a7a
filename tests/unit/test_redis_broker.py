"""models.broker.redis_transport, with no server: what our transport leaves in Redis
when a message is published, received, acknowledged, or held past the
visibility timeout -- on fakeredis (tests/support/fake_redis.py), read back
key by key. The same transport on the real Redis:
tests/integration/test_redis_broker.py."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import fakeredis
import pytest
from kombu import Connection, Exchange, Queue

from models.broker import redis_transport
from models.broker.connection import broker_transport, broker_transport_options
from models.settings import Settings
from tests.support.fake_redis import FakeRedis

QUEUE = Queue("broker-test", Exchange("broker-test"), "broker-test")
#: taskhook's visibility timeout: how long a received message may go unacknowledged.
VISIBILITY_SECONDS = Settings().visibility_timeout_seconds


@pytest.fixture
def connection(fake_redis: FakeRedis) -> Iterator[Connection]:
    """A kombu connection as taskhook's processes open one to a Redis broker:
    the transport and its options chosen by the settings."""
    settings = Settings(broker_url=fake_redis.url)
    options = broker_transport_options(settings)
    assert options["visibility_timeout"] == VISIBILITY_SECONDS
    transport = broker_transport(settings)
    with Connection(fake_redis.url, transport=transport, transport_options=options) as conn:
        yield conn


def publish(connection: Connection, payload: dict, **headers: str) -> None:
    with connection.Producer() as producer:
        producer.publish(
            payload,
            exchange=QUEUE.exchange,
            routing_key=QUEUE.routing_key,
            declare=[QUEUE],
            serializer="json",
            headers=headers,
            delivery_mode=2,
        )


def queued(redis: fakeredis.FakeRedis) -> list[dict]:
    """The messages in the queue's list, oldest first (kombu LPUSHes, BRPOPs)."""
    return [json.loads(raw) for raw in reversed(redis.lrange(QUEUE.name, 0, -1))]


def test_a_redis_url_selects_our_transport(connection, fake_redis):
    assert broker_transport(Settings(broker_url=fake_redis.url)) == (
        "models.broker.redis_transport:Transport"
    )
    assert isinstance(connection.default_channel, redis_transport.Channel)


def test_a_published_message_is_pushed_whole_on_its_queues_list(connection, redis):
    publish(connection, {"key": 7}, task="worker.process_delivery")

    [message] = queued(redis)
    assert json.loads(base64.b64decode(message["body"])) == {"key": 7}
    assert message["content-type"] == "application/json"
    assert message["headers"] == {"task": "worker.process_delivery"}
    assert message["properties"]["body_encoding"] == "base64"
    assert message["properties"]["delivery_mode"] == 2
    assert message["properties"]["delivery_info"] == {
        "exchange": "broker-test",
        "routing_key": "broker-test",
    }
    # The binding that routes the exchange to the list.
    assert redis.smembers(f"_kombu.binding.{QUEUE.name}")


def test_messages_are_taken_in_the_order_they_were_published(connection, redis):
    for key in range(3):
        publish(connection, {"key": key})
    channel = connection.default_channel

    taken = [channel.basic_get(QUEUE.name, no_ack=True).payload["key"] for _ in range(3)]

    assert taken == [0, 1, 2]
    assert channel.basic_get(QUEUE.name, no_ack=True) is None
    assert redis.llen(QUEUE.name) == 0


def test_a_received_message_is_held_in_unacked_until_it_is_acknowledged(connection, redis):
    publish(connection, {"key": 1})
    channel = connection.default_channel

    message = channel.basic_get(QUEUE.name, no_ack=False)

    assert redis.llen(QUEUE.name) == 0
    # Off the list, but not gone: the copy a lost worker's message comes back from.
    held = json.loads(redis.hget("unacked", message.delivery_tag))
    assert json.loads(base64.b64decode(held[0]["body"])) == {"key": 1}
    assert held[1:] == ["broker-test", "broker-test"]
    received_at = redis.zscore("unacked_index", message.delivery_tag)
    assert time.time() - 5 < received_at <= time.time()

    message.ack()

    assert redis.hlen("unacked") == 0
    assert redis.zcard("unacked_index") == 0
    assert redis.llen(QUEUE.name) == 0


def test_an_unacknowledged_message_comes_back_after_the_visibility_timeout_not_before(
    connection, redis
):
    publish(connection, {"key": 1})
    channel = connection.default_channel
    message = channel.basic_get(QUEUE.name, no_ack=False)

    # Another worker's periodic restore, while the timeout runs: nothing moves.
    channel.qos.restore_visible(interval=1)
    assert redis.llen(QUEUE.name) == 0
    assert redis.hlen("unacked") == 1

    # Received longer ago than the timeout, as after a worker died holding it.
    redis.zadd("unacked_index", {message.delivery_tag: time.time() - VISIBILITY_SECONDS - 1})
    channel.qos.restore_visible(interval=1)  # kombu scans on every tenth call by default

    assert redis.hlen("unacked") == 0
    assert redis.zcard("unacked_index") == 0
    [again] = queued(redis)
    assert json.loads(base64.b64decode(again["body"])) == {"key": 1}
    assert again["headers"]["redelivered"] is True
    assert channel.basic_get(QUEUE.name, no_ack=True).payload == {"key": 1}


def test_a_closing_consumer_hands_back_what_it_did_not_acknowledge(connection, redis):
    for key in range(2):
        publish(connection, {"key": key})
    channel = connection.default_channel
    first = channel.basic_get(QUEUE.name, no_ack=False)
    channel.basic_get(QUEUE.name, no_ack=False)
    first.ack()

    channel.close()  # a worker's warm shutdown

    assert redis.hlen("unacked") == 0
    assert [json.loads(base64.b64decode(m["body"])) for m in queued(redis)] == [{"key": 1}]


def test_a_rejected_message_goes_back_behind_those_waiting(connection, redis):
    publish(connection, {"key": 1})
    publish(connection, {"key": 2})
    channel = connection.default_channel

    # What Celery does for a task whose worker was lost (task_reject_on_worker_lost).
    channel.basic_get(QUEUE.name, no_ack=False).reject(requeue=True)

    assert redis.hlen("unacked") == 0
    taken = [channel.basic_get(QUEUE.name, no_ack=True).payload["key"] for _ in range(2)]
    assert taken == [2, 1]


def test_a_redis_that_is_down_is_a_connection_error_the_senders_handle(connection, fake_redis):
    channel = connection.default_channel
    fake_redis.server.connected = False

    with pytest.raises(channel.connection_errors):
        publish(connection, {"key": 1})
