"""A fake of GitHub's webhook-delivery REST API: a real HTTP server on 127.0.0.1.

GitHub never redelivers a failed webhook delivery on its own: it keeps every
attempt for three days and lists them at ``…/hooks/{hook_id}/deliveries``.
This server speaks that API -- the log, one full delivery, a redelivery -- for a
repository's, an organization's and a GitHub App's hook, in the shapes of
GitHub's published examples (tests/fixtures/github_api/, sources in its
SOURCES.md), so a catch-up test runs over real sockets, real cursor pagination
and real failure answers::

    with FakeGitHub(token="ghp_test") as github:
        github.log_delivery(hook="repos/acme/widgets/hooks/123", event="issues",
                            payload=body, status_code=502)
        ...  # a source whose API base URL is github.base_url

As a pytest fixture: ``yield from FakeGitHub(token="ghp_test").serve()``.

Not modelled: the three-day expiry, backwards pages (``rel="prev"``), and GitHub
actually sending a redelivery anywhere (a redelivery is only logged).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import re
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit

DEFAULT_PER_PAGE = 30
MAX_PER_PAGE = 100
RATE_LIMIT = 5000
#: An App's hook has an id (its deliveries' X-GitHub-Hook-ID), though its path shows none.
APP_HOOK_ID = 420001
APP_ID = 4200
FIRST_ATTEMPT_ID = 1_000_000_001
HOOKSHOT_USER_AGENT = "GitHub-Hookshot/b8c71d8"  # as in the hook-delivery example
DOCS = "https://docs.github.com/rest"
RATE_LIMIT_DOCS = "https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api"
PRIMARY_RATE_LIMIT = "API rate limit exceeded for user ID 1."
SECONDARY_RATE_LIMIT = "You have exceeded a secondary rate limit. Please wait a few minutes."

HOOK = re.compile(r"repos/[^/]+/[^/]+/hooks/\d+|orgs/[^/]+/hooks/\d+|app/hook")
ROUTE = re.compile(
    rf"/(?P<hook>{HOOK.pattern})/deliveries(?:/(?P<delivery>[^/]+)(?P<attempts>/attempts)?)?"
)
CURSOR_PREFIX = "v1_"  # GitHub's delivery cursors look like v1_<id>; clients must not care

# Each operation's externalDocs URL in GitHub's OpenAPI description (one anchor is irregular).
OPERATION_DOCS = {
    ("repos", "list"): "repos/webhooks#list-deliveries-for-a-repository-webhook",
    ("repos", "get"): "repos/webhooks#get-a-delivery-for-a-repository-webhook",
    ("repos", "redeliver"): "repos/webhooks#redeliver-a-delivery-for-a-repository-webhook",
    ("orgs", "list"): "orgs/webhooks#list-deliveries-for-an-organization-webhook",
    ("orgs", "get"): "orgs/webhooks#get-a-webhook-delivery-for-an-organization-webhook",
    ("orgs", "redeliver"): "orgs/webhooks#redeliver-a-delivery-for-an-organization-webhook",
    ("app", "list"): "apps/webhooks#list-deliveries-for-an-app-webhook",
    ("app", "get"): "apps/webhooks#get-a-delivery-for-an-app-webhook",
    ("app", "redeliver"): "apps/webhooks#redeliver-a-delivery-for-an-app-webhook",
}

# The list's `status` filter, as documented: by status_code range. So a delivery
# that never got an answer (status_code 0) is in neither.
STATUS_FILTERS: dict[str | None, Callable[[int], bool]] = {
    None: lambda code: True,
    "success": lambda code: 200 <= code <= 399,
    "failure": lambda code: 400 <= code <= 599,
}


class ReceivedRequest(NamedTuple):
    """A request the fake received. Header names are lower-cased."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass(frozen=True)
class Attempt:
    """One attempt in a hook's delivery log, as GitHub records it."""

    id: int
    hook: str
    guid: str
    event: str
    action: str | None
    payload: dict[str, Any]
    headers: dict[str, str]
    status_code: int
    status: str
    delivered_at: datetime
    redelivery: bool
    duration: float
    installation_id: int | None
    repository_id: int | None
    url: str
    throttled_at: datetime | None = None

    @property
    def position(self) -> tuple[datetime, int]:
        """Where the attempt sorts in its log (listed newest first)."""
        return (self.delivered_at, self.id)

    def simple(self) -> dict[str, Any]:
        """The list's "simple webhook delivery", keys in the example's order."""
        return {
            "id": self.id,
            "guid": self.guid,
            "delivered_at": _iso(self.delivered_at),
            "redelivery": self.redelivery,
            "duration": self.duration,
            "status": self.status,
            "status_code": self.status_code,
            "event": self.event,
            "action": self.action,
            "installation_id": self.installation_id,
            "repository_id": self.repository_id,
            "throttled_at": _iso(self.throttled_at) if self.throttled_at else None,
        }

    def full(self) -> dict[str, Any]:
        """The "webhook delivery": the simple fields, the URL, the request and the response."""
        simple = self.simple()
        throttled_at = simple.pop("throttled_at")  # the example has it after `url`
        return {
            **simple,
            "url": self.url,
            "throttled_at": throttled_at,
            "request": {"headers": dict(self.headers), "payload": self.payload},
            "response": self._response(),
        }

    def _response(self) -> dict[str, Any]:
        if self.status_code == 0:  # nothing answered: no headers, no body
            return {"headers": {}, "payload": None}
        return {"headers": {"Content-Type": "application/json"}, "payload": ""}


@dataclass(frozen=True)
class _Answer:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Fault:
    """An answer injected in place of the next request's: a server error or a rate limit."""

    status: int
    retry_after: int | None = None
    reset_in: int | None = None

    @property
    def is_rate_limit(self) -> bool:
        return self.retry_after is not None or self.reset_in is not None


class _RateLimit:
    """The primary rate limit's headers, counting the authenticated requests."""

    def __init__(self) -> None:
        self.used = 0
        self.reset = int(time.time()) + 3600

    def spend(self) -> None:
        if time.time() >= self.reset:
            self.used, self.reset = 0, int(time.time()) + 3600
        self.used += 1

    def headers(self) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": str(RATE_LIMIT),
            "X-RateLimit-Remaining": str(max(0, RATE_LIMIT - self.used)),
            "X-RateLimit-Reset": str(self.reset),
            "X-RateLimit-Used": str(self.used),
            "X-RateLimit-Resource": "core",
        }


class FakeGitHub:
    """GitHub's webhook-delivery API on 127.0.0.1, on a free port, in a background thread.

    ``token`` is the token the repository and organization endpoints accept
    (``Bearer`` or ``token``); ``/app/hook/...`` accepts any JWT-shaped bearer
    token instead and records it in ``app_jwts``. With ``redelivery_succeeds``
    a redelivery request logs a new, successful attempt of the same delivery;
    without it the request is only recorded in ``redeliveries``.
    """

    def __init__(
        self,
        token: str = "ghp_test",
        *,
        redelivery_succeeds: bool = True,
        hook_url: str = "https://taskhook.example.com/webhooks/github",
    ) -> None:
        self.token = token
        self.redelivery_succeeds = redelivery_succeeds
        self.hook_url = hook_url
        #: per_page is honoured up to this (and never past GitHub's 100).
        self.page_size_cap = MAX_PER_PAGE
        self.requests: list[ReceivedRequest] = []
        self.redeliveries: list[int] = []
        self.app_jwts: list[str] = []
        self._attempts: list[Attempt] = []
        self._hooks: set[str] = set()
        self._faults: deque[_Fault] = deque()
        self._ids = itertools.count(FIRST_ATTEMPT_ID)
        self._rate_limit = _RateLimit()
        # Handler threads and the test's thread share the log and the counters.
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    # -- running -----------------------------------------------------------

    def start(self) -> FakeGitHub:
        if self._server is not None:
            raise RuntimeError("FakeGitHub is already running")
        self._server = _Server(self)
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},  # how long stop() waits for the loop at most
            name=f"fake-github:{self._port}",
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

    def serve(self) -> Iterator[FakeGitHub]:
        """For a pytest fixture: ``yield from FakeGitHub(...).serve()``."""
        with self:
            yield self

    def __enter__(self) -> FakeGitHub:
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
        """What a source's API base URL is set to, e.g. ``http://127.0.0.1:54321``."""
        if self._port is None:
            raise RuntimeError("FakeGitHub has not been started")
        return f"http://127.0.0.1:{self._port}"

    # -- the log -----------------------------------------------------------

    def add_hook(self, hook: str) -> str:
        """Make a hook exist with an empty log; an unknown hook's endpoints answer 404."""
        hook = _hook_path(hook)
        with self._lock:
            self._hooks.add(hook)
        return hook

    def log_delivery(
        self,
        *,
        hook: str,
        event: str,
        payload: dict[str, Any],
        guid: str | None = None,
        action: str | None = None,
        headers: dict[str, str] | None = None,
        status_code: int = 502,
        status: str | None = None,
        delivered_at: datetime | None = None,
        redelivery: bool = False,
        duration: float = 0.27,
        throttled_at: datetime | None = None,
    ) -> int:
        """Log one attempt of a delivery to ``hook`` and return its id.

        ``hook`` is ``repos/{owner}/{repo}/hooks/{id}``, ``orgs/{org}/hooks/{id}``
        or ``app/hook``. ``status_code`` is what our ingress answered: 0 for no
        answer at all, 202 for delivered. Unless given: ``guid`` is a new one,
        ``action`` the payload's, ``headers`` the set GitHub sends, ``status``
        GitHub's text for the code, ``delivered_at`` now.
        """
        hook = _hook_path(hook)
        guid = guid or str(uuid.uuid4())
        payload = json.loads(json.dumps(payload))  # JSON now, and no later edit shows through
        if headers is None:
            headers = _hookshot_headers(hook, guid, event, payload)
        with self._lock:
            attempt = Attempt(
                id=next(self._ids),
                hook=hook,
                guid=guid,
                event=event,
                action=action if action is not None else _action_of(payload),
                payload=payload,
                headers=dict(headers),
                status_code=status_code,
                status=status if status is not None else _status_text(status_code),
                delivered_at=_utc(delivered_at) if delivered_at else _now(),
                redelivery=redelivery,
                duration=duration,
                installation_id=_id_of(payload, "installation"),
                repository_id=_id_of(payload, "repository"),
                url=self.hook_url,
                throttled_at=_utc(throttled_at) if throttled_at else None,
            )
            self._hooks.add(hook)
            self._attempts.append(attempt)
        return attempt.id

    def attempts(self, hook: str | None = None) -> list[Attempt]:
        """The logged attempts (of ``hook``, or of every hook), newest first."""
        with self._lock:
            return self._log(_hook_path(hook) if hook else None)

    # -- faults ------------------------------------------------------------

    def fail_next(self, n: int, status: int = 502) -> None:
        """The next ``n`` requests, whatever they ask, answer ``status`` (a 5xx, usually)."""
        HTTPStatus(status)  # a status GitHub could send, or a ValueError now
        with self._lock:
            self._faults.extend(_Fault(status) for _ in range(n))

    def rate_limit_next(
        self,
        n: int,
        *,
        retry_after: int | None = None,
        reset_in: int | None = None,
        status: int = 429,
    ) -> None:
        """The next ``n`` requests are rate-limited.

        ``retry_after``: a secondary rate limit, with ``Retry-After`` (the
        default, 1 s). ``reset_in``: the primary limit spent, with
        ``X-RateLimit-Remaining: 0`` and ``X-RateLimit-Reset`` that many seconds
        from the answer. GitHub answers either with 403 or 429.
        """
        if retry_after is None and reset_in is None:
            retry_after = 1
        with self._lock:
            self._faults.extend(_Fault(status, retry_after, reset_in) for _ in range(n))

    # -- answering (called from the server's threads) ----------------------

    def _answer(self, request: ReceivedRequest) -> _Answer:
        with self._lock:
            self.requests.append(request)
            answer = self._handle(request)
            common = {
                "Content-Type": "application/json; charset=utf-8",
                "X-GitHub-Media-Type": "github.v3; format=json",
                **self._rate_limit.headers(),
                "X-GitHub-Request-Id": _request_id(),
            }
        return replace(answer, headers={**common, **answer.headers})

    def _handle(self, request: ReceivedRequest) -> _Answer:
        if self._faults:
            return _fault_answer(self._faults.popleft())
        route = ROUTE.fullmatch(request.path)
        if route is None:
            return _error(404, "Not Found", DOCS)
        hook = route["hook"]
        refusal = self._refusal(hook, request.headers.get("authorization", ""))
        if refusal is not None:
            return refusal
        self._rate_limit.spend()
        return self._serve_hook(request, hook, route["delivery"], bool(route["attempts"]))

    def _serve_hook(
        self, request: ReceivedRequest, hook: str, delivery: str | None, attempts: bool
    ) -> _Answer:
        """The list, one delivery, or a redelivery: GitHub's 404 for what is not there."""
        if delivery is None:
            if request.method != "GET" or hook not in self._hooks:
                return _error(404, "Not Found", _docs(hook, "list"))
            return self._list(request, hook)
        operation, method = ("redeliver", "POST") if attempts else ("get", "GET")
        attempt = self._find(hook, delivery)
        if attempt is None or request.method != method:
            return _error(404, "Not Found", _docs(hook, operation))
        if operation == "redeliver":
            return self._redeliver(attempt)
        return _Answer(200, attempt.full())

    def _refusal(self, hook: str, authorization: str) -> _Answer | None:
        """401 unless the credentials fit the endpoint: the token, or (for an App) a JWT."""
        if not authorization:
            return _error(401, "Requires authentication", DOCS)
        scheme, _, credential = authorization.partition(" ")
        scheme = scheme.lower()
        if hook == "app/hook":
            if scheme == "bearer" and _looks_like_jwt(credential):
                self.app_jwts.append(credential)
                return None
            return _error(401, "A JSON web token could not be decoded", DOCS)
        if scheme in ("bearer", "token") and credential == self.token:
            return None
        return _error(401, "Bad credentials", DOCS)

    def _list(self, request: ReceivedRequest, hook: str) -> _Answer:
        query = request.query
        try:
            page_size = self._page_size(query.get("per_page"))
            wanted = STATUS_FILTERS[query.get("status")]
            start_after = self._cursor_position(query.get("cursor"))
        except (ValueError, KeyError):
            return _error(400, "Bad Request", _docs(hook, "list"))
        log = [attempt for attempt in self._log(hook) if wanted(attempt.status_code)]
        if start_after is not None:
            log = [attempt for attempt in log if attempt.position < start_after]
        page = log[:page_size]
        headers = {}
        if len(log) > page_size:
            headers["Link"] = self._next_link(request, page_size, page[-1])
        return _Answer(200, [attempt.simple() for attempt in page], headers)

    def _page_size(self, per_page: str | None) -> int:
        wanted = DEFAULT_PER_PAGE if per_page is None else int(per_page)
        return max(1, min(wanted, MAX_PER_PAGE, self.page_size_cap))

    def _cursor_position(self, cursor: str | None) -> tuple[datetime, int] | None:
        """Where the page after ``cursor`` starts: below the attempt it names."""
        if cursor is None:
            return None
        if not cursor.startswith(CURSOR_PREFIX):
            raise ValueError(cursor)
        attempt_id = int(cursor.removeprefix(CURSOR_PREFIX))
        for attempt in self._attempts:
            if attempt.id == attempt_id:
                return attempt.position
        raise ValueError(cursor)

    def _next_link(self, request: ReceivedRequest, page_size: int, last: Attempt) -> str:
        # GitHub echoes the query it was given, with the cursor of the next page.
        params = {
            "per_page": request.query.get("per_page", str(page_size)),
            "cursor": f"{CURSOR_PREFIX}{last.id}",
        }
        if "status" in request.query:
            params["status"] = request.query["status"]
        return f'<{self.base_url}{request.path}?{urlencode(params)}>; rel="next"'

    def _find(self, hook: str, delivery: str) -> Attempt | None:
        if not delivery.isdigit():
            return None
        return next((a for a in self._attempts if a.id == int(delivery) and a.hook == hook), None)

    def _redeliver(self, attempt: Attempt) -> _Answer:
        self.redeliveries.append(attempt.id)
        if self.redelivery_succeeds:
            # GitHub sends the same delivery again: same guid, same headers, a new attempt.
            self._attempts.append(
                replace(
                    attempt,
                    id=next(self._ids),
                    delivered_at=_now(),
                    redelivery=True,
                    status_code=202,
                    status=_status_text(202),
                    duration=0.05,
                    throttled_at=None,
                )
            )
        return _Answer(202, {})

    def _log(self, hook: str | None) -> list[Attempt]:
        mine = (a for a in self._attempts if hook is None or a.hook == hook)
        return sorted(mine, key=lambda attempt: attempt.position, reverse=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as GitHub and its clients speak
    server_version = "GitHub.com"
    sys_version = ""
    server: _Server

    def do_GET(self) -> None:
        self._serve()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _serve(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)  # unread, it would be taken for the next request
        request = ReceivedRequest(
            method=self.command,
            path=url.path,
            query=dict(parse_qsl(url.query, keep_blank_values=True)),
            headers={name.lower(): value for name, value in self.headers.items()},
        )
        answer = self.server.fake._answer(request)
        body = json.dumps(answer.body).encode()
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: tests read ``FakeGitHub.requests``, not stderr."""


class _Server(ThreadingHTTPServer):
    # server_close() joins every handler thread, so a stop leaves none behind.
    daemon_threads = False

    def __init__(self, fake: FakeGitHub) -> None:
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


# -- shapes --------------------------------------------------------------------


def _hook_path(hook: str) -> str:
    path = hook.strip("/")
    if not HOOK.fullmatch(path):
        raise ValueError(
            f"not a hook: {hook!r} (repos/OWNER/REPO/hooks/ID, orgs/ORG/hooks/ID or app/hook)"
        )
    return path


def _docs(hook: str, operation: str) -> str:
    return f"{DOCS}/{OPERATION_DOCS[hook.split('/', 1)[0], operation]}"


def _error(status: int, message: str, documentation_url: str) -> _Answer:
    return _Answer(
        status, {"message": message, "documentation_url": documentation_url, "status": str(status)}
    )


def _fault_answer(fault: _Fault) -> _Answer:
    if not fault.is_rate_limit:
        return _Answer(fault.status, {"message": HTTPStatus(fault.status).phrase})
    if fault.reset_in is None:  # a secondary rate limit: wait, then try again
        answer = _error(fault.status, SECONDARY_RATE_LIMIT, RATE_LIMIT_DOCS)
        return replace(answer, headers={"Retry-After": str(fault.retry_after)})
    headers = {  # the primary rate limit spent until the reset
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Used": str(RATE_LIMIT),
        "X-RateLimit-Reset": str(math.ceil(time.time() + fault.reset_in)),
    }
    if fault.retry_after is not None:
        headers["Retry-After"] = str(fault.retry_after)
    return replace(_error(fault.status, PRIMARY_RATE_LIMIT, RATE_LIMIT_DOCS), headers=headers)


def _hookshot_headers(hook: str, guid: str, event: str, payload: dict[str, Any]) -> dict[str, str]:
    """The request headers GitHub sends with a delivery, named and ordered as in its example."""
    target_type, target_id = _installation_target(hook, payload)
    # The API hands back the payload parsed, not the bytes GitHub signed, so no
    # signature can be checked against it: any value of the right form will do.
    return {
        "X-GitHub-Delivery": guid,
        "X-Hub-Signature-256": f"sha256={hashlib.sha256(guid.encode()).hexdigest()}",
        "Accept": "*/*",
        "X-GitHub-Hook-ID": str(_hook_id(hook)),
        "User-Agent": HOOKSHOT_USER_AGENT,
        "X-GitHub-Event": event,
        "X-GitHub-Hook-Installation-Target-ID": str(target_id),
        "X-GitHub-Hook-Installation-Target-Type": target_type,
        "content-type": "application/json",
        "X-Hub-Signature": f"sha1={hashlib.sha1(guid.encode()).hexdigest()}",
    }


def _hook_id(hook: str) -> int:
    return APP_HOOK_ID if hook == "app/hook" else int(hook.rsplit("/", 1)[1])


def _installation_target(hook: str, payload: dict[str, Any]) -> tuple[str, int]:
    owner = hook.split("/", 1)[0]
    if owner == "repos":
        return "repository", _id_of(payload, "repository") or 0
    if owner == "orgs":
        return "organization", _id_of(payload, "organization") or 0
    return "integration", APP_ID


def _id_of(payload: dict[str, Any], key: str) -> int | None:
    value = payload.get(key)
    return value.get("id") if isinstance(value, dict) else None


def _action_of(payload: dict[str, Any]) -> str | None:
    action = payload.get("action")
    return action if isinstance(action, str) else None


def _status_text(status_code: int) -> str:
    """GitHub's words for what the hook's URL answered, as its deliveries page shows them."""
    if status_code == 0:
        return "failed to connect"
    if 200 <= status_code <= 299:
        return "OK"
    return f"Invalid HTTP Response: {status_code}"


def _looks_like_jwt(credential: str) -> bool:
    parts = credential.split(".")
    return len(parts) == 3 and all(parts)


def _request_id() -> str:
    # GitHub's look: five upper-case hex groups, e.g. C0DE:1F2A:3B4C5D:6E7F80:66F1A2B3.
    digits = uuid.uuid4().hex.upper()
    return f"{digits[:4]}:{digits[4:8]}:{digits[8:15]}:{digits[15:22]}:{digits[22:30]}"


def _now() -> datetime:
    return datetime.now(UTC)


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError(f"give an aware datetime, not {moment!r}")
    return moment.astimezone(UTC)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
