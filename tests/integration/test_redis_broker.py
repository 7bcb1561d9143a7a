"""models.broker.redis_transport: kombu's Redis transport with one client per channel.

Redis: a database of its own (TASKHOOK_TEST_REDIS_URL, default db 13),
emptied before and after each test.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
import redis as redis_py
from kombu import Connection, Exchange, Queue
from kombu.transport import redis as kombu_redis

from models.broker import redis_transport
from models.broker.connection import broker_transport
from models.settings import Settings
from tests.support.processes import REDIS_URL
from worker.celery_app import celery_config


@pytest.fixture
def connection() -> Iterator[Connection]:
    redis_py.Redis.from_url(REDIS_URL).flushdb()
    with Connection(REDIS_URL, transport=broker_transport(Settings(broker_url=REDIS_URL))) as conn:
        yield conn
    redis_py.Redis.from_url(REDIS_URL).flushdb()


def test_the_settings_select_it_for_redis_urls_only(tmp_path):
    assert celery_config(Settings(broker_url="redis://127.0.0.1:6379/0"))["broker_transport"] == (
        "models.broker.redis_transport:Transport"
    )
    # kombu checks a rediss:// URL's TLS options by its scheme: its own transport keeps that.
    assert broker_transport(Settings(broker_url="rediss://127.0.0.1:6379/0")) is None


def test_kombu_still_builds_a_client_per_command(connection: Connection):
    """When this fails, kombu reuses its client by itself: drop models.broker.redis_transport
    (and this test) rather than keep an override that no longer saves anything."""
    stock = kombu_redis.Channel.conn_or_acquire
    channel = connection.default_channel
    with stock(channel) as first, stock(channel) as second:
        assert first is not second
    # What the override relies on.
    assert "client" in inspect.signature(stock).parameters
    assert callable(kombu_redis.Channel._create_client)


def test_a_channel_whose_transport_was_closed_says_so_with_a_connection_error(
    connection: Connection,
):
    """Celery closes a channel after the broker went away; restoring its
    unacknowledged messages then asked kombu for a pool built from
    connection parameters already gone (AttributeError), which stopped the
    worker's consumer for good. A connection error is what the teardown
    ignores (kombu's maybe_close_channel), so the worker reconnects."""
    channel = connection.default_channel
    channel._disconnect_pools()
    channel.connection.client = None  # as kombu's Connection leaves a closed transport
    with pytest.raises(redis_py.exceptions.ConnectionError), channel.conn_or_acquire():
        pass
    assert isinstance(redis_py.exceptions.ConnectionError(), channel.connection_errors)


def test_a_channel_reuses_one_client_until_its_pool_changes(connection: Connection):
    channel = connection.default_channel
    assert isinstance(channel, redis_transport.Channel)
    with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
        assert first is second
        assert first.connection_pool is channel.pool
    given = object()
    with channel.conn_or_acquire(given) as client:
        assert client is given
    # After a fork kombu drops the pool; the client goes with it.
    channel._after_fork()
    with channel.conn_or_acquire() as after:
        assert after is not first
        assert after.connection_pool is channel.pool


def test_messages_are_published_received_and_acknowledged(connection: Connection):
    queue = Queue("redis-broker-test", Exchange("redis-broker-test"), "redis-broker-test")
    with connection.Producer() as producer:
        for key in range(3):
            producer.publish(
                {"key": key},
                exchange=queue.exchange,
                routing_key="redis-broker-test",
                declare=[queue],
            )
    received = []
    with connection.Consumer(queue, callbacks=[lambda body, message: received.append(message)]):
        while len(received) < 3:
            connection.drain_events(timeout=5)
    assert [message.payload["key"] for message in received] == [0, 1, 2]
    store = redis_py.Redis.from_url(REDIS_URL)
    assert store.hlen("unacked") == 3  # received, not yet acknowledged
    for message in received:
        message.ack()
    assert store.hlen("unacked") == 0
    assert store.zcard("unacked_index") == 0
