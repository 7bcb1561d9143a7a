"""The relay: hands committed inbox rows to the broker, off the request path.

A webhook request commits its row and puts the row's key here; it never
waits on the broker. A background thread publishes keys in batches. If the
broker is down, frozen or slow, keys are dropped after a short timeout and
counted -- nothing is lost, because the row is already durable and ``queued``,
and the sweeper enqueues every queued row older than its grace period.

Why not ``.delay()`` in the handler: Celery's publish blocks (~430 us, far
longer on a sick broker), which halves ingress throughput and would hold
requests past GitHub's 10 s timeout when Redis freezes (PERF-NOTES).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

from celery import Celery
from kombu.utils.uuid import uuid

from models.messages import DELIVERIES_QUEUE, PROCESS_DELIVERY
from models.settings import Settings

log = logging.getLogger(__name__)

Publish = Callable[[Sequence[int]], None]


def celery_publisher(settings: Settings) -> Publish:
    """Publish PROCESS_DELIVERY messages by name through a producer-only Celery app."""
    app = Celery("taskhook-ingress", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        broker_transport_options=settings.broker_transport_options(),
        broker_connection_timeout=settings.enqueue_timeout_seconds,
        task_serializer="json",
        accept_content=["json"],
    )
    # One short retry, then give up: the sweeper is the slow path, not us.
    retry_policy = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2}

    def publish(keys: Sequence[int]) -> None:
        with app.producer_or_acquire() as producer:
            if not producer.supports_batch_publish:
                for key in keys:
                    app.send_task(
                        PROCESS_DELIVERY,
                        args=[key],
                        queue=DELIVERIES_QUEUE,
                        producer=producer,
                        retry=True,
                        retry_policy=retry_policy,
                    )
                return
            # Redis: the whole batch goes out in one pipeline (one round trip),
            # and each message is built by Celery's own create_task_message
            # and published without send_task's routing and option handling:
            # about 75 us of CPU a key instead of 430 (unbatched) or 160
            # (batched send_task) -- CPU this thread would otherwise take from
            # the request path under the GIL (docs/performance.md). Buffering
            # cannot fail on the connection, so there is nothing to retry
            # before the flush; a failed flush leaves the batch to the sweeper,
            # like any failed publish.
            with producer.batch(max_size=len(keys)):
                for key in keys:
                    message = app.amqp.create_task_message(
                        uuid(),
                        PROCESS_DELIVERY,
                        [key],
                        {},
                        # None, not False: the task's own setting (no result) applies.
                        ignore_result=None,
                    )
                    producer.publish(
                        message.body,
                        exchange="",
                        routing_key=DELIVERIES_QUEUE,
                        serializer="json",
                        headers=message.headers,
                        delivery_mode=2,
                        retry=False,
                        **message.properties,
                    )

    return publish


class Relay:
    """A bounded in-memory queue of inbox keys and the thread that publishes them."""

    def __init__(
        self,
        publish: Publish,
        *,
        capacity: int = 10_000,
        batch_size: int = 100,
        linger: float = 0.005,
        on_dropped: Callable[[int], None] = lambda count: None,
        on_published: Callable[[int], None] = lambda count: None,
    ) -> None:
        self._publish = publish
        self._keys: queue.Queue[int] = queue.Queue(maxsize=capacity)
        self._batch_size = batch_size
        self._linger = linger
        self._on_dropped = on_dropped
        self._on_published = on_published
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taskhook-relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Publish what is queued (within ``timeout``), then stop."""
        self._stopping.set()
        self._thread.join(timeout)

    def submit(self, key: int) -> None:
        """Queue ``key`` for publishing; never blocks. When full, the key is
        dropped and counted: its row stays queued for the sweeper."""
        try:
            self._keys.put_nowait(key)
        except queue.Full:
            self._on_dropped(1)

    def pending(self) -> int:
        return self._keys.qsize()

    def _next_batch(self) -> list[int]:
        try:
            batch = [self._keys.get(timeout=0.1)]
        except queue.Empty:
            return []
        # Linger a few milliseconds for more keys: a publish has a fixed cost
        # (a pipeline, a producer) that a batch of one pays alone, and at a
        # few hundred deliveries a second most batches were of one or two.
        deadline = time.monotonic() + self._linger
        while len(batch) < self._batch_size:
            remaining = 0.0 if self._stopping.is_set() else deadline - time.monotonic()
            try:
                if remaining > 0:
                    batch.append(self._keys.get(timeout=remaining))
                else:
                    batch.append(self._keys.get_nowait())
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        while not (self._stopping.is_set() and self._keys.empty()):
            batch = self._next_batch()
            if not batch:
                continue
            try:
                self._publish(batch)
            except Exception:  # the broker is sick; the sweeper has these rows
                log.warning("broker publish failed; %d deliveries left to the sweeper", len(batch))
                self._on_dropped(len(batch))
                if not self._stopping.is_set():
                    time.sleep(0.5)  # do not spin against a dead broker
            else:
                self._on_published(len(batch))
