"""The relay: Celery's own messages, published in batches, off the request path."""

from __future__ import annotations

import threading
import time
import uuid
from queue import Empty

import pytest
from celery import Celery

from ingest.relay import DeliveryMessages, Relay, celery_publisher
from models.broker.lanes import Lane
from models.broker.messages import (
    BACKGROUND_QUEUE,
    DELIVERIES_QUEUE,
    PROCESS_DELIVERIES,
    PROCESS_DELIVERY,
    message_groups,
    task_for,
)
from models.broker.versions import HEADER, MESSAGE_VERSION
from models.settings import Settings


def _app() -> Celery:
    app = Celery("taskhook-ingress", broker="memory://", set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    return app


TASK_ID = "5f0c7b8e-1d2a-4c3b-9e8f-0a1b2c3d4e5f"


def test_a_delivery_message_is_exactly_what_celery_builds() -> None:
    app = _app()
    for key in (1, 42, 2**40):
        celery = app.amqp.create_task_message(
            TASK_ID, PROCESS_DELIVERY, [key], {}, ignore_result=None
        )
        body, headers, properties = DeliveryMessages(app).message([key], TASK_ID)
        assert body == celery.body
        # Celery's headers, and the version every message of ours says it is.
        assert headers == {**celery.headers, HEADER: MESSAGE_VERSION}
        assert properties == celery.properties


@pytest.mark.parametrize("keys", [[1, 2], list(range(16)), [2**40] * 100])
def test_a_message_of_several_keys_is_exactly_what_celery_builds(keys) -> None:
    # 100 large keys: past Celery's 1,024-character argsrepr, which it cuts short.
    app = _app()
    celery = app.amqp.create_task_message(
        TASK_ID, PROCESS_DELIVERIES, [keys], {}, ignore_result=None
    )
    body, headers, properties = DeliveryMessages(app).message(keys, TASK_ID)
    assert body == celery.body
    assert headers == {**celery.headers, HEADER: MESSAGE_VERSION}
    assert properties == celery.properties


def test_each_message_has_its_own_task_id() -> None:
    messages = DeliveryMessages(_app())
    first, second = messages.message([7])[1], messages.message([7])[1]
    assert first["id"] != second["id"]
    assert first["root_id"] == first["id"]
    assert first["argsrepr"] == "[7]"


def test_keys_share_messages_in_order_and_a_lone_key_goes_alone() -> None:
    assert message_groups(list(range(1, 8)), 3) == [[1, 2, 3], [4, 5, 6], [7]]
    assert message_groups([5], 16) == [[5]]
    assert task_for([7]) == (PROCESS_DELIVERY, [7])
    assert task_for([7, 8]) == (PROCESS_DELIVERIES, [[7, 8]])


def test_keys_that_would_fill_few_messages_spread_over_the_worker_threads() -> None:
    # Three messages' worth of keys for four threads: four messages, even.
    assert message_groups(list(range(1, 9)), 3, spread=4) == [[1, 2], [3, 4], [5, 6], [7, 8]]
    assert message_groups(list(range(10)), 16, spread=4) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    # No more messages than one per two keys.
    assert message_groups(list(range(1, 8)), 3, spread=4) == [[1, 2], [3, 4], [5, 6], [7]]
    assert message_groups([1, 2, 3], 16, spread=4) == [[1, 2], [3]]
    assert message_groups([1, 2], 16, spread=4) == [[1, 2]]
    assert message_groups([1], 16, spread=4) == [[1]]
    # Enough keys to fill as many messages as threads: full messages, as before.
    many = list(range(70))
    assert message_groups(many, 16, spread=4) == message_groups(many, 16)
    assert [len(group) for group in message_groups(many, 16, spread=4)] == [16, 16, 16, 16, 6]
    assert message_groups([], 16, spread=4) == []


def test_the_publisher_sends_one_message_per_group() -> None:
    # The in-memory transport cannot batch, so this is the send_task branch
    # (a broker without pipelines); Redis's is proven end to end.
    broker = f"memory://relay-{uuid.uuid4().hex}"
    publish = celery_publisher(Settings(broker_url=broker, relay_keys_per_message=3))
    publish(list(range(1, 8)), Lane.LIVE)
    publish([8, 9], Lane.BACKGROUND)

    app = Celery("reader", broker=broker, set_as_current=False)
    seen: dict[str, list] = {}
    with app.connection_for_read() as connection:
        for lane in Lane:
            queue = connection.SimpleQueue(lane.value)
            while True:
                try:
                    message = queue.get(timeout=0.2)
                except Empty:
                    break
                seen.setdefault(lane.value, []).append(
                    (message.headers["task"], message.payload[0])
                )
                assert message.headers[HEADER] == MESSAGE_VERSION
                message.ack()
            queue.close()
    assert seen == {
        DELIVERIES_QUEUE: [
            (PROCESS_DELIVERIES, [[1, 2, 3]]),
            (PROCESS_DELIVERIES, [[4, 5, 6]]),
            (PROCESS_DELIVERY, [7]),
        ],
        BACKGROUND_QUEUE: [(PROCESS_DELIVERIES, [[8, 9]])],
    }


class _Recorder:
    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.published = threading.Event()

        self.lanes: list[Lane] = []

    def __call__(self, keys, lane) -> None:
        self.batches.append(list(keys))
        self.lanes.append(lane)
        self.published.set()


def test_keys_are_published_once_each_in_batches() -> None:
    publish = _Recorder()
    published: list[int] = []
    relay = Relay(publish, batch_size=10, linger=0.05, on_published=published.append)
    relay.start()
    for key in range(25):
        relay.submit(key)
    relay.stop()
    assert [key for batch in publish.batches for key in batch] == list(range(25))
    assert all(len(batch) <= 10 for batch in publish.batches)
    # Submitted at once, they went out in full batches, not one by one.
    assert len(publish.batches) == 3
    assert sum(published) == 25


def test_each_key_goes_to_its_lane_live_first_each_lane_in_order() -> None:
    publish = _Recorder()
    relay = Relay(publish, batch_size=10, linger=0.05)  # not started: one batch
    for key in range(6):
        relay.submit(key, Lane.BACKGROUND if key % 2 else Lane.LIVE)
    relay.start()
    relay.stop()
    assert list(zip(publish.lanes, publish.batches, strict=True)) == [
        (Lane.LIVE, [0, 2, 4]),
        (Lane.BACKGROUND, [1, 3, 5]),
    ]


def test_a_live_key_behind_a_flood_goes_in_the_first_batch() -> None:
    # 25 background keys queued before one live key, batches of 10: the live
    # key does not wait for the three batches ahead of it.
    publish = _Recorder()
    relay = Relay(publish, batch_size=10, linger=0.0)  # not started: all queued at once
    for key in range(25):
        relay.submit(key, Lane.BACKGROUND)
    relay.submit(99, Lane.LIVE)
    relay.start()
    relay.stop()
    assert (publish.lanes[0], publish.batches[0]) == (Lane.LIVE, [99])
    background = [
        key
        for lane, batch in zip(publish.lanes, publish.batches, strict=True)
        for key in batch
        if lane is Lane.BACKGROUND
    ]
    assert background == list(range(25))


def test_a_lane_the_broker_refuses_leaves_the_other_published() -> None:
    sent: list[tuple[Lane, list[int]]] = []
    dropped: list[int] = []

    def live_only(keys, lane) -> None:
        if lane is Lane.BACKGROUND:
            raise ConnectionError("no background queue")
        sent.append((lane, list(keys)))

    relay = Relay(live_only, linger=0.0, on_dropped=dropped.append)
    relay.submit(1, Lane.BACKGROUND)
    relay.submit(2, Lane.LIVE)
    relay.start()
    relay.stop()
    assert sent == [(Lane.LIVE, [2])]
    assert dropped == [1]


def test_a_lone_key_goes_out_after_the_linger() -> None:
    publish = _Recorder()
    relay = Relay(publish, linger=0.01)
    relay.start()
    try:
        relay.submit(1)
        assert publish.published.wait(2.0)
        assert publish.batches == [[1]]
        assert relay.pending() == 0
    finally:
        relay.stop()


def test_a_lull_ends_the_linger_at_once() -> None:
    # A long linger, a short quiet: the lone key does not wait for the linger.
    publish = _Recorder()
    relay = Relay(publish, linger=5.0, quiet=0.01)
    relay.start()
    try:
        started = time.monotonic()
        relay.submit(1)
        assert publish.published.wait(2.0)
        assert time.monotonic() - started < 1.0
        assert publish.batches == [[1]]
    finally:
        relay.stop()


def test_a_key_after_a_lull_goes_at_once_while_the_workers_keep_up() -> None:
    # A long linger and a long quiet: a key that came after a lull waits for neither.
    publish = _Recorder()
    relay = Relay(publish, linger=5.0, quiet=1.0, lull=0.002)
    relay.start()
    try:
        time.sleep(0.01)
        started = time.monotonic()
        relay.submit(1)
        assert publish.published.wait(2.0)
        assert time.monotonic() - started < 0.5
        assert publish.batches == [[1]]
    finally:
        relay.stop()


def test_keys_that_keep_arriving_keep_the_batch_open() -> None:
    # A key every 10 ms, closer than the 50 ms lull: a burst. The first came
    # after a lull and goes at once; the others, against a 100 ms quiet, share
    # one batch until the linger ends it.
    publish = _Recorder()
    relay = Relay(publish, linger=0.5, quiet=0.1, lull=0.05)
    relay.start()
    try:
        for key in range(10):
            relay.submit(key)
            time.sleep(0.01)
        assert publish.published.wait(2.0)
        relay.stop()
        assert publish.batches[:2] == [[0], list(range(1, 10))]
    finally:
        relay.stop()


def test_a_live_key_does_not_linger_for_a_flood_that_keeps_arriving() -> None:
    # Background keys every 10 ms against a 100 ms quiet would hold the batch
    # open for the whole linger (5 s); one live key among them ends it once
    # no other live key came for a quiet spell.
    publish = _Recorder()
    relay = Relay(publish, batch_size=1000, linger=5.0, quiet=0.1)
    relay.start()
    try:
        relay.submit(0, Lane.BACKGROUND)
        started = time.monotonic()
        relay.submit(1, Lane.LIVE)
        for key in range(2, 300):  # three seconds of a flood, unless published first
            if publish.published.is_set():
                break
            relay.submit(key, Lane.BACKGROUND)
            time.sleep(0.01)
        assert publish.published.wait(5.0)
        assert time.monotonic() - started < 0.6
        assert (publish.lanes[0], publish.batches[0]) == (Lane.LIVE, [1])
    finally:
        relay.stop()


def test_while_the_workers_are_behind_the_relay_lingers_its_whole_time() -> None:
    # The publisher says messages wait: the next lone key waits out the linger.
    published_at: list[float] = []

    def behind(keys, lane) -> bool:
        published_at.append(time.monotonic())
        return True

    relay = Relay(behind, linger=0.3, quiet=0.005)
    relay.start()
    try:
        relay.submit(1)
        wait_for = time.monotonic() + 2.0
        while not published_at and time.monotonic() < wait_for:
            time.sleep(0.005)
        submitted = time.monotonic()
        relay.submit(2)
        while len(published_at) < 2 and time.monotonic() < wait_for + 2.0:
            time.sleep(0.005)
        assert len(published_at) == 2
        assert published_at[1] - submitted >= 0.25
    finally:
        relay.stop()


def test_a_full_relay_drops_and_counts_instead_of_blocking() -> None:
    dropped: list[int] = []
    relay = Relay(lambda keys, lane: None, capacity=3, on_dropped=dropped.append)  # never started
    started = time.monotonic()
    for key in range(5):
        relay.submit(key)
    assert time.monotonic() - started < 0.5
    assert relay.pending() == 3
    assert dropped == [1, 1]


def test_a_failed_publish_leaves_the_batch_to_the_sweeper() -> None:
    dropped: list[int] = []

    def broken(keys, lane) -> None:
        raise ConnectionError("broker down")

    relay = Relay(broken, linger=0.0, on_dropped=dropped.append)
    relay.start()
    relay.submit(1)
    relay.submit(2)
    relay.stop()
    assert sum(dropped) == 2
    assert relay.pending() == 0
