"""An OTLP/HTTP receiver in this process: what ``bench tracing`` exports its
spans to (counted, then dropped) and what ``tests/e2e/test_tracing.py``
decodes. Each export's body goes to ``on_export``; the answer is an empty
200, as a collector's is."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.processes import free_port


@contextlib.contextmanager
def otlp_receiver(on_export: Callable[[bytes], None]) -> Iterator[str]:
    """Serve OTLP/HTTP exports on a free local port; its URL."""
    port = free_port()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            on_export(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
