"""Bounds on what a caller of the REST API, the event stream and MCP may make
the ingress hold: a body's size, how many streams stay open, and for how long
(docs/reliability.md, "Hostile input"). The webhook routes bound their own
bodies (``ingest.webhooks``), and the server bounds headers and slow senders.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413,
    and logged in one line, before the app sees any of it: by its
    Content-Length when it has one, else as it streams. Paths starting with
    one of ``exempt`` keep their own limit.

    A body is read here, up to the limit, and handed to the app whole: a
    refusal raised out of the app's own reads was the app's to answer, and
    MCP's (a Starlette app of its own) answered it 500, with nothing logged.
    Every app behind this reads its whole body anyway, so none holds more
    than before; but MCP's bearer check, which used to refuse an anonymous
    caller before its body was read, now comes after it, as the REST API's
    always did."""

    def __init__(self, app: ASGIApp, *, limit: int, exempt: tuple[str, ...]) -> None:
        self.app = app
        self.limit = limit
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.exempt):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"")
        if not declared and b"transfer-encoding" not in headers:
            # No body (RFC 9112 §6.3): nothing to count, and an event stream's
            # every write is spared a wrapper.
            await self.app(scope, receive, send)
            return
        if declared.isdigit() and int(declared) > self.limit:
            await self._too_large(scope, send, "by its Content-Length")
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before its body ended: no one to answer
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                await self._too_large(scope, send, "as it streamed")
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        chunks.clear()
        handed = False

        async def replayed() -> Message:
            nonlocal handed
            if handed:
                return await receive()  # after the body: a disconnect, as before
            handed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replayed, send)

    async def _too_large(self, scope: Scope, send: Send, found: str) -> None:
        log.warning(
            "413 for %s %r: its request body is over the %d-byte limit (found %s)",
            scope["method"],
            scope["path"],
            self.limit,
            found,
        )
        body = json.dumps({"error": f"request body over the {self.limit}-byte limit"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class StreamsFull(Exception):
    """No slot for one more event stream: the token, or the ingress, is at its cap."""


class StreamSlots:
    """How many event streams are open, in all and per token.

    A stream takes a slot before it is answered and gives it back when it
    ends, so a caller over a cap is refused (429 over REST) instead of one more open
    connection (and, on SQLite or while the listener is down, one more stream that
    polls the database).
    """

    def __init__(self, *, total: int, per_token: int) -> None:
        self.total, self.per_token = total, per_token
        self._open: Counter[int] = Counter()

    def take(self, token_id: int) -> Callable[[], None]:
        """A slot for ``token_id``, and the function that gives it back; raises
        :class:`StreamsFull` when the token, or the ingress, is at its cap."""
        if self._open[token_id] >= self.per_token:
            raise StreamsFull(
                f"this token has {self.per_token} event streams open, the most it may: "
                "close one, or page with ?after="
            )
        if sum(self._open.values()) >= self.total:
            raise StreamsFull(
                f"the ingress has {self.total} event streams open, the most it keeps: "
                "retry later, or page with ?after="
            )
        self._open[token_id] += 1

        def give_back() -> None:
            self._open[token_id] -= 1
            if not self._open[token_id]:
                del self._open[token_id]

        return give_back


class Lifetime:
    """ASGI middleware: a streamed answer (``GET``, ``text/event-stream``) ends
    after ``seconds``, as if its client had hung up; the client reconnects.
    MCP's standalone GET stream carries nothing in stateless mode, so without
    this it stays open -- idle -- for as long as the client likes."""

    def __init__(self, app: ASGIApp, *, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        ends_at = time.monotonic() + self.seconds
        open_body = False

        async def until_it_ends() -> Message:
            with anyio.move_on_after(max(ends_at - time.monotonic(), 0)):
                return await receive()
            return {"type": "http.disconnect"}

        async def watching(message: Message) -> None:
            nonlocal open_body
            if message["type"] == "http.response.start":
                open_body = True
            elif message["type"] == "http.response.body":
                open_body = message.get("more_body", False)
            await send(message)

        await self.app(scope, until_it_ends, watching)
        if open_body:
            # The app stopped as for a client gone, but the client is still
            # there: end the body properly, so it sees a closed stream.
            await send({"type": "http.response.body", "body": b"", "more_body": False})
