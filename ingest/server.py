"""The ingress server: uvicorn, with every request's head and arrival bounded.

``python -m ingest.server`` starts the ingress (the Procfile's ``web``, the
tests, the benchmarks): uvicorn serving ``ingest.app:app`` with one of the two
protocols below in place of uvicorn's own. uvicorn bounds neither how large a
request's head may be nor how long a sender may take to send a request, and
both are cheap to abuse (docs/reliability.md, "Hostile input: header size and
slow senders"):

- **head size**: httptools joins a header's pieces as they arrive, at a cost
  that grows faster than the header. One 96 MiB header held the event loop
  for 14 s of CPU, and every other request on it waited. Here a head (request
  line and headers) longer than ``TASKHOOK_MAX_HEADER_BYTES`` is answered 431
  and the connection closed before the app runs; the parser never sees more
  than the cap, so refusing costs the same whatever the sender sends.
- **slow senders**: a sender trickling a byte a second held a connection for
  as long as it liked. Here a request's head must arrive within
  ``TASKHOOK_HEADER_READ_TIMEOUT_SECONDS`` and the whole request, body
  included, within ``TASKHOOK_BODY_READ_TIMEOUT_SECONDS`` (both counted from
  the request's first byte, or from the connection for its first request);
  then it is answered 408, unless an answer has begun, and closed. Once the
  request has arrived, the app takes as long as it takes.

It also keeps its connections below its limit of open files
(``ingest.connections``): it raises the soft limit to the hard one as it starts,
accepts no more connections than that less a headroom, and at that bound
closes the connection that has waited longest for a head to make room
(docs/deploy.md, "Open files").

Before it serves, it checks the settings and connects once to the database
and the broker: a mistake there is one line on stderr and exit code 1
(``models.startup``), not a traceback or a server that starts and is never
ready.

``--http`` picks the parser as uvicorn's own option does: ``auto`` is
httptools (a dependency: the benchmarks measure the ingress with it), ``h11``
the pure-Python one, bounded the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11
import uvicorn
from uvicorn.config import LOG_LEVELS, LOOP_FACTORIES, Config
from uvicorn.main import STARTUP_FAILURE
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from ingest.connections import (
    ConnectionGate,
    GatedListener,
    connection_bound,
    limits_line,
    raise_open_files_limit,
)
from models import logs, startup
from models.settings import Settings, get_settings


@dataclass(frozen=True)
class RequestLimits:
    """How large a request's head may be, and how long a request may take to arrive."""

    max_header_bytes: int
    header_read_timeout: float
    body_read_timeout: float

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestLimits:
        return cls(
            max_header_bytes=settings.max_header_bytes,
            header_read_timeout=settings.header_read_timeout_seconds,
            body_read_timeout=settings.body_read_timeout_seconds,
        )


class _BoundedRequests:
    """What both protocols add to uvicorn's: the head count and the two clocks.

    Mixed in before uvicorn's protocol class, whose attributes it uses
    (``loop``, ``transport``, ``cycle``, ``server_state``, ``logger``). The
    protocol tells it when a request's head has been parsed
    (:meth:`_headers_arrived`) and when the whole request has
    (:meth:`_request_arrived`).

    Pipelined requests (sent before the previous answer; no webhook sender
    does it) are bounded too, if less tightly: a head that begins in the same
    read as the end of the request before it is counted from the next read
    on, so it may exceed the cap by one read (at most 256 KiB in asyncio and
    uvloop).
    """

    def _bound(self, limits: RequestLimits | None) -> None:
        self.limits = limits or RequestLimits.from_settings(get_settings())
        self._timeouts = {
            "head": self.limits.header_read_timeout,
            "request": self.limits.body_read_timeout,
        }
        self._clocks: dict[str, asyncio.TimerHandle] = {}
        self._reading_head = True
        self._head_bytes = 0
        self._heads_parsed = 0
        self._gate: ConnectionGate | None = None
        self._shed = False

    def watched_by(self, gate: ConnectionGate) -> None:
        """Count this connection in ``gate``, which may close it for room (:meth:`shed`)."""
        self._gate = gate

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        if self._gate is not None:
            self._gate.made(self)
        self._request_began()  # a connection that never sends is a slow sender too

    def connection_lost(self, exc: Exception | None) -> None:
        for clock in self._clocks.values():
            clock.cancel()
        self._clocks.clear()
        if self._gate is not None:
            self._gate.lost(self, shed=self._shed)
        super().connection_lost(exc)

    def shed(self) -> bool:
        """Close this connection with a 503 if it waits for a head (none sent,
        one arriving, or the next one after an answer), to make room for a new
        one at the connection bound; whether it did. A request being read or
        answered is left alone."""
        answering = self.cycle is not None and not self.cycle.response_complete
        if self.transport.is_closing() or not self._reading_head or answering:
            return False
        self._shed = True
        self.logger.warning(
            "At the bound of %d connections: the one waiting longest for a head "
            "answered 503, closed.",
            self._gate.bound if self._gate is not None else 0,
        )
        self._refuse(HTTPStatus.SERVICE_UNAVAILABLE)
        return True

    def data_received(self, data: bytes) -> None:
        while data and not self.transport.is_closing():
            if not self._reading_head:
                super().data_received(data)
                return
            self._request_began()
            # Never hand the parser more of a head than the cap allows: if the
            # head ends within it, what follows is body, fed on the next turn.
            room = self.limits.max_header_bytes - self._head_bytes
            heads_before = self._heads_parsed
            if room > 0:
                piece = data if len(data) <= room else data[:room]
                self._head_bytes += len(piece)
                super().data_received(piece)
            if len(data) <= room:
                return
            if self._heads_parsed == heads_before:
                self.logger.warning(
                    "A request head over %d bytes: answered 431, closed.",
                    self.limits.max_header_bytes,
                )
                self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
                return
            data = data[room:]

    def _request_began(self) -> None:
        """Start the clocks of the request now arriving, unless they run already."""
        for which, seconds in self._timeouts.items():
            if which not in self._clocks:
                self._clocks[which] = self.loop.call_later(seconds, self._too_slow, which)

    def _headers_arrived(self) -> None:
        # Starts the request's clock when this head came in the same read as
        # the end of the request before it (pipelining); otherwise a no-op.
        self._request_began()
        self._stop_clock("head")
        self._reading_head = False
        self._heads_parsed += 1

    def _request_arrived(self) -> None:
        self._stop_clock("head")
        self._stop_clock("request")
        self._reading_head, self._head_bytes = True, 0  # what follows is the next request
        if self._gate is not None:
            self._gate.waiting(self)

    def _stop_clock(self, which: str) -> None:
        clock = self._clocks.pop(which, None)
        if clock is not None:
            clock.cancel()

    def _too_slow(self, which: str) -> None:
        del self._clocks[which]
        self.logger.warning(
            "%s did not arrive within %s s: closed.",
            "A request's head" if which == "head" else "A whole request",
            self._timeouts[which],
        )
        self._refuse(HTTPStatus.REQUEST_TIMEOUT)

    def _refuse(self, status: HTTPStatus) -> None:
        """Answer ``status`` if the request has no answer yet, and close the connection."""
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._reading_head:
            # ``cycle`` is the previous request's: while its answer is still
            # being made, another answer would be read as its.
            answer = cycle is None or cycle.response_complete
        else:
            answer = not cycle.response_started and not self._queued()
            if answer:
                # The app is still reading this request: it now sees the client
                # gone, and whatever it would answer goes nowhere.
                cycle.disconnected = True
                cycle.message_event.set()
        if answer:
            headers = self.server_state.default_headers
            if status == HTTPStatus.SERVICE_UNAVAILABLE:
                headers = [*headers, (b"retry-after", b"1")]
            self.transport.write(_plain_answer(status, headers))
        self.transport.close()

    def _queued(self) -> bool:
        """Whether this request waits for an earlier one's answer (pipelining)."""
        return False


def _plain_answer(status: HTTPStatus, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    body = f"{status.phrase}.".encode("ascii")
    lines = [f"HTTP/1.1 {status.value} {status.phrase}".encode("ascii")]
    lines += [name + b": " + value for name, value in default_headers]
    lines += [
        b"content-type: text/plain; charset=utf-8",
        b"content-length: " + str(len(body)).encode("ascii"),
        b"connection: close",
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class BoundedHttpToolsProtocol(_BoundedRequests, HttpToolsProtocol):
    """uvicorn's httptools protocol, with the head and the arrival bounded."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: RequestLimits | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._bound(limits)

    def _queued(self) -> bool:
        return bool(self.pipeline)  # uvicorn queues a pipelined request's cycle here

    # httptools' parser callbacks, during ``data_received``.
    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._headers_arrived()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._request_arrived()


class _ObservedConnection(h11.Connection):
    """h11's connection, telling the protocol when a request's head, and then
    its end, have been parsed (h11 has no callbacks: events are pulled)."""

    def __init__(self, protocol: BoundedH11Protocol, max_incomplete_event_size: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_incomplete_event_size)
        self._protocol = protocol

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, h11.Request):
            self._protocol._headers_arrived()
        elif isinstance(event, h11.EndOfMessage):
            self._protocol._request_arrived()
        return event


class BoundedH11Protocol(_BoundedRequests, H11Protocol):
    """uvicorn's h11 protocol, with the head and the arrival bounded."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: RequestLimits | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._bound(limits)
        # h11's own bound on a buffered head (16 KiB by default) at the cap,
        # so that the count above is what refuses a head, with a 431.
        self.conn = _ObservedConnection(self, self.limits.max_header_bytes)


PROTOCOLS: dict[str, type[asyncio.Protocol]] = {
    "auto": BoundedHttpToolsProtocol,
    "httptools": BoundedHttpToolsProtocol,
    "h11": BoundedH11Protocol,
}


def config_from(argv: list[str], settings: Settings) -> Config:
    """uvicorn's configuration for the command line ``argv``: the options of
    ``uvicorn`` that taskhook uses, with the same names."""
    parser = argparse.ArgumentParser(
        prog="python -m ingest.server", description="Serve the ingress with bounded requests."
    )
    parser.add_argument(
        "app",
        nargs="?",
        default="ingest.app:app",
        help="the ASGI app, as module:attribute (default: %(default)s)",
    )
    parser.add_argument("--factory", action="store_true", help="APP is a function that makes it")
    parser.add_argument("--host", default=settings.host, help="default: TASKHOOK_HOST")
    parser.add_argument("--port", type=int, default=settings.port, help="default: TASKHOOK_PORT")
    parser.add_argument("--http", choices=list(PROTOCOLS), default="auto")
    parser.add_argument("--loop", choices=list(LOOP_FACTORIES), default="auto")
    parser.add_argument("--log-level", choices=list(LOG_LEVELS), default="info")
    parser.add_argument("--no-access-log", dest="access_log", action="store_false")
    args = parser.parse_args(argv)
    # JSON lines (TASKHOOK_LOG_FORMAT=json) for uvicorn's loggers and ours;
    # else uvicorn's own config, plain text.
    json_lines = {"log_config": logs.uvicorn_log_config(args.log_level)}
    return Config(
        args.app,
        factory=args.factory,
        host=args.host,
        port=args.port,
        http=PROTOCOLS[args.http],
        loop=args.loop,
        log_level=args.log_level,
        access_log=args.access_log,
        **(json_lines if logs.wants_json(settings.log_format) else {}),
    )


#: The collector's thresholds for the ingress (CPython's are 700, 10, 10):
#: a young pass every 20,000 allocations net of frees, a middle pass every 20
#: young ones, and a full pass only after 100 middle ones (and, as always,
#: once the objects that outlived the middle pass since the last full one
#: reach a quarter of those the last one kept). A full pass walks every open
#: event stream's objects, about 220 a stream, and holds the event loop
#: meanwhile: with 1,000 streams open one took 100-190 ms and came every
#: ~13 s under load, which put the events' p99 at 160-190 ms; with these,
#: none came in the benchmark's minute (docs/performance.md §13). What is
#: freed by reference counting, nearly everything a request makes, is freed
#: at once either way; only garbage in cycles waits longer for its pass.
GC_THRESHOLDS = (20_000, 20, 100)


class FrozenAfterStartup(uvicorn.Server):
    """A server whose startup heap (the app, its libraries, the lifespan's
    engine and listener) is left out of the collector's full passes, which
    otherwise walk all of it and stall every open event stream meanwhile
    (one was seen taking ~0.7 s on a loaded machine; docs/performance.md §13),
    and whose full passes come seldom (:data:`GC_THRESHOLDS`).

    Given a ``gate``, it accepts no more connections than the gate's bound
    (``ingest.connections``): its host and port are listened on by a
    :class:`~ingest.connections.GatedListener` instead of the event loop's
    server, which accepts whatever comes until the descriptors run out."""

    def __init__(self, config: Config, *, gate: ConnectionGate | None = None) -> None:
        super().__init__(config)
        self.gate = gate

    async def startup(self, sockets: Any = None) -> None:
        if self.gate is None or sockets is not None or self.config.uds or self.config.fd:
            await super().startup(sockets=sockets)
        else:
            await self._gated_startup(self.gate)
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)

    async def _gated_startup(self, gate: ConnectionGate) -> None:
        """uvicorn's startup for a host and a port, with the accept gated."""
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(STARTUP_FAILURE)
        config = self.config

        def create_protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        try:
            sock = config.bind_socket()  # and logs where it listens, as uvicorn does
            sock.listen(config.backlog)
        except (OSError, SystemExit):
            await self.lifespan.shutdown()
            sys.exit(STARTUP_FAILURE)
        listener = GatedListener(sock, create_protocol, gate, _watch)
        listener.start()
        self.servers = [listener]  # type: ignore[list-item]  # what shutdown closes
        self.started = True


def _watch(protocol: asyncio.Protocol, gate: ConnectionGate) -> None:
    protocol.watched_by(gate)  # type: ignore[attr-defined]  # one of PROTOCOLS


def main() -> None:
    # Before uvicorn logs a line: a bad setting, an unreachable database or a
    # broker that refuses us is one line on stderr and exit 1
    # (models.startup). A broker that is down is a warning: the ingress
    # stores deliveries without it.
    logs.set_process_role("ingress")
    settings = startup.service_settings()
    config = config_from(sys.argv[1:], settings)
    # Before anything opens a descriptor it keeps: as many open files as the
    # hard limit allows, and connections bounded below them (ingest.connections).
    soft_before, soft, hard = raise_open_files_limit()
    bound = connection_bound(soft, settings.max_connections)
    startup.service_ready(settings, through_a_broker_outage=True)
    # Said once the start is sure: a process that cannot start says one line only.
    logging.getLogger("uvicorn.error").info(
        limits_line(soft_before, soft, hard, bound, settings.max_connections)
    )
    server = FrozenAfterStartup(config, gate=ConnectionGate(bound))
    server.run()
    if not server.started:  # as ``uvicorn`` itself exits when it could not start
        sys.exit(STARTUP_FAILURE)


if __name__ == "__main__":
    main()
