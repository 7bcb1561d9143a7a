"""A small asyncio TCP proxy, in front of Redis or PostgreSQL, to cut or delay connections.

The processes under test are pointed at the proxy's port instead of the
server's. The proxy runs its own event loop in a thread of the test process,
so a test drives it with plain calls:

- :meth:`TcpProxy.cut` aborts every open connection at once (both sides get a
  reset), as a network failure or a firewall timeout would;
- :meth:`TcpProxy.refuse` makes new connections fail until it is lifted (the
  server "is down" for whoever goes through the proxy);
- :meth:`TcpProxy.delay` holds every chunk of data that long, both ways.

It listens on 127.0.0.1 and a free port unless told otherwise: ``listen_host``
(an address of this machine, such as the host side of a veth link) and
``listen_port`` make it a forwarder another network namespace can reach
(tests/support/hosts.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future


class TcpProxy:
    def __init__(
        self,
        target_host: str,
        target_port: int,
        name: str = "proxy",
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self.target = (target_host, target_port)
        self.name = name
        self.listen_host = listen_host
        self.port = listen_port
        self.accepted = 0
        self.cut_connections = 0
        self._delay = 0.0
        self._refusing = False
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)

    # --- control, from the test's thread ---------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._listen()).result(timeout=10)
        return self

    def cut(self) -> int:
        """Abort every open connection; returns how many there were (client side)."""
        return self._call(self._cut()).result(timeout=10)

    def refuse(self, refusing: bool = True) -> None:
        self._refusing = refusing

    def delay(self, seconds: float) -> None:
        self._delay = seconds

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._close()).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def _call(self, coroutine) -> Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    # --- the loop's side ---------------------------------------------------------------------

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.listen_host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, client_reader, client_writer) -> None:
        self.accepted += 1
        if self._refusing:
            client_writer.transport.abort()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._open.update((client_writer, server_writer))
        try:
            await asyncio.gather(
                self._pipe(client_reader, server_writer),
                self._pipe(server_reader, client_writer),
            )
        finally:
            for writer in (client_writer, server_writer):
                self._open.discard(writer)
                writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self._delay:
                    await asyncio.sleep(self._delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            # One side ended: end the other, so neither waits on a dead peer.
            writer.transport.abort()

    async def _cut(self) -> int:
        writers = list(self._open)
        for writer in writers:
            writer.transport.abort()
        self._open.clear()
        self.cut_connections += len(writers) // 2
        return len(writers) // 2

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut()
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
