"""What the ingress holds while it runs: settings, sessions, the relay, metrics,
and a short-lived cache of webhook sources."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
import psycopg
from psycopg.types.json import Json
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker

from ingest.metrics import IngressMetrics
from ingest.relay import Relay
from models.db import session_scope
from models.inbox import DeliveryStatus, IncomingDelivery, Recorded, record_delivery
from models.settings import Settings
from models.sources import VerifyingSource, verifying_source
from models.tables import utcnow

_MAX_CACHED_SOURCES = 1000
#: Deliveries this process stored lately, kept to answer their redeliveries.
_RECENT_DELIVERIES = 10_000
#: Store calls at once when the pool does not say its size (SQLite's pool, say).
_DEFAULT_STORE_CONCURRENCY = 5

T = TypeVar("T")

# The inbox row of models.inbox.record_delivery, written without an ORM session
# on PostgreSQL (see Runtime.record): the same columns, the same conflict
# target, the same answers.
_INSERT_DELIVERY = """
INSERT INTO deliveries (source_id, delivery_id, hook_id, body, body_sha256, content_type,
                        event, action, headers, received_at, updated_at, status,
                        status_reason, attempts, payload_mismatches)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, 0)
ON CONFLICT (source_id, delivery_id) DO NOTHING
RETURNING id
"""
_STORED_DELIVERY = (
    "SELECT id, body_sha256, status FROM deliveries WHERE source_id = %s AND delivery_id = %s"
)
_COUNT_MISMATCH = "UPDATE deliveries SET payload_mismatches = payload_mismatches + 1 WHERE id = %s"


class StoreUnavailable(Exception):
    """The database could not be reached or answered with an error of its own."""


@dataclass
class Runtime:
    settings: Settings
    sessions: sessionmaker[Session]
    relay: Relay
    metrics: IngressMetrics
    _sources: dict[tuple[str, str], tuple[float, VerifyingSource]] = field(default_factory=dict)
    _store_limiter: anyio.CapacityLimiter | None = field(default=None, repr=False)
    #: (source id, delivery id) -> fingerprint of the request (the body's
    #: sha256 and the event header), for the last deliveries this process
    #: stored (committed); oldest first.
    _recent: OrderedDict[tuple[int, str], str] = field(default_factory=OrderedDict, repr=False)

    def stored_lately(self, source_id: int, delivery_id: str, fingerprint: str) -> bool:
        """True when this process stored this delivery, from this very request
        (``fingerprint``), among its last ``_RECENT_DELIVERIES``.

        Such a redelivery is a duplicate whatever the database would say:
        the row was committed before it was remembered, and inbox rows are
        never deleted. A body that differs is not answered from here, so the
        database counts the mismatch.
        """
        return self._recent.get((source_id, delivery_id)) == fingerprint

    def remember(self, source_id: int, delivery_id: str, fingerprint: str) -> None:
        """Note a delivery whose row is committed (see :meth:`stored_lately`)."""
        self._recent[(source_id, delivery_id)] = fingerprint
        if len(self._recent) > _RECENT_DELIVERIES:
            self._recent.popitem(last=False)

    #: PostgreSQL: the inbox writer on the event loop (see AsyncInbox), opened
    #: and closed by the webhook router's lifespan; None elsewhere.
    inbox: AsyncInbox | None = field(default=None, repr=False)

    async def record_delivery(self, incoming: IncomingDelivery) -> Recorded:
        """Store the delivery once: on the event loop where the database allows
        it, else in a store thread through ``models.inbox.record_delivery``."""
        if self.inbox is not None:
            return await self.inbox.record(incoming)
        return await self.in_store_thread(self.record, incoming)

    async def in_store_thread(self, function: Callable[..., T], *args: object) -> T:
        """Run a blocking database call in a worker thread, at most as many at
        once as the engine's pool keeps connections.

        Not the default limit of 40 threads: past the pool's size plus its
        overflow, requests queue inside the pool holding a thread each, and
        overflow connections beyond the pool's size are opened and closed per
        checkout (a new PostgreSQL backend each time). On PostgreSQL the
        webhook path does not come here at all (see AsyncInbox)."""
        if self._store_limiter is None:
            pool = self.sessions.kw["bind"].pool
            size = getattr(pool, "size", lambda: _DEFAULT_STORE_CONCURRENCY)()
            overflow = max(0, getattr(pool, "_max_overflow", 0))
            self._store_limiter = anyio.CapacityLimiter(max(1, size + overflow))
        return await anyio.to_thread.run_sync(function, *args, limiter=self._store_limiter)

    @contextmanager
    def store_errors(self) -> Iterator[None]:
        """Turn the database's own failures into StoreUnavailable (a 503)."""
        try:
            yield
        # psycopg's own errors too: a raw pooled connection can raise them unwrapped.
        except (sa_exc.DBAPIError, sa_exc.TimeoutError, psycopg.Error) as error:
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
        source = await self.in_store_thread(self._load_source, provider, slug)
        # Only known sources are cached: random slugs must not grow the cache.
        if source is not None and self.settings.source_cache_seconds > 0:
            if len(self._sources) >= _MAX_CACHED_SOURCES:
                self._sources.clear()
            self._sources[key] = (now + self.settings.source_cache_seconds, source)
        return source

    def record(self, incoming: IncomingDelivery) -> Recorded:
        """Store the delivery once (``models.inbox.record_delivery``); blocking.

        On PostgreSQL the row is written with one autocommit statement on a
        pooled connection, without an ORM session: a new delivery is one round
        trip, and the ingress spends half the CPU per delivery it spent
        through a session (BEGIN, INSERT, COMMIT; docs/performance.md). Other
        databases go through ``record_delivery`` itself.
        """
        engine = self.sessions.kw["bind"]
        if engine.dialect.name != "postgresql":
            with self.store_errors(), session_scope(self.sessions) as session:
                return record_delivery(session=session, incoming=incoming)
        with self.store_errors():
            pooled = engine.raw_connection()
        connection = pooled.driver_connection
        try:
            connection.autocommit = True
            return _record_on(connection, incoming)
        except psycopg.Error as error:
            if isinstance(error, psycopg.OperationalError) or connection.closed:
                pooled.invalidate(error)  # never hand a broken connection back out
            raise StoreUnavailable(error.__class__.__name__) from error
        finally:
            if not connection.closed:
                connection.autocommit = False  # the pool's other users expect transactions
            pooled.close()

    def _load_source(self, provider: str, slug: str) -> VerifyingSource | None:
        with self.store_errors(), session_scope(self.sessions) as session:
            return verifying_source(session=session, provider=provider, slug=slug)


def _record_on(connection: psycopg.Connection, incoming: IncomingDelivery) -> Recorded:
    digest = hashlib.sha256(incoming.body).hexdigest()
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_DELIVERY, _delivery_row(incoming, digest))
        inserted = cursor.fetchone()
        if inserted is not None:
            return Recorded(pk=inserted[0], is_new=True, status=incoming.status)
        # A duplicate: the stored row answers (its own status, and whether
        # this body differs from the one stored).
        cursor.execute(_STORED_DELIVERY, (incoming.source_id, incoming.delivery_id))
        pk, stored_digest, status = cursor.fetchone()
        mismatch = stored_digest != digest
        if mismatch:
            cursor.execute(_COUNT_MISMATCH, (pk,))
        return Recorded(
            pk=pk, is_new=False, status=DeliveryStatus(status), payload_mismatch=mismatch
        )


class AsyncInbox:
    """The ingress's inbox writes on PostgreSQL, on the event loop.

    A few psycopg ``AsyncConnection``s in autocommit mode, each used by one
    request at a time: a new delivery is one INSERT that commits itself, with
    no thread hop, no ORM session and no pool ping. Measured side by side,
    the threaded path (a worker thread per write, handing the GIL back and
    forth with the event loop) answered at about half the rate of a bare
    asyncpg receiver and with 4x its median latency at low load
    (docs/performance.md). Writes the same row as ``record_delivery``.
    """

    def __init__(self, conninfo: str, *, size: int = 10, connect_timeout: float = 5.0) -> None:
        self._conninfo, self._size, self._timeout = conninfo, size, connect_timeout
        self._idle: list[psycopg.AsyncConnection] = []
        self._open = 0
        self._slots = asyncio.Semaphore(size)
        self._closed = False

    async def _take(self) -> psycopg.AsyncConnection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
            self._open -= 1
        self._open += 1
        try:
            return await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True, connect_timeout=self._timeout
            )
        except BaseException:
            self._open -= 1
            raise

    async def record(self, incoming: IncomingDelivery) -> Recorded:
        if self._closed:
            raise StoreUnavailable("the inbox is closed")
        async with self._slots:
            try:
                connection = await self._take()
            except psycopg.Error as error:
                raise StoreUnavailable(error.__class__.__name__) from error
            healthy = False
            try:
                recorded = await _record_async(connection, incoming)
                healthy = True
                return recorded
            except psycopg.Error as error:
                raise StoreUnavailable(error.__class__.__name__) from error
            finally:
                if healthy and not connection.closed and not self._closed:
                    self._idle.append(connection)
                else:  # a failed connection is never handed out again
                    self._open -= 1
                    with contextlib.suppress(psycopg.Error):
                        await connection.close()

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            with contextlib.suppress(psycopg.Error):
                await self._idle.pop().close()


def _delivery_row(incoming: IncomingDelivery, digest: str) -> tuple:
    now = utcnow()
    return (
        incoming.source_id,
        incoming.delivery_id,
        incoming.hook_id,
        incoming.body,
        digest,
        incoming.content_type,
        incoming.event,
        incoming.action,
        Json(dict(incoming.headers)),
        now,
        now,
        incoming.status.value,
        incoming.status_reason,
    )


async def _record_async(
    connection: psycopg.AsyncConnection, incoming: IncomingDelivery
) -> Recorded:
    digest = hashlib.sha256(incoming.body).hexdigest()
    async with connection.cursor() as cursor:
        await cursor.execute(_INSERT_DELIVERY, _delivery_row(incoming, digest))
        inserted = await cursor.fetchone()
        if inserted is not None:
            return Recorded(pk=inserted[0], is_new=True, status=incoming.status)
        await cursor.execute(_STORED_DELIVERY, (incoming.source_id, incoming.delivery_id))
        pk, stored_digest, status = await cursor.fetchone()
        mismatch = stored_digest != digest
        if mismatch:
            await cursor.execute(_COUNT_MISMATCH, (pk,))
        return Recorded(
            pk=pk, is_new=False, status=DeliveryStatus(status), payload_mismatch=mismatch
        )


def postgres_conninfo(runtime: Runtime) -> str | None:
    """libpq's connection string for the runtime's database, if it is PostgreSQL."""
    url = runtime.sessions.kw["bind"].url
    if url.get_backend_name() != "postgresql":
        return None
    return url.set(drivername="postgresql").render_as_string(hide_password=False)
