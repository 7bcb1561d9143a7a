"""What the unit tests share: Redis in memory for the code that speaks Redis."""

from __future__ import annotations

from collections.abc import Iterator

import fakeredis
import pytest

from tests.support.fake_redis import FakeRedis, fake_redis_broker


@pytest.fixture
def fake_redis(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRedis]:
    """A Redis server in memory, where taskhook's Redis transport sends this
    test's commands (tests/support/fake_redis.py)."""
    with fake_redis_broker(monkeypatch) as fake:
        yield fake


@pytest.fixture
def redis(fake_redis: FakeRedis) -> fakeredis.FakeRedis:
    """A client of the fake server, to read what the code under test left there."""
    return fake_redis.client()
