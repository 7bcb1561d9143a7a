"""The ingress's inbox writes on SQLite, a group of deliveries per commit.

SQLite has one write lock for the whole file, and under ``synchronous=FULL``
every commit holds it through an fdatasync (docs/performance.md, section 6).
With one commit per delivery, the posts in flight queued on that lock one
fdatasync at a time. Here the deliveries that arrive while a commit runs are
stored together in the next transaction, and each is answered after that one
commit, as it was after its own.

No linger: a delivery that finds no group being written starts one at once,
alone, so an idle ingress answers as soon as before. Only a delivery that
arrives while a group is being written waits, for that group's commit -- as
it would have waited for SQLite's lock -- and goes with the next group.

Nothing is answered before the commit that stores it. A group whose
transaction fails anywhere (a statement or the commit itself) is rolled back
whole, and each of its deliveries is then written alone, in a transaction of
its own, as without groups: one delivery's error is its own answer (a 503),
never its neighbours'. No SAVEPOINTs: Python's sqlite3 opens and ends
transactions behind SQLAlchemy's back, so nested ones are not reliable there.

On PostgreSQL the ingress writes through ``ingest.runtime.AsyncInbox``
instead: the server groups the WAL flushes of concurrent commits itself.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from models.inbox import IncomingDelivery, Recorded

#: The most deliveries one transaction stores. A group holds SQLite's write
#: lock from its first INSERT to its commit, and the worker's claims and
#: settlements wait behind it: 64 inserts are a few milliseconds, about one
#: more fdatasync. It also bounds how many deliveries one failed group sends
#: back to be written one by one.
MAX_GROUP = 64

T = TypeVar("T")


class GroupWriter(Protocol):
    """What the groups are written with (``ingest.runtime.IngressRuntime``)."""

    def record(self, incoming: IncomingDelivery) -> Recorded:
        """Store one delivery in a transaction of its own; blocking."""
        ...

    def record_together(self, group: Sequence[IncomingDelivery]) -> list[Recorded]:
        """Store every delivery of ``group``, in order, in one transaction; blocking."""
        ...

    async def in_store_thread(self, function: Callable[..., T], *args: object) -> T: ...


@dataclass(frozen=True)
class _Waiting:
    incoming: IncomingDelivery
    answer: asyncio.Future[Recorded]


class GroupCommitInbox:
    """Stores deliveries a group per commit, on the event loop's side: no
    thread of its own, each group written in one store thread."""

    def __init__(
        self,
        writer: GroupWriter,
        *,
        max_group: int = MAX_GROUP,
        on_commit: Callable[[int], object] = lambda deliveries: None,
    ) -> None:
        self._writer = writer
        self._max_group = max_group
        #: Called with the number of deliveries each successful commit stored.
        self._on_commit = on_commit
        self._waiting: deque[_Waiting] = deque()
        #: The task writing groups while there are deliveries waiting; None when idle.
        self._writing: asyncio.Task[None] | None = None

    async def record(self, incoming: IncomingDelivery) -> Recorded:
        """Store the delivery once (``models.inbox.record_delivery``); returns
        after the commit that stored it, or raises the error of its own
        transaction when it had to be written alone and failed."""
        answer: asyncio.Future[Recorded] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(incoming, answer))
        if self._writing is None:
            self._writing = asyncio.create_task(self._write_groups())
        return await answer

    @property
    def waiting(self) -> int:
        """How many deliveries wait for the group being written to end."""
        return len(self._waiting)

    async def close(self) -> None:
        """Wait until every delivery handed to :meth:`record` is written and
        answered (the app's lifespan, before the engine is disposed)."""
        while self._writing is not None:
            await asyncio.shield(self._writing)

    async def _write_groups(self) -> None:
        try:
            while self._waiting:
                group = self._next_group()
                if group:
                    await self._write(group)
        finally:
            self._writing = None

    def _next_group(self) -> list[_Waiting]:
        group: list[_Waiting] = []
        while self._waiting and len(group) < self._max_group:
            waiting = self._waiting.popleft()
            # A request cancelled before its group began: nobody would be
            # answered, so nothing is stored.
            if not waiting.answer.done():
                group.append(waiting)
        return group

    async def _write(self, group: list[_Waiting]) -> None:
        try:
            if len(group) == 1:
                outcomes = [await self._alone(group[0].incoming)]
            else:
                outcomes = await self._together(group)
            for waiting, outcome in zip(group, outcomes, strict=True):
                if waiting.answer.done():  # its request was cancelled meanwhile
                    continue
                if isinstance(outcome, BaseException):
                    waiting.answer.set_exception(outcome)
                else:
                    waiting.answer.set_result(outcome)
        finally:
            # A no-op for the answered; for the rest only when this task was
            # cancelled (the loop shutting down): nobody waits for ever.
            for waiting in group:
                waiting.answer.cancel()

    async def _together(self, group: list[_Waiting]) -> list[Recorded | Exception]:
        try:
            recorded = await self._writer.in_store_thread(
                self._writer.record_together, [waiting.incoming for waiting in group]
            )
        except Exception:
            # Rolled back whole and nobody answered yet: each delivery again,
            # alone, gets its own result or its own error. At once, as each
            # would have been written without groups.
            return list(await asyncio.gather(*(self._alone(w.incoming) for w in group)))
        self._on_commit(len(group))
        return recorded

    async def _alone(self, incoming: IncomingDelivery) -> Recorded | Exception:
        try:
            recorded = await self._writer.in_store_thread(self._writer.record, incoming)
        except Exception as error:
            return error
        self._on_commit(1)
        return recorded
