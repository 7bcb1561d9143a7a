"""Redis without a server, for the unit tests of the code that speaks Redis.

fakeredis's ``FakeServer`` keeps Redis's data structures in memory and answers
Redis's commands on them. ``channel_on`` is ``models.broker.redis_transport``'s
own channel with its connections going to such a server instead of a socket;
``fake_redis_broker`` puts it in taskhook's Redis transport for one test (the
``fake_redis`` fixture, tests/unit/conftest.py). Everything above the
connection runs unchanged -- the settings' choice of transport and its
options, our channel, kombu's Redis transport, Celery's messages, the relay --
and a test reads what it left in Redis with a ``FakeRedis`` client of the same
server. The integration and end-to-end tests keep the real Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import kombu.pools
import pytest

from models.broker import redis_transport


@dataclass
class FakeRedis:
    """One test's Redis: the server in memory, and the broker URL that reaches it."""

    server: fakeredis.FakeServer = field(default_factory=fakeredis.FakeServer)
    #: A redis:// URL selects the Redis transport and its options as any does;
    #: no host is looked up. Its own host name keeps kombu's process-wide
    #: connection pools (keyed by URL, Celery's producers come from them) from
    #: handing one test a connection to another test's server.
    url: str = field(default_factory=lambda: f"redis://fake-{uuid.uuid4().hex[:12]}:6379/0")

    def client(self) -> fakeredis.FakeRedis:
        """A client of the server, to read what the code under test left there."""
        return fakeredis.FakeRedis(server=self.server)


@contextmanager
def fake_redis_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRedis]:
    """Taskhook's Redis transport talking to a new server in memory; on leaving,
    the connections kombu pooled for it are closed."""
    fake = FakeRedis()
    monkeypatch.setattr(redis_transport.Transport, "Channel", channel_on(fake.server))
    try:
        yield fake
    finally:
        host = fake.url.split("//")[1].split(":")[0]
        for group in (kombu.pools.producers, kombu.pools.connections):
            for key, pool in list(group.items()):
                # A producer pool draws on a connection pool; a connection pool
                # holds the connection it clones.
                connection = getattr(pool, "connection", None) or pool.connections.connection
                if connection.hostname == host:
                    dict.pop(group, key)  # the items' keys are hashed already
                    pool.force_close_all()


def channel_on(server: fakeredis.FakeServer) -> type[redis_transport.Channel]:
    """``models.broker.redis_transport.Channel``, its connections going to ``server``."""

    class OnFakeServer(redis_transport.Channel):
        connection_class = fakeredis.FakeRedisConnection

        def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
            params = super()._connparams(asynchronous)
            # redis-py's periodic PING on a connection is the socket's concern;
            # fakeredis answers it out of turn with redis-py 8.
            params.pop("health_check_interval", None)
            return params | {"server": server}

    return OnFakeServer
