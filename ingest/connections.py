"""How many connections the ingress holds, kept below its limit of open files.

Every connection is a descriptor, and so is everything else the ingress
opens: the database pool, the broker's connections, log files, the event
loop's own. With the soft ``RLIMIT_NOFILE`` at 1,024, 1,100 connections that
begin a head and never finish it took every descriptor; the accept then
failed, and uvloop (like libuv everywhere) accepts and closes at once what
waits in the listen queue so as not to spin on it: 22 of 36 signed
deliveries were reset (issue 35).

So the ingress (``ingest/server.py``):

- raises its soft limit to the hard one as it starts
  (:func:`raise_open_files_limit`), and says so in one line;
- accepts at most :func:`connection_bound` connections at once, the soft
  limit less :data:`HEADROOM` descriptors for everything else, or
  ``TASKHOOK_MAX_CONNECTIONS``. The accept itself is gated
  (:class:`GatedListener`): past the bound a connection is not accepted,
  and waits in the kernel's listen queue, instead of taking a descriptor;
- at the bound, makes room by closing, with a 503 and ``Retry-After``, the
  connection that has waited longest for a head (one that sent nothing, a
  slow head, a keep-alive connection between requests; never one whose
  request is being read or answered), as nginx reuses its idle connections.
  A sender that sends its request at once is then served, whatever number
  of slow ones hold connections; one connection is made room for at a time.

uvicorn's own ``limit_concurrency`` does not do this: it counts at the
request, after the accept has taken a descriptor, and counts the slow
connections too, so it would answer every signed delivery 503 while they
stay (docs/deploy.md, "Open files").
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
from collections.abc import Callable
from typing import Protocol

logger = logging.getLogger("uvicorn.error")

#: Descriptors kept for what is not a connection: the database pools (the
#: store threads' and the inbox writer's), the event listener, the broker's
#: connections, log files, the event loop's own (its poller, its wake-up
#: pipe), the listening socket, and the files a library opens as it runs.
HEADROOM = 128

#: While the accept is paused (at the bound with nothing to close, or out
#: of descriptors all the same), it is tried again this often.
RETRY_SECONDS = 1.0

#: What ``accept`` fails with when the process or the system is out of
#: descriptors or memory: wait and try again, as asyncio does.
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def raise_open_files_limit() -> tuple[int, int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one, as far as the system
    lets; returns (soft before, soft now, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    targets = [hard] if hard != resource.RLIM_INFINITY else []
    # An unlimited hard limit: as far as Linux lets one process (fs.nr_open),
    # or macOS (OPEN_MAX).
    targets += [limit for limit in (_nr_open(), 10_240) if limit is not None]
    for target in targets:
        if soft != resource.RLIM_INFINITY and target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        return soft, target, hard
    return soft, soft, hard


def _nr_open() -> int | None:
    try:
        with open("/proc/sys/fs/nr_open") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return None


def connection_bound(soft_limit: int, setting: int | None) -> int:
    """How many connections the ingress holds at once: ``setting`` if given,
    else the soft limit less :data:`HEADROOM` (half of it, for a limit too
    small to keep that much)."""
    if setting is not None:
        return setting
    if soft_limit == resource.RLIM_INFINITY:
        soft_limit = _nr_open() or 1_048_576
    if soft_limit >= 2 * HEADROOM:
        return soft_limit - HEADROOM
    return max(1, soft_limit // 2)


def limits_line(soft_before: int, soft: int, hard: int, bound: int, setting: int | None) -> str:
    """The one line the ingress logs at start about its open files."""

    def said(limit: int) -> str:
        return "unlimited" if limit == resource.RLIM_INFINITY else f"{limit:,}"

    if soft != soft_before:
        raised = f"soft limit raised from {said(soft_before)} to {said(soft)}"
    else:
        raised = f"soft limit {said(soft)}, not raised"
    why = "TASKHOOK_MAX_CONNECTIONS" if setting is not None else f"the soft limit less {HEADROOM}"
    line = (
        f"Open files: {raised} (hard limit {said(hard)}); "
        f"at most {bound:,} connections at once ({why})."
    )
    if setting is not None and soft != resource.RLIM_INFINITY and setting > soft - HEADROOM:
        line += f" That leaves fewer than {HEADROOM} descriptors for the rest."
    return line


class Sheddable(Protocol):
    """A connection the gate may close to make room: the ingress's protocols."""

    def shed(self) -> bool:
        """Close the connection, with a 503, if it waits for a head; whether it did."""
        ...


class ConnectionGate:
    """The connections open, in the order they last began to wait for a head,
    and the bound on how many may be.

    A connection counts from its accept to its ``connection_lost``, so the
    count is the connections' descriptors, those being closed included.
    """

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.pending = 0  # accepted, not yet made
        self._open: dict[Sheddable, None] = {}
        self._shedding = 0  # closed by the gate, not yet lost
        self._listeners: list[GatedListener] = []

    @property
    def count(self) -> int:
        return self.pending + len(self._open)

    def full(self) -> bool:
        return self.count >= self.bound

    def made(self, connection: Sheddable) -> None:
        self.pending -= 1
        self._open[connection] = None

    def waiting(self, connection: Sheddable) -> None:
        """``connection`` has finished a request and now waits for the next head."""
        if connection in self._open:
            del self._open[connection]
            self._open[connection] = None

    def lost(self, connection: Sheddable, *, shed: bool) -> None:
        if connection not in self._open:
            return
        del self._open[connection]
        if shed:
            self._shedding -= 1
        for listener in self._listeners:
            listener.resume()

    def make_room(self) -> bool:
        """Close the connection that has waited longest for a head, unless one
        closed for room is still closing; whether one is closing now."""
        if self._shedding:
            return True
        for connection in self._open:
            if connection.shed():
                self._shedding += 1
                return True
        return False


class GatedListener:
    """A listening socket accepted from while its gate has room: what uvicorn
    keeps in ``Server.servers`` (``close``, ``wait_closed``), in place of the
    event loop's server, which accepts whatever comes."""

    def __init__(
        self,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        gate: ConnectionGate,
        watch: Callable[[asyncio.Protocol, ConnectionGate], None],
    ) -> None:
        self.sock, self.protocol_factory, self.gate, self.watch = (
            sock,
            protocol_factory,
            gate,
            watch,
        )
        self.sockets = [sock]
        self.loop = asyncio.get_running_loop()
        self._reading = False
        self._closed = False
        self._retry: asyncio.TimerHandle | None = None
        self._making: set[asyncio.Task[None]] = set()
        sock.setblocking(False)
        gate._listeners.append(self)

    def start(self) -> None:
        self.resume()

    def resume(self) -> None:
        if self._closed or self._reading:
            return
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self.loop.add_reader(self.sock.fileno(), self._accept)
        self._reading = True

    def _pause(self) -> None:
        if self._reading:
            self.loop.remove_reader(self.sock.fileno())
            self._reading = False
        if self._retry is None and not self._closed:
            self._retry = self.loop.call_later(RETRY_SECONDS, self._retried)

    def _retried(self) -> None:
        self._retry = None
        self.resume()

    def _accept(self) -> None:
        for _ in range(64):  # then let the connections just made run
            if self.gate.full():
                # Past the bound the connection waits in the listen queue;
                # the room made is taken when the closed connection is lost.
                self.gate.make_room()
                self._pause()
                return
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno not in OUT_OF_RESOURCES:
                    raise
                logger.error(
                    "Could not accept a connection (%s) with %d open: trying again in %s s.",
                    error.strerror,
                    self.gate.count,
                    RETRY_SECONDS,
                )
                self._pause()
                return
            self.gate.pending += 1
            task = self.loop.create_task(self._make(conn))
            self._making.add(task)
            task.add_done_callback(self._making.discard)

    async def _make(self, conn: socket.socket) -> None:
        protocol = self.protocol_factory()
        self.watch(protocol, self.gate)
        conn.setblocking(False)
        try:
            await self.loop.connect_accepted_socket(lambda: protocol, conn)
        except BaseException:
            if protocol not in self.gate._open:  # never made, so never lost
                self.gate.pending -= 1
                conn.close()
                self.resume()
            raise

    def close(self) -> None:
        self._closed = True
        if self._reading:
            self.loop.remove_reader(self.sock.fileno())
            self._reading = False
        if self._retry is not None:
            self._retry.cancel()
        self.sock.close()

    async def wait_closed(self) -> None:
        if self._making:
            await asyncio.gather(*self._making, return_exceptions=True)
