"""The relay: hands committed inbox rows to the broker, off the request path.

A webhook request commits its row and puts the row's key here; it never
waits on the broker. A background thread publishes keys in batches, and the
keys of a batch share messages (``relay_keys_per_message`` in each): under a
burst the worker pays the queue's cost per message once for several
deliveries, while a lone delivery still goes alone, at once. While the workers
keep up, a small batch is spread over their threads instead, so that a
delivery does not wait behind the others of its message. If the
broker is down, frozen or slow, keys are dropped after a short timeout and
counted -- nothing is lost, because the row is already durable and ``queued``,
and the sweeper enqueues every queued row older than its grace period.

Each key is submitted with its lane (``models.broker.lanes``): a batch's keys
go to their lanes' queues, in the order they came, each lane's in messages
of its own.

Why not ``.delay()`` in the handler: Celery's publish blocks the request (far
longer on a sick broker), which costs ingress throughput and would hold
requests past GitHub's 10 s timeout when Redis freezes (docs/performance.md,
"1. Ingress": the tutorial receiver that calls ``.delay``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from celery import Celery
from celery.utils.saferepr import saferepr
from kombu.exceptions import ChannelError
from kombu.utils.uuid import uuid

from models import tracing
from models.broker.connection import broker_queues, broker_transport, broker_transport_options
from models.broker.lanes import Lane, keys_per_message
from models.broker.messages import (
    PROCESS_DELIVERIES,
    PROCESS_DELIVERY,
    message_groups,
    task_for,
)
from models.broker.versions import HEADER, MESSAGE_VERSION, stamp_every_message
from models.settings import Settings

log = logging.getLogger(__name__)

#: Publishes a batch of keys to one lane; True when it saw the workers behind
#: (messages waiting in the live lane): the relay then fills its next batch.
Publish = Callable[[Sequence[int], Lane], bool | None]


def celery_publisher(settings: Settings) -> Publish:
    """Publish the worker's messages by name through a producer-only Celery app,
    up to ``relay_keys_per_message`` keys in each (on the background lane,
    ``background_keys_per_message``)."""
    app = Celery("taskhook-ingress", broker=settings.broker_url, set_as_current=False)
    stamp_every_message()  # send_task's messages say their version (RabbitMQ's path)
    app.conf.update(
        broker_transport=broker_transport(settings),
        broker_transport_options=broker_transport_options(settings),
        # Declared as the worker declares them: RabbitMQ refuses a queue
        # redeclared with other arguments (a quorum queue as a classic one).
        task_queues=broker_queues(settings),
        broker_connection_timeout=settings.enqueue_timeout_seconds,
        task_serializer="json",
        accept_content=["json"],
    )
    # One short retry, then give up: the sweeper is the slow path, not us.
    retry_policy = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2}
    messages = DeliveryMessages(app)
    threads = settings.worker_concurrency

    def publish(keys: Sequence[int], lane: Lane = Lane.LIVE) -> bool:
        per_message = keys_per_message(settings, lane)
        with app.producer_or_acquire() as producer:
            if not producer.supports_batch_publish:
                groups = message_groups(keys, per_message)
                for group in groups:
                    name, args = task_for(group)
                    app.send_task(
                        name,
                        args=args,
                        queue=lane.value,
                        producer=producer,
                        retry=True,
                        retry_policy=retry_policy,
                        headers=_traced(group),
                    )
                return False
            # Redis: the whole batch goes out in one pipeline (one round trip),
            # and each message is Celery's own (see DeliveryMessages), published
            # without send_task's routing and option handling -- CPU this thread
            # would otherwise take from the request path under the GIL
            # (docs/performance.md). Buffering cannot fail on the connection, so
            # there is nothing to retry before the flush; a failed flush leaves
            # the batch to the sweeper, like any failed publish.
            #
            # A small batch (fewer full messages than a worker has threads)
            # spreads over the threads while no message waits in the queue:
            # the workers keep up, and a thread is free for each message, so a
            # delivery need not wait behind the others of its message
            # (docs/performance.md, "Latency"). Once messages wait, the workers
            # are behind, and full messages serve them better: each costs a
            # worker about a millisecond of its own, whatever it holds.
            # The background lane is a flood's, or work nobody waits on:
            # full messages always.
            small = lane is Lane.LIVE and -(-len(keys) // per_message) < threads
            waiting = _messages_waiting(producer.channel) if small else 0
            spread = threads if small and not waiting else 1
            groups = message_groups(keys, per_message, spread)
            with producer.batch(max_size=len(groups)):
                for group in groups:
                    body, headers, properties = messages.message(group)
                    if tracing.ON:
                        headers = {**headers, **(_traced(group) or {})}
                    producer.publish(
                        body,
                        exchange="",
                        routing_key=lane.value,
                        serializer="json",
                        headers=headers,
                        delivery_mode=2,
                        retry=False,
                        **properties,
                    )
            return waiting > 0

    return publish


def _traced(group: Sequence[int]) -> dict[str, object] | None:
    """The message header that puts each key's worker run in its trace
    (``models.tracing``); None when not tracing, or no key has a context."""
    if not tracing.ON:
        return None
    contexts = tracing.take(group)
    return {tracing.TRACES_HEADER: tracing.relay_send(contexts)} if contexts else None


def _messages_waiting(channel) -> int:
    """How many messages wait in the live lane, not yet taken by a worker
    (on Redis, its lists' lengths)."""
    try:
        return channel.queue_declare(queue=Lane.LIVE.value, passive=True).message_count
    except ChannelError:  # Redis keeps no empty list: no queue, nothing waiting
        return 0


class DeliveryMessages:
    """The worker's task messages for groups of inbox keys, exactly as Celery's
    ``create_task_message`` builds them, at a fraction of its cost.

    Celery builds some twenty headers per message, most of them the same for
    every message of one task name and process (the task name, the origin
    node, no ETA, no group); only the task id and the arguments differ. Those
    are filled into one message per task name built by Celery itself when the
    publisher starts, so a change in Celery's protocol reaches these messages
    too (tests compare the two). Each also says its version, as every message
    sent through Celery does (``models.broker.versions``).
    """

    #: The task id of the template messages; never published.
    _TEMPLATE_ID = "00000000-0000-0000-0000-000000000000"

    def __init__(self, app: Celery) -> None:
        self._templates = {}
        for name, args in ((PROCESS_DELIVERY, [0]), (PROCESS_DELIVERIES, [[0, 0]])):
            template = app.amqp.create_task_message(
                self._TEMPLATE_ID,
                name,
                args,
                {},
                # None, not False: the task's own setting (no result) applies.
                ignore_result=None,
            )
            self._templates[name] = (
                {**template.headers, HEADER: MESSAGE_VERSION},
                dict(template.properties),
                template.body[2],
            )
        self._argsrepr_maxsize = app.amqp.argsrepr_maxsize
        self._repr_levels = app.conf.task_repr_maxlevels

    def message(self, keys: Sequence[int], task_id: str | None = None) -> tuple[tuple, dict, dict]:
        """The body, headers and properties of the message for inbox rows ``keys``."""
        name, args = task_for(keys)
        template_headers, template_properties, embed = self._templates[name]
        task_id = task_id or uuid()
        headers = template_headers.copy()
        # A message sent outside any task is its own root (as in create_task_message).
        headers["id"] = headers["root_id"] = task_id
        # What the worker logs: the repr of a list of integers, unless Celery
        # would cut it short.
        shown = repr(args)
        if len(shown) > self._argsrepr_maxsize:
            shown = saferepr(args, self._argsrepr_maxsize, maxlevels=self._repr_levels)
        headers["argsrepr"] = shown
        properties = template_properties.copy()
        properties["correlation_id"] = task_id
        return (args, {}, embed), headers, properties


class Relay:
    """A bounded in-memory list of inbox keys and the thread that publishes them."""

    def __init__(
        self,
        publish: Publish,
        *,
        capacity: int = 10_000,
        batch_size: int = 100,
        linger: float = 0.02,
        quiet: float = 0.005,
        lull: float = 0.002,
        on_dropped: Callable[[int], None] = lambda count: None,
        on_published: Callable[[int], None] = lambda count: None,
    ) -> None:
        self._publish = publish
        self._capacity = capacity
        self._batch_size = batch_size
        self._linger = linger
        self._quiet = quiet
        self._lull = lull
        #: When the last key came, and how long before it came the one
        #: before -- for a batch's first key: whether it came after a lull.
        self._last_arrival = 0.0
        self._first_gap = float("inf")
        #: What the last publish said: the workers are behind.
        self._workers_behind = False
        self._on_dropped = on_dropped
        self._on_published = on_published
        self._lock = threading.Lock()
        self._keys: list[tuple[int, Lane]] = []
        #: How many of ``_keys`` are live (see ``_linger_while_keys_arrive``).
        self._live_pending = 0
        #: Set while keys wait: the thread wakes once per batch, not once per key.
        self._waiting = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taskhook-relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Publish what is queued (within ``timeout``), then stop."""
        self._stopping.set()
        self._waiting.set()
        self._thread.join(timeout)

    def submit(self, key: int, lane: Lane = Lane.LIVE) -> None:
        """Queue ``key`` for publishing on ``lane``; never blocks. When full,
        the key is dropped and counted: its row stays queued for the sweeper."""
        with self._lock:
            if len(self._keys) >= self._capacity:
                full = True
            else:
                full = False
                self._keys.append((key, lane))
                self._live_pending += lane is Lane.LIVE
                first = len(self._keys) == 1
                now = time.monotonic()
                if first:
                    self._first_gap = now - self._last_arrival
                self._last_arrival = now
        if full:
            self._on_dropped(1)
        elif first:
            # Only the first key of a batch wakes the thread. Waking it for
            # every key cost more than publishing: each wake-up took the GIL
            # from the event loop in the middle of a request
            # (docs/performance.md).
            self._waiting.set()

    def pending(self) -> int:
        with self._lock:
            return len(self._keys)

    def _next_batch(self) -> list[tuple[int, Lane]]:
        if not self._waiting.wait(timeout=0.1):
            return []
        self._linger_while_keys_arrive()
        with self._lock:
            if self._live_pending and len(self._keys) > self._batch_size:
                # A flood's keys ahead of a live one do not make it wait a
                # batch: live keys go first, each lane keeping its order.
                self._keys.sort(key=lambda item: item[1] is not Lane.LIVE)
            batch = self._keys[: self._batch_size]
            del self._keys[: self._batch_size]
            self._live_pending -= sum(1 for _, lane in batch if lane is Lane.LIVE)
            if not self._keys:
                self._waiting.clear()
        return batch

    def _linger_while_keys_arrive(self) -> None:
        """Wait for more keys while they keep coming: until ``quiet`` passes
        without a new one, ``linger`` in all, or a full batch -- but only
        when there is a queue.

        A publish has a fixed cost (a pipeline, a producer) and so has each
        message at the worker, which a batch of one pays alone: under a burst
        the keys share them. But every key waits here for the worker to start
        on it. So a key that came after a ``lull`` (none came in the ``lull``
        before it) and finds the workers keeping up goes at once: waiting even
        5 ms for more was most of a delivery's latency at a hundred a second
        (docs/performance.md, "Latency"). Keys that come closer together than
        that are a burst, and share a batch while they keep coming; a lull
        ends the wait. While the last publish found the workers behind, it
        lingers its whole time.

        A live key does not wait for a flood: a flood's keys arrive without a
        lull, so once the batch holds live keys, a quiet spell without a new
        live key ends the wait, however many background keys come meanwhile.
        """
        with self._lock:
            after_a_lull = self._first_gap >= self._lull
        if after_a_lull and not self._workers_behind:
            return
        deadline = time.monotonic() + self._linger
        # Behind, the workers would not start on these keys any sooner: fill
        # the batch, as many keys a message as the linger gathers.
        quiet = self._linger if self._workers_behind else self._quiet
        seen, live_seen = self._counts()
        while seen < self._batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping.wait(min(quiet, remaining)):
                return
            arrived, live_arrived = self._counts()
            if arrived == seen or (live_seen and live_arrived == live_seen):
                return
            seen, live_seen = arrived, live_arrived

    def _counts(self) -> tuple[int, int]:
        """The keys waiting, and how many of them are live."""
        with self._lock:
            return len(self._keys), self._live_pending

    def _run(self) -> None:
        while not (self._stopping.is_set() and not self.pending()):
            batch = self._next_batch()
            if not batch:
                continue
            behind = False
            for lane, keys in _by_lane(batch):
                try:
                    behind = bool(self._publish(keys, lane)) or behind
                except Exception:  # the broker is sick; the sweeper has these rows
                    log.warning(
                        "broker publish failed; %d deliveries left to the sweeper", len(keys)
                    )
                    self._on_dropped(len(keys))
                    if not self._stopping.is_set():
                        time.sleep(0.5)  # do not spin against a dead broker
                else:
                    self._on_published(len(keys))
            self._workers_behind = behind


def _by_lane(batch: Sequence[tuple[int, Lane]]) -> list[tuple[Lane, list[int]]]:
    """A batch's keys by lane, live first, each lane's in the order they came."""
    lanes: dict[Lane, list[int]] = {}
    for key, lane in batch:
        lanes.setdefault(lane, []).append(key)
    return sorted(lanes.items(), key=lambda item: item[0] is not Lane.LIVE)
