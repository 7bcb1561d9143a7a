"""The relay's sends to Redis, with no server: the batch branch of
``celery_publisher`` (one pipeline, Celery's own messages built by
``DeliveryMessages``) on our Redis transport over fakeredis (the
``fake_redis`` fixture, tests/support/fake_redis.py), read back from the deliveries list as a worker
would find them. The same publisher on the real Redis:
tests/integration/ingest/test_relay_redis.py."""

from __future__ import annotations

import base64
import json
from queue import Empty

import fakeredis
from celery import Celery

from ingest.relay import Relay, celery_publisher
from models.broker.connection import broker_transport, broker_transport_options
from models.broker.lanes import Lane
from models.broker.messages import DELIVERIES_QUEUE, PROCESS_DELIVERIES, PROCESS_DELIVERY
from models.broker.versions import HEADER, MESSAGE_VERSION
from models.settings import Settings
from tests.support.fake_redis import FakeRedis


def settings(fake_redis: FakeRedis, threads: int = 4) -> Settings:
    return Settings(
        broker_url=fake_redis.url, relay_keys_per_message=16, worker_concurrency=threads
    )


def publisher(fake_redis: FakeRedis, threads: int = 4):
    return celery_publisher(settings(fake_redis, threads))


def queued(redis: fakeredis.FakeRedis, lane: Lane = Lane.LIVE) -> list[dict]:
    """The raw messages of a lane's list, oldest first (LPUSH: newest first)."""
    return [json.loads(raw) for raw in reversed(redis.lrange(lane.value, 0, -1))]


def body_of(message: dict) -> list:
    return json.loads(base64.b64decode(message["body"]))


def test_a_batch_is_pushed_as_celerys_task_messages_on_the_deliveries_list(fake_redis, redis):
    publisher(fake_redis, threads=2)(list(range(1, 21)))

    messages = queued(redis)
    assert [(m["headers"]["task"], body_of(m)[0]) for m in messages] == [
        (PROCESS_DELIVERIES, [list(range(1, 17))]),
        (PROCESS_DELIVERIES, [list(range(17, 21))]),
    ]
    for message in messages:
        headers, properties = message["headers"], message["properties"]
        # Celery's task protocol 2: the worker finds its task by name, and each
        # message is its own root, with an id of its own.
        assert headers["lang"] == "py"
        assert headers["id"] == headers["root_id"] == properties["correlation_id"]
        assert headers["argsrepr"] == repr(body_of(message)[0])
        assert headers[HEADER] == MESSAGE_VERSION  # read by 0.2.0 on; 0.1.0 passes over it
        assert body_of(message)[1] == {}
        assert message["content-type"] == "application/json"
        assert properties["delivery_mode"] == 2  # persistent
        assert properties["delivery_info"] == {"exchange": "", "routing_key": DELIVERIES_QUEUE}
    assert messages[0]["headers"]["id"] != messages[1]["headers"]["id"]


def test_a_worker_reads_the_relays_messages_as_the_tasks_it_names(fake_redis):
    publish = publisher(fake_redis)
    publish([4])
    publish([5, 6])

    reader = Celery("reader", set_as_current=False)
    reader.conf.update(
        broker_url=fake_redis.url,
        broker_transport=broker_transport(settings(fake_redis)),
        broker_transport_options=broker_transport_options(settings(fake_redis)),
    )
    seen = []
    with reader.connection_for_read() as connection:
        queue = connection.SimpleQueue(DELIVERIES_QUEUE)
        while True:
            try:
                message = queue.get_nowait()
            except Empty:
                break
            seen.append((message.headers["task"], message.payload[0]))
            message.ack()
        queue.close()
    # A lone key is the one-key task; keys that share a message, the batch task.
    assert seen == [(PROCESS_DELIVERY, [4]), (PROCESS_DELIVERIES, [[5, 6]])]


def test_a_small_batch_spreads_while_the_list_is_empty_and_fills_once_messages_wait(
    fake_redis, redis
):
    publish = publisher(fake_redis, threads=4)

    assert publish([1, 2, 3]) is False  # nothing waited
    assert len(queued(redis)) == 2  # spread over the threads
    assert publish([4, 5, 6]) is True  # messages still wait: the workers are behind

    assert body_of(queued(redis)[-1])[0] == [[4, 5, 6]]  # one full message


def test_the_background_lane_gets_full_short_messages_on_its_own_list(fake_redis, redis):
    publish = publisher(fake_redis, threads=4)

    # A flood's few keys are not spread over the threads: the workers owe
    # them no haste, and each message costs a worker its own time.
    assert publish([1, 2, 3], Lane.BACKGROUND) is False
    assert [body_of(m)[0] for m in queued(redis, Lane.BACKGROUND)] == [[[1, 2, 3]]]
    assert queued(redis) == []
    # And as long as the background lane's own setting, whatever a live
    # message holds (TASKHOOK_BACKGROUND_KEYS_PER_MESSAGE).
    publish = celery_publisher(
        Settings(
            broker_url=fake_redis.url,
            relay_keys_per_message=16,
            background_keys_per_message=4,
            worker_concurrency=4,
        )
    )
    publish(list(range(10, 20)), Lane.BACKGROUND)
    assert [body_of(m)[0] for m in queued(redis, Lane.BACKGROUND)][1:] == [
        [[10, 11, 12, 13]],
        [[14, 15, 16, 17]],
        [[18, 19]],
    ]


def test_the_relay_sends_every_key_once(fake_redis, redis):
    published: list[int] = []
    relay = Relay(publisher(fake_redis), linger=0.0, on_published=published.append)
    relay.start()
    for key in range(1, 41):
        relay.submit(key)
    relay.stop()

    sent = []
    for message in queued(redis):
        (argument,) = body_of(message)[0]
        sent += argument if isinstance(argument, list) else [argument]
    assert sorted(sent) == list(range(1, 41))
    assert sum(published) == 40


def test_with_redis_down_the_relay_drops_and_counts_then_sends_again_once_it_is_back(
    fake_redis, redis
):
    dropped: list[int] = []
    relay = Relay(publisher(fake_redis), linger=0.0, on_dropped=dropped.append)
    relay.start()
    try:
        fake_redis.server.connected = False
        relay.submit(1)
        relay.submit(2)
        relay.stop()  # publishes what is queued, or fails, before it returns
    finally:
        fake_redis.server.connected = True
    assert sum(dropped) == 2  # their rows stay queued, for the sweeper
    assert redis.llen(DELIVERIES_QUEUE) == 0

    publisher(fake_redis)([3])
    assert [body_of(m)[0] for m in queued(redis)] == [[3]]
