"""The Redis broker: kombu's Redis transport, with one client per channel.

kombu's Redis channel (kombu 5.7) builds a new ``redis.Redis`` client for each
command it runs outside its consumer's own connection (``conn_or_acquire``):
receiving a message (the unacked copy), acknowledging it, publishing one. The
client only wraps the channel's connection pool, yet building one costs about
0.15 ms of CPU (redis-py 8 sets up its response callbacks each time): with
one message per delivery that was 12 % of a worker's time holding the GIL
(docs/performance.md, section 11).

Here a channel builds that client once and reuses it. A ``redis.Redis`` client
may be shared between threads: it takes a connection from the pool for each
command (or pipeline) and returns it after. The client is rebuilt when the
channel's pool changes (kombu drops the pool after a fork and on close), so it
never holds a pool kombu has let go.

``tests/integration/test_redis_broker.py`` fails when kombu stops building a client
per command (then this module can go) or renames what it overrides.

Selected by the Celery setting ``broker_transport`` whenever the broker URL is
``redis://`` (``models.broker.connection.broker_transport``). ``rediss://``
keeps kombu's own transport: kombu checks that URL's TLS options by its
scheme, a check a transport of our own would skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis
from redis.exceptions import ConnectionError as RedisConnectionError


class Channel(redis.Channel):
    """kombu's Redis channel, reusing one client for its commands."""

    _shared_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        if self._pool is None and self.connection.client is None:
            # The transport was closed under this channel (the broker went
            # away while messages were unacknowledged, and Celery tears the
            # connection down before reconnecting). kombu would build a pool
            # from connection parameters that are gone and raise
            # AttributeError, which Celery's teardown does not expect: the
            # worker's consumer stopped for good. A connection error is what
            # the teardown ignores; the unacknowledged messages stay in Redis
            # for the visibility timeout, and their rows for the sweeper.
            raise RedisConnectionError("the broker connection is closed")
        shared = self._shared_client
        if shared is None or shared.connection_pool is not self.pool:
            shared = self._shared_client = self._create_client()
        yield shared


class Transport(redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel
