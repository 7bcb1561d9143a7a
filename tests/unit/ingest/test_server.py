"""The bounded protocols of ``ingest/server.py``, both parsers, on an in-memory
connection: what a head may cost, how long a request may take, and what the
bounds must leave alone (a body in the same read as its head, a connection's
next request, the app's own time), which plain uvicorn serves too. The real
server, on real sockets, is tests/e2e/test_server_limits.py."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence

import pytest
import uvicorn
from uvicorn.config import Config
from uvicorn.server import ServerState

from ingest.connections import ConnectionGate
from ingest.server import (
    GC_THRESHOLDS,
    BoundedH11Protocol,
    BoundedHttpToolsProtocol,
    FrozenAfterStartup,
    RequestLimits,
    config_from,
)
from models.settings import Settings

CAP = 1024
LIMITS = RequestLimits(max_header_bytes=CAP, header_read_timeout=0.2, body_read_timeout=0.4)
PROTOCOLS = [BoundedHttpToolsProtocol, BoundedH11Protocol]


class Wire(asyncio.Transport):
    """The connection, in memory: what the server wrote, and whether it closed it."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.protocol: asyncio.Protocol | None = None

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def statuses(self) -> list[int]:
        return [
            int(line.split()[1]) for line in self.written.split(b"\r\n") if b"HTTP/1.1 " in line
        ]


class App:
    """An ASGI app that answers 200 with the length of the body it read,
    ``/early`` at once without reading it, after ``pause`` seconds."""

    def __init__(self, pause: float = 0.0) -> None:
        self.pause = pause
        self.seen: list[str] = []

    async def __call__(self, scope, receive, send) -> None:
        self.seen.append(scope["path"])
        size, more = 0, scope["path"] != "/early"
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.seen.append("disconnect")
                return
            size, more = size + len(message["body"]), message["more_body"]
        await asyncio.sleep(self.pause)
        body = str(size).encode()
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def head(size: int, path: str = "/", **headers: str) -> bytes:
    """A request head of exactly ``size`` bytes, padded with an X-Junk header
    (``Content_Length="3"`` is the header Content-Length: 3)."""
    lines = [f"POST {path} HTTP/1.1", "Host: test"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    lines.append("X-Junk: ")
    padding = size - len("\r\n".join(lines).encode()) - len("\r\n\r\n")
    assert padding >= 0
    return ("\r\n".join(lines) + "j" * padding + "\r\n\r\n").encode()


def exchange(
    protocol_class: type,
    reads: Sequence[bytes],
    *,
    app: App | None = None,
    gap: float = 0.0,
    then: float = 0.05,
) -> tuple[Wire, App]:
    """Open a connection, hand the server ``reads`` one by one ``gap`` s apart,
    wait ``then`` s, and return what happened on it."""
    app = app or App()

    async def run() -> Wire:
        config = Config(app=app, lifespan="off", log_config=None)
        protocol = protocol_class(config, ServerState(), {}, limits=LIMITS)
        wire = Wire()
        wire.protocol = protocol
        protocol.connection_made(wire)
        for data in reads:
            if not wire.closed:
                protocol.data_received(data)
            await asyncio.sleep(gap)
        await asyncio.sleep(then)
        if not wire.closed:  # the client goes; ``wire.closed`` still says the server did not close
            protocol.connection_lost(ConnectionResetError())
        await asyncio.sleep(0)
        return wire

    return asyncio.run(run()), app


@pytest.mark.parametrize("protocol_class", PROTOCOLS)
def test_a_head_of_the_cap_is_served_and_one_byte_more_is_refused(protocol_class) -> None:
    wire, app = exchange(protocol_class, [head(CAP, "/at-cap", Content_Length="0")])
    assert wire.statuses() == [200] and app.seen == ["/at-cap"]

    wire, app = exchange(protocol_class, [head(CAP + 1, Content_Length="0")])
    assert wire.statuses() == [431] and wire.closed
    assert app.seen == []  # refused before the app ran


@pytest.mark.parametrize("protocol_class", PROTOCOLS)
def test_a_head_is_counted_across_reads(protocol_class) -> None:
    data = head(4 * CAP)
    wire, app = exchange(protocol_class, [data[i : i + 100] for i in range(0, len(data), 100)])
    assert wire.statuses() == [431] and wire.closed and app.seen == []


@pytest.mark.parametrize("protocol_class", PROTOCOLS)
def test_a_body_in_the_same_read_as_its_head_is_no_part_of_the_head(protocol_class) -> None:
    body = b"b" * (20 * CAP)
    wire, _ = exchange(protocol_class, [head(200, Content_Length=str(len(body))) + body])
    assert wire.statuses() == [200] and wire.written.endswith(str(len(body)).encode())


@pytest.mark.parametrize("protocol_class", PROTOCOLS)
def test_each_request_of_a_connection_has_a_head_of_its_own(protocol_class) -> None:
    one, two = head(CAP - 100, "/one", Content_Length="0"), head(CAP, "/two", Content_Length="0")
    wire, app = exchange(protocol_class, [one, two], gap=0.05)  # one after the other
    assert wire.statuses() == [200, 200] and app.seen == ["/one", "/two"]

    wire, app = exchange(protocol_class, [one + two])  # pipelined, in one read
    assert wire.statuses() == [200, 200] and app.seen == ["/one", "/two"]


@pytest.mark.parametrize("protocol_class", PROTOCOLS)
def test_a_head_slower_than_its_timeout_is_answered_408(protocol_class) -> None:
    data = head(400)
    wire, app = exchange(protocol_class, [data[i : i + 10] for i in range(0, 200, 10)], gap=0.02)
    assert wire.statuses() == [408] and wire.closed and app.seen == []


@pytest.mark.parametrize("protocol_class", PROTOCOLS)
def test_a_connection_that_sends_nothing_is_closed(protocol_class) -> None:
    wire, _ = exchange(protocol_class, [], then=0.3)
    assert wire.statuses() == [408] and wire.closed


@pytest.mark.parametrize("protocol_class", PROTOCOLS)
def test_a_body_slower_than_its_timeout_is_answered_408_and_the_app_told(protocol_class) -> None:
    reads = [head(200, "/slow", Content_Length="100")] + [b"b"] * 10
    wire, app = exchange(protocol_class, reads, gap=0.05, then=0.2)
    assert wire.statuses() == [408] and wire.closed
    assert app.seen == ["/slow", "disconnect"]


@pytest.mark.parametrize("protocol_class", PROTOCOLS)
def test_a_request_answered_before_its_body_came_gets_no_second_answer(protocol_class) -> None:
    reads = [head(200, "/early", Content_Length="100")] + [b"b"] * 10
    wire, _ = exchange(protocol_class, reads, gap=0.05, then=0.2)
    assert wire.statuses() == [200] and wire.closed  # closed at the timeout, no 408


@pytest.mark.parametrize("protocol_class", PROTOCOLS)
def test_the_app_takes_as_long_as_it_takes_once_the_request_has_come(protocol_class) -> None:
    reads = [head(200, "/ok", Content_Length="3") + b"abc"]
    wire, _ = exchange(protocol_class, reads, app=App(pause=0.6), then=1.0)
    assert wire.statuses() == [200] and wire.written.endswith(b"3")


@pytest.mark.parametrize("protocol_class", PROTOCOLS)
def test_at_the_bound_the_connection_waiting_longest_for_a_head_is_closed_with_503(
    protocol_class,
) -> None:
    """The gate makes room one connection at a time, oldest waiting first, and
    never by closing a request being answered."""

    async def run() -> tuple[list[Wire], list[bool]]:
        config = Config(app=App(pause=0.5), lifespan="off", log_config=None)
        state, gate = ServerState(), ConnectionGate(bound=3)
        wires, made = [], []
        for _ in range(3):
            protocol = protocol_class(config, state, {}, limits=LIMITS)
            protocol.watched_by(gate)
            gate.pending += 1  # as the listener counts an accepted connection
            wire = Wire()
            wire.protocol = protocol
            protocol.connection_made(wire)
            wires.append(wire)
        slow_head, answering = wires[:2]
        slow_head.protocol.data_received(b"POST / HTTP/1.1\r\nHost: test\r\n")
        answering.protocol.data_received(head(200, "/busy", Content_Length="0"))
        await asyncio.sleep(0.05)
        assert gate.full()
        made.append(gate.make_room())  # the slow head, the oldest
        made.append(gate.make_room())  # it is still closing: nothing more
        await asyncio.sleep(0)
        made.append(gate.make_room())  # not the request being answered: the silent one
        await asyncio.sleep(0)
        made.append(gate.make_room())  # only the request being answered is left
        await asyncio.sleep(0.6)
        for wire in wires:
            if not wire.closed:
                wire.protocol.connection_lost(ConnectionResetError())
        return wires, made

    (slow_head, answering, silent), made = asyncio.run(run())
    assert made == [True, True, True, False]
    assert slow_head.statuses() == [503] and b"retry-after: 1\r\n" in slow_head.written
    assert silent.statuses() == [503]
    assert answering.statuses() == [200]


def test_the_launcher_serves_the_bounded_protocols_where_the_settings_say() -> None:
    settings = Settings(host="0.0.0.0", port=8123)
    config = config_from(["--no-access-log"], settings)
    assert (config.app, config.host, config.port) == ("ingest.app:app", "0.0.0.0", 8123)
    assert config.http is BoundedHttpToolsProtocol and config.access_log is False

    config = config_from(
        ["bench.baselines:tutorial_app", "--factory", "--http", "h11", "--port", "9"], settings
    )
    assert (config.app, config.factory, config.http, config.port) == (
        "bench.baselines:tutorial_app",
        True,
        BoundedH11Protocol,
        9,
    )


def test_the_server_freezes_its_startup_heap_and_makes_full_collections_rare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After uvicorn's own startup, the startup heap leaves the collector's
    passes and the thresholds become GC_THRESHOLDS, so a full pass, which
    holds the event loop over every open stream, comes seldom."""
    started: list[bool] = []

    async def uvicorn_startup(self, sockets=None) -> None:
        started.append(True)

    monkeypatch.setattr(uvicorn.Server, "startup", uvicorn_startup)
    thresholds = gc.get_threshold()
    try:
        gc.unfreeze()
        asyncio.run(FrozenAfterStartup(Config("ingest.app:app")).startup())
        assert started == [True]
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
        # A full pass waits for 100 middle ones, each for 20 young ones.
        assert GC_THRESHOLDS[1] * GC_THRESHOLDS[2] > thresholds[1] * thresholds[2]
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
