"""What every fake API here shares: a real HTTP server on 127.0.0.1, run on a
thread of its own, that hands each request to the fake and writes its answer.

A fake (``bench.fakes.github_api``, ``bench.fakes.jira_api``,
``bench.fakes.gitlab_api``) subclasses
:class:`FakeServer` and answers :meth:`FakeServer._answer`; starting,
stopping (every connection and handler thread ended) and the context
manager are written here once.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, NamedTuple, Self
from urllib.parse import parse_qsl, urlsplit


class ReceivedRequest(NamedTuple):
    """A request a fake received. Header names are lower-cased."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass(frozen=True)
class Answer:
    """What a fake answers: a status, a JSON body, headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


class FakeServer:
    """A fake API, served on a free port of 127.0.0.1 once started."""

    #: The ``Server`` header of every answer, and the name in errors.
    server_version = "FakeServer"

    def __init__(self) -> None:
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    def _answer(self, request: ReceivedRequest) -> Answer:
        raise NotImplementedError

    def _query(self, raw: str) -> dict[str, str]:
        """The query's parameters; a repeated one keeps its last value."""
        return dict(parse_qsl(raw, keep_blank_values=True))

    def _path_prefix(self) -> str:
        """What the base URL has after the port (a site's context path)."""
        return ""

    # -- running -----------------------------------------------------------

    def start(self) -> Self:
        if self._server is not None:
            raise RuntimeError(f"{type(self).__name__} is already running")
        self._server = _Server(self)
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},  # how long stop() waits for the loop at most
            name=f"{type(self).__name__}:{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; returns once every connection and thread of the fake has ended."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_connections()
        server.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join()

    def serve(self) -> Iterator[Self]:
        """For a pytest fixture: ``yield from FakeX(...).serve()``."""
        with self:
            yield self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """Where the fake is, e.g. ``http://127.0.0.1:54321``."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} has not been started")
        return f"http://127.0.0.1:{self._port}{self._path_prefix()}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real APIs and their clients speak
    # The headers and the body go out in two writes: without TCP_NODELAY the
    # second waits for the client's delayed ACK, 40 ms per answer on Linux.
    disable_nagle_algorithm = True
    sys_version = ""
    server: _Server

    def version_string(self) -> str:
        return self.server.fake.server_version

    def do_GET(self) -> None:
        self._serve()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _serve(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)  # unread, it would be taken for the next request
        fake = self.server.fake
        request = ReceivedRequest(
            method=self.command,
            path=url.path,
            query=fake._query(url.query),
            headers={name.lower(): value for name, value in self.headers.items()},
        )
        answer = fake._answer(request)
        body = json.dumps(answer.body).encode()
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: tests read the fake's ``requests``, not stderr."""


class _Server(ThreadingHTTPServer):
    # server_close() joins every handler thread, so a stop leaves none behind.
    daemon_threads = False

    def __init__(self, fake: FakeServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fake = fake
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Cut open connections: an idle keep-alive one's handler would wait for its client."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a connection the client or stop() cut is not the fake's error
        super().handle_error(request, client_address)
