"""What the ingress holds while it runs: settings, sessions, the relay, metrics,
and a short-lived cache of webhook sources."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from ingest.metrics import IngressMetrics
from ingest.relay import Relay
from models.db import session_scope
from models.settings import Settings
from models.sources import VerifyingSource, verifying_source

_MAX_CACHED_SOURCES = 1000


class StoreUnavailable(Exception):
    """The database could not be reached or answered with an error of its own."""


@dataclass
class Runtime:
    settings: Settings
    sessions: sessionmaker[Session]
    relay: Relay
    metrics: IngressMetrics
    _sources: dict[tuple[str, str], tuple[float, VerifyingSource]] = field(default_factory=dict)

    @contextmanager
    def store_errors(self) -> Iterator[None]:
        """Turn the database's own failures into StoreUnavailable (a 503)."""
        try:
            yield
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as error:
            raise StoreUnavailable(str(error.__class__.__name__)) from error

    async def verifying_source(self, provider: str, slug: str) -> VerifyingSource | None:
        """The enabled source and its active secrets. Cached for
        ``source_cache_seconds``, so a hot webhook costs no extra query; a
        disabled source or a rotated secret takes effect within that time."""
        key = (provider, slug)
        now = time.monotonic()
        cached = self._sources.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        source = await run_in_threadpool(self._load_source, provider, slug)
        # Only known sources are cached: random slugs must not grow the cache.
        if source is not None and self.settings.source_cache_seconds > 0:
            if len(self._sources) >= _MAX_CACHED_SOURCES:
                self._sources.clear()
            self._sources[key] = (now + self.settings.source_cache_seconds, source)
        return source

    def _load_source(self, provider: str, slug: str) -> VerifyingSource | None:
        with self.store_errors(), session_scope(self.sessions) as session:
            return verifying_source(session=session, provider=provider, slug=slug)
