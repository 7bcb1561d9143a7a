"""What the ingress holds while it runs: settings, sessions, the relay, metrics,
and a short-lived cache of webhook sources."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import anyio
import psycopg
from psycopg.types.json import Json
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker

from ingest.group_commit import GroupCommitInbox
from ingest.limits import StreamSlots
from ingest.metrics import IngressMetrics
from ingest.refusals import Refusals
from ingest.relay import Relay
from models.broker.lanes import FloodGate
from models.db import driver_options, libpq_conninfo, session_scope
from models.inbox import (
    InboxStep,
    IncomingDelivery,
    Recorded,
    next_step,
    postgresql_inbox_sql,
    record_delivery,
    recording_steps,
)
from models.settings import Settings
from models.sources import VerifyingSource, verifying_source

if TYPE_CHECKING:
    from ingest.notifications import EventListener

_MAX_CACHED_SOURCES = 1000
#: Names no enabled source answers to, remembered at once; past this many the
#: least lately asked for goes first.
_MAX_UNKNOWN_SOURCES = 1000
#: Deliveries this process stored lately, kept to answer their redeliveries.
_RECENT_DELIVERIES = 10_000
#: Store calls at once when the pool does not say its size (SQLite's pool, say).
_DEFAULT_STORE_CONCURRENCY = 5

T = TypeVar("T")


class StoreUnavailable(Exception):
    """The database could not be reached or answered with an error of its own."""


@dataclass
class IngressRuntime:
    settings: Settings
    sessions: sessionmaker[Session]
    relay: Relay
    metrics: IngressMetrics
    #: The event streams open on this process (``ingest.limits``).
    streams: StreamSlots
    _sources: dict[tuple[str, str], tuple[float, VerifyingSource]] = field(default_factory=dict)
    #: (provider, the name's sha256) -> until when the name is known to be no
    #: enabled source's; least lately asked for first. A digest, not the name:
    #: a name is as long as a request's head allows.
    _unknown: OrderedDict[tuple[str, bytes], float] = field(default_factory=OrderedDict, repr=False)
    #: Each source's share of the live lane (``models.broker.lanes``); built
    #: from the settings after the fields above.
    flood_gate: FloodGate = field(init=False, repr=False)
    _store_limiter: anyio.CapacityLimiter | None = field(default=None, repr=False)
    #: (source id, delivery id) -> fingerprint of the request (the body's
    #: sha256 and the event header), for the last deliveries this process
    #: stored (committed); oldest first.
    _recent: OrderedDict[tuple[int, str], str] = field(default_factory=OrderedDict, repr=False)
    #: When deliveries were answered 503 for want of a store (``ingest.refusals``).
    refusals: Refusals = field(default_factory=Refusals, repr=False)

    def __post_init__(self) -> None:
        self.flood_gate = FloodGate(
            rate=self.settings.live_lane_rate, burst=self.settings.live_lane_burst
        )

    def stored_lately(self, source_id: int, delivery_id: str, fingerprint: str) -> bool:
        """True when this process stored this delivery, from this very request
        (``fingerprint``), among its last ``_RECENT_DELIVERIES``.

        Such a redelivery is a duplicate whatever the database would say:
        the row was committed before it was remembered, so the delivery was
        taken, even should the retention policy have deleted its row since
        (months after it finished: ``models.retention``). A body that
        differs is not answered from here, so the database counts the
        mismatch.
        """
        return self._recent.get((source_id, delivery_id)) == fingerprint

    def remember(self, source_id: int, delivery_id: str, fingerprint: str) -> None:
        """Note a delivery whose row is committed (see :meth:`stored_lately`)."""
        self._recent[(source_id, delivery_id)] = fingerprint
        if len(self._recent) > _RECENT_DELIVERIES:
            self._recent.popitem(last=False)

    #: The webhook path's inbox writer, opened and closed by the app's
    #: lifespan (:func:`inbox_opened`): on PostgreSQL on the event loop (see
    #: AsyncInbox), on SQLite a group of deliveries per commit
    #: (``ingest.group_commit``); None outside the lifespan.
    inbox: AsyncInbox | GroupCommitInbox | None = field(default=None, repr=False)
    #: PostgreSQL: the listener that wakes the event streams
    #: (``ingest.notifications``), for the app's lifespan; None elsewhere.
    listener: EventListener | None = field(default=None, repr=False)

    async def record_delivery(self, incoming: IncomingDelivery) -> Recorded:
        """Store the delivery once, through the lifespan's inbox writer (on
        SQLite with the deliveries that arrive alongside, in one commit), else
        in a store thread through ``models.inbox.record_delivery``. Returns
        after the commit that stored it."""
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
        disabled source or a rotated secret takes effect within that time.

        So is the answer that there is no such source, in a cache of its own:
        a name nobody registered, posted to again and again, costs one query
        per ``source_cache_seconds``, not one per request; a source added or
        enabled under that name is taken within that time."""
        key = (provider, slug)
        now = time.monotonic()
        cached = self._sources.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        unknown = (provider, hashlib.sha256(slug.encode("utf-8", "surrogatepass")).digest())
        known_unknown_until = self._unknown.get(unknown)
        if known_unknown_until is not None and known_unknown_until > now:
            self._unknown.move_to_end(unknown)
            return None
        source = await self.in_store_thread(self._load_source, provider, slug)
        seconds = self.settings.source_cache_seconds
        if seconds <= 0:
            return source
        if source is None:
            # Bounded apart from the known sources: random names must not grow
            # either cache, nor push a known source out.
            self._unknown[unknown] = now + seconds
            self._unknown.move_to_end(unknown)
            while len(self._unknown) > _MAX_UNKNOWN_SOURCES:
                self._unknown.popitem(last=False)
            return source
        self._unknown.pop(unknown, None)
        if len(self._sources) >= _MAX_CACHED_SOURCES:
            self._sources.clear()
        self._sources[key] = (now + seconds, source)
        return source

    def record(self, incoming: IncomingDelivery) -> Recorded:
        """Store the delivery once (``models.inbox.record_delivery``) in a
        transaction of its own; blocking. On PostgreSQL the webhook path writes
        through :class:`AsyncInbox` instead; on SQLite it comes here for a
        delivery that arrived alone, or whose group failed (``ingest.group_commit``).

        On a bare connection, not an ORM session: the statements are Core, and
        the session's bookkeeping around them (its transaction states, its
        identity map, the close) cost about 0.1 ms of CPU per delivery, near a
        tenth of the ingress's on SQLite (docs/performance.md, §1). The same
        commit at the end, the same rollback on an error."""
        with self.store_errors(), self.sessions.kw["bind"].begin() as connection:
            return record_delivery(session=connection, incoming=incoming)

    def record_together(self, group: Sequence[IncomingDelivery]) -> list[Recorded]:
        """Store each delivery of ``group`` once, in order, all in one
        transaction; blocking. One commit stores them all, and a failure
        anywhere, the commit's too, rolls back every one of them: the caller
        then writes each alone with :meth:`record` (``ingest.group_commit``).
        A delivery id twice in ``group``: the second finds the first's row, a
        duplicate, as in two transactions one after the other."""
        with self.sessions.kw["bind"].begin() as connection:
            return [record_delivery(session=connection, incoming=incoming) for incoming in group]

    def _load_source(self, provider: str, slug: str) -> VerifyingSource | None:
        with self.store_errors(), session_scope(self.sessions) as session:
            return verifying_source(session=session, provider=provider, slug=slug)


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

    def __init__(
        self,
        conninfo: str,
        *,
        size: int = 10,
        connect_timeout: float = 5.0,
        options: Mapping[str, object] | None = None,
    ) -> None:
        self._conninfo, self._size, self._timeout = conninfo, size, connect_timeout
        #: psycopg's options for the settings (``models.db.driver_options``).
        self._options = dict(options or {})
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
                self._conninfo, autocommit=True, connect_timeout=self._timeout, **self._options
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


async def _record_async(
    connection: psycopg.AsyncConnection, incoming: IncomingDelivery
) -> Recorded:
    """``models.inbox.record_delivery`` on a psycopg connection in autocommit
    mode: the same statements (``postgresql_inbox_sql``), run in the order
    the same decision takes (``recording_steps``), so the same answers."""
    sql = postgresql_inbox_sql()
    steps = recording_steps(incoming)
    async with connection.cursor() as cursor:
        outcome = next_step(steps, None)
        while isinstance(outcome, InboxStep):
            await cursor.execute(sql.of(outcome.statement), _psycopg_parameters(outcome))
            outcome = next_step(steps, await cursor.fetchone() if outcome.reads_row else None)
        return outcome


def _psycopg_parameters(step: InboxStep) -> Mapping[str, object]:
    if "headers" not in step.parameters:
        return step.parameters
    # psycopg adapts a dict only when told it is JSON.
    return {**step.parameters, "headers": Json(step.parameters["headers"])}


def postgres_conninfo(runtime: IngressRuntime) -> str | None:
    """libpq's connection string for the runtime's database, if it is PostgreSQL."""
    url = runtime.sessions.kw["bind"].url
    if url.get_backend_name() != "postgresql":
        return None
    return libpq_conninfo(url)


@contextlib.asynccontextmanager
async def inbox_opened(runtime: IngressRuntime) -> AsyncIterator[None]:
    """The webhook path's inbox writer for the app's lifespan. On PostgreSQL
    the event loop's (its connections are closed at shutdown); on SQLite the
    group writer, whose last groups are written and answered at shutdown,
    before the lifespan disposes of the engine."""
    conninfo = postgres_conninfo(runtime)
    if conninfo is None:
        runtime.inbox = GroupCommitInbox(
            runtime, on_commit=runtime.metrics.deliveries_per_commit.observe
        )
    else:
        runtime.inbox = AsyncInbox(conninfo, options=driver_options(runtime.settings))
    try:
        yield
    finally:
        inbox, runtime.inbox = runtime.inbox, None
        await inbox.close()
