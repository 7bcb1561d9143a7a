"""One PostgreSQL listener per ingress process, waking its open event streams.

A committed event append notifies ``models.events.EVENTS_CHANNEL`` with its
workspace id. The :class:`EventListener` holds one dedicated connection that
LISTENs on that channel, and keeps one :class:`WorkspaceFeed` per workspace
that some stream of this process follows. A notification makes the feed read
the workspace's new events once -- one query, however many streams follow
it -- keep the latest of them in memory, and wake every stream waiting on
it; a stream that is caught up takes its events from there.

Notifications are a hint, never the record. When the listener's connection is
down (it reconnects with backoff) the streams fall back to polling the
database themselves; when it comes back, and every ``recheck_seconds``
besides in case a notification was lost, each feed reads again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Iterator

import psycopg

from models.events import EVENTS_CHANNEL

log = logging.getLogger(__name__)

#: ``read(workspace_id, after, limit)``: event bodies (dicts with their
#: position as ``"id"``) after ``after``, oldest first.
ReadEvents = Callable[[int, int, int], Awaitable[list[dict]]]
#: ``last_position(workspace_id)``: the workspace's last event position so far.
LastPosition = Callable[[int], Awaitable[int]]

#: The listener's connection in pg_stat_activity.
LISTENER_APPLICATION_NAME = "taskhook-event-listener"
#: Between tries to reconnect: the first wait, doubled up to the last.
FIRST_RETRY_SECONDS = 0.1
LAST_RETRY_SECONDS = 5.0


class WorkspaceFeed:
    """The events of one workspace this process's streams follow: the latest
    ones in memory, and a signal that fires whenever that changes."""

    def __init__(self, workspace_id: int, *, keep: int) -> None:
        self.workspace_id = workspace_id
        self.keep = keep
        #: The last position read, None until the first read; events in
        #: (``covered_from``, ``head``] are all in ``_events``.
        self.head: int | None = None
        self.covered_from = 0
        self._positions: list[int] = []
        self._events: list[dict] = []
        self._changed = asyncio.Event()
        #: Streams parked until the next change: one future each, woken
        #: together -- cheaper per stream than an Event with a timeout each.
        self._waiters: list[asyncio.Future] = []
        #: Counts changes, so a stream can tell one happened while it read.
        self.version = 0
        self.followers = 0
        self.refreshing: asyncio.Task | None = None
        self.again = False
        #: False while the listener is down: then nothing wakes the feed.
        self.live = False

    @property
    def learning(self) -> bool:
        """Its first read is under way: a stream that waits for it may need no
        read of its own (a thousand streams opening at once make one read)."""
        return self.live and self.head is None and self.refreshing is not None

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next change. Take it *before* looking at the feed, so a
        change in between is not missed."""
        return self._changed

    def waiter(self) -> asyncio.Future:
        """A future done at the next change (or cancelled by its waiter).
        Take it with no await between looking at the feed and waiting on it,
        or compare :attr:`version` first."""
        if len(self._waiters) > 2 * self.followers + 8:  # woken early by their own timers
            self._waiters = [waiter for waiter in self._waiters if not waiter.done()]
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def after(self, cursor: int, limit: int) -> list[dict] | None:
        """Up to ``limit`` events after ``cursor`` from memory; [] when the feed
        knows of none; None when it cannot say (the caller reads the database)."""
        if not self.live or self.head is None or cursor < self.covered_from:
            return None
        if cursor >= self.head:
            return []
        start = bisect_right(self._positions, cursor)
        return self._events[start : start + limit]

    def start_at(self, position: int) -> None:
        """Known from here on: the feed holds nothing before ``position``."""
        self.head = self.covered_from = position

    def add(self, events: list[dict]) -> None:
        """Events read after :attr:`head`, oldest first."""
        for event in events:
            self._positions.append(event["id"])
            self._events.append(event)
            self.head = event["id"]
        if len(self._events) > 2 * self.keep:  # trimmed now and then, not per event
            dropped = len(self._events) - self.keep
            self.covered_from = self._positions[dropped - 1]
            del self._positions[:dropped], self._events[:dropped]

    def signal(self) -> None:
        """Wake whoever waits on :attr:`changed`, and arm a fresh one."""
        self.version += 1
        fired, self._changed = self._changed, asyncio.Event()
        fired.set()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class EventListener:
    """LISTEN on the events channel and fan out to the workspaces' feeds.

    ``read`` and ``last_position`` reach the database through the ingress's
    usual sessions; the listener's own connection only listens."""

    def __init__(
        self,
        conninfo: str,
        *,
        read: ReadEvents,
        last_position: LastPosition,
        keep: int = 500,
        recheck_seconds: float = 20.0,
        first_retry_seconds: float | None = None,
        last_retry_seconds: float | None = None,
        connect_timeout: float = 5.0,
    ) -> None:
        self._conninfo = conninfo
        self._read, self._last_position = read, last_position
        self._keep, self._recheck = keep, recheck_seconds
        self._first_retry = first_retry_seconds or FIRST_RETRY_SECONDS
        self._last_retry = max(last_retry_seconds or LAST_RETRY_SECONDS, self._first_retry)
        self._connect_timeout = connect_timeout
        self._feeds: dict[int, WorkspaceFeed] = {}
        self._task: asyncio.Task | None = None
        self._connection: psycopg.AsyncConnection | None = None
        #: True while the connection listens; streams poll when it is not.
        self.listening = False
        #: Times the connection was (re)established: tests and metrics read it.
        self.connects = 0
        self._up = asyncio.Event()

    # --- for the streams --------------------------------------------------------------

    @contextlib.contextmanager
    def follow(self, workspace_id: int) -> Iterator[WorkspaceFeed]:
        """The workspace's feed while the caller streams it."""
        feed = self._feeds.get(workspace_id)
        if feed is None:
            feed = self._feeds[workspace_id] = WorkspaceFeed(workspace_id, keep=self._keep)
            feed.live = self.listening
            if feed.live:
                self._refresh(feed)  # learn where the workspace's stream is now
        feed.followers += 1
        try:
            yield feed
        finally:
            feed.followers -= 1
            if not feed.followers and self._feeds.get(workspace_id) is feed:
                del self._feeds[workspace_id]

    def feed(self, workspace_id: int) -> WorkspaceFeed | None:
        """The workspace's feed, while some stream follows it."""
        return self._feeds.get(workspace_id)

    # --- the connection ---------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="taskhook-event-listener")

    async def wait_listening(self, timeout: float) -> None:
        """Until the connection listens (tests, and the app's startup)."""
        async with asyncio.timeout(timeout):
            await self._up.wait()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for feed in list(self._feeds.values()):
            if feed.refreshing is not None:
                feed.refreshing.cancel()

    async def _run(self) -> None:
        delay = self._first_retry
        while True:
            connects = self.connects
            try:
                await self._listen()
            except (psycopg.Error, OSError) as error:
                log.warning("event listener lost its connection (%s); streams poll", error)
            finally:
                self._went_down()
            if self.connects != connects:  # it did listen: retry soon, then back off
                delay = self._first_retry
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._last_retry)

    async def _listen(self) -> None:
        async with await psycopg.AsyncConnection.connect(
            self._conninfo,
            autocommit=True,
            connect_timeout=self._connect_timeout,
            application_name=LISTENER_APPLICATION_NAME,
        ) as connection:
            self._connection = connection
            await connection.execute(f"LISTEN {EVENTS_CHANNEL}")
            self.listening = True
            self.connects += 1
            self._up.set()
            # Whatever committed while nobody listened: every feed reads again.
            for feed in list(self._feeds.values()):
                feed.live = True
                self._refresh(feed)
            while True:
                async for notification in connection.notifies(timeout=self._recheck):
                    self._notified(notification.payload)
                # Quiet for a while: make sure the connection still answers,
                # and read again in case a notification went missing.
                await connection.execute("SELECT 1")
                for feed in list(self._feeds.values()):
                    self._refresh(feed)

    def _went_down(self) -> None:
        self._connection = None
        self._up.clear()
        if not self.listening:
            return
        self.listening = False
        for feed in self._feeds.values():
            feed.live = False
            feed.signal()  # waiting streams switch to polling now

    def _notified(self, payload: str) -> None:
        try:
            workspace_id = int(payload)
        except ValueError:
            log.warning("ignored a notification on %s: %r", EVENTS_CHANNEL, payload)
            return
        feed = self._feeds.get(workspace_id)
        if feed is not None:
            self._refresh(feed)

    # --- the feeds --------------------------------------------------------------------

    def _refresh(self, feed: WorkspaceFeed) -> None:
        """Read the feed's new events soon; once at a time, again if asked meanwhile."""
        if feed.refreshing is not None:
            feed.again = True
            return
        feed.refreshing = asyncio.create_task(self._read_new(feed))

    async def _read_new(self, feed: WorkspaceFeed) -> None:
        # Streams are woken only for news: a notification that came during a
        # read, whose events that read already got, wakes none of them again.
        news = False
        try:
            while True:
                feed.again = False
                if feed.head is None:
                    # Nothing to read yet: whatever commits from now on notifies.
                    feed.start_at(await self._last_position(feed.workspace_id))
                    news = True
                    if not feed.again:
                        break
                    continue
                while True:
                    events = await self._read(feed.workspace_id, feed.head, self._keep)
                    feed.add(events)
                    news = news or bool(events)
                    if len(events) < self._keep:
                        break
                if not feed.again:
                    break
                if news:
                    feed.signal()
                    news = False
        except Exception:  # the streams read for themselves meanwhile
            log.exception("event feed of workspace %s could not read", feed.workspace_id)
            feed.head = None
            news = True
        finally:
            feed.refreshing = None
            if news:
                feed.signal()
