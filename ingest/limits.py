"""Bounds on what a caller of the REST API, the event stream and MCP may make
the ingress hold: a body's size, how many streams stay open, and for how long
(docs/reliability.md, "Hostile input"). The webhook routes bound their own
bodies (``ingest.webhooks``), and the server bounds headers and slow senders.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413
    before the app reads it whole (by its Content-Length when it has one, else
    as it streams). Paths starting with one of ``exempt`` keep their own limit."""

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
            await self._too_large(send)
            return
        seen = 0
        answered = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        async def watching(message: Message) -> None:
            nonlocal answered
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watching)
        except _TooLarge:
            if not answered:
                await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
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


class _TooLarge(Exception):
    """Raised out of ``receive`` once a streamed body passes the limit."""


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
