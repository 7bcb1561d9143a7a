"""Who is at the console, and whether a form really came from it.

Sign-in takes an API token through a form and answers with a session cookie
(``models.console_sessions``): HttpOnly, SameSite=Strict, Secure when the
console is served over https, and expiring with the session. The token
itself never reaches a cookie or a page.

Members see; operators act. Every action is a POST that carries the
session's CSRF token in a hidden field, and whose ``Origin``, when the
browser sends one, is the console's own; anything else is refused before
the action runs. The sign-in form has no session yet, so its CSRF token is a
double-submit pair: a short-lived cookie and the same value in the form.

Guessing tokens at the sign-in form is limited (:class:`SignInLimits`): past
``TASKHOOK_CONSOLE_SIGN_IN_FAILURES`` wrong tokens from one client address,
or for one token prefix, within ``TASKHOOK_CONSOLE_SIGN_IN_WINDOW_SECONDS``,
the form answers 429 with ``Retry-After``, whatever the token. Every refused
sign-in is logged (:func:`log_refused`) with the address and why, never the
token: at most its prefix, and only when that is a token's shown prefix,
which the token list already shows.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, Request
from starlette.datastructures import FormData
from starlette.responses import Response

from ingest.rest import SESSION_COOKIE, console_session_of
from ingest.runtime import IngressRuntime
from models.console_sessions import SignedIn, StartedSession, end_session, start_session
from models.db import session_scope
from models.tokens import SHOWN_PREFIX_LENGTH, known_prefix

log = logging.getLogger(__name__)

PREFIX = "/console"
SIGN_IN_COOKIE = "taskhook_sign_in"
#: How long a sign-in form stays good for.
SIGN_IN_FORM_SECONDS = 3600


class SignInRequired(Exception):
    """No session, or one that ended: the browser is sent to the sign-in form."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


class Refused(Exception):
    """An action the console will not take; answered with a page saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _runtime(request: Request) -> IngressRuntime:
    return request.app.state.runtime


def console_user(request: Request) -> SignedIn:
    """The signed-in user, or a redirect to the sign-in form that comes back here."""
    user = console_session_of(request)
    if user is None:
        wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise SignInRequired(wanted if request.method == "GET" else PREFIX + "/")
    return user


User = Annotated[SignedIn, Depends(console_user)]


def require_operator(user: SignedIn, what: str) -> None:
    if not user.principal.is_operator:
        raise Refused(
            403,
            f"{what} needs an operator token; this one ({user.principal.name}) "
            "is a member's, which may look but not act.",
        )


async def checked_form(request: Request, user: SignedIn) -> FormData:
    """The action's form, once it has shown that it came from a console page
    of this session: its Origin and its CSRF token."""
    _same_origin(request)
    form = await request.form()
    if not _same_secret(form.get("csrf"), user.csrf_token):
        raise Refused(
            403,
            "This form is out of date or did not come from the console; "
            "reload the page and try again.",
        )
    return form


def _same_origin(request: Request) -> None:
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return  # not every browser sends one; the CSRF token still decides
    own = f"{request.url.scheme}://{request.url.netloc}"
    if origin.rstrip("/") != own:
        raise Refused(403, "A page of another site sent this form; nothing was done.")


def _same_secret(given: object, wanted: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), wanted.encode())


# --- signing in and out ------------------------------------------------------------------


def new_sign_in_form(response: Response, request: Request) -> str:
    """A CSRF token for a sign-in form: set in a cookie, returned for the form."""
    token = secrets.token_urlsafe(24)
    response.set_cookie(
        SIGN_IN_COOKIE,
        token,
        max_age=SIGN_IN_FORM_SECONDS,
        path=PREFIX,
        **_cookie_flags(request),
    )
    return token


def sign_in_form_is_ours(request: Request, form: FormData) -> bool:
    _same_origin(request)
    cookie = request.cookies.get(SIGN_IN_COOKIE)
    return bool(cookie) and _same_secret(form.get("csrf"), cookie)


def client_address(request: Request) -> str:
    """The address a request came from: the peer's, or the one a proxy in
    uvicorn's ``FORWARDED_ALLOW_IPS`` named in ``X-Forwarded-For``."""
    return request.client.host if request.client else "unknown"


def sign_in(request: Request, token: str) -> StartedSession | None:
    runtime = _runtime(request)
    lifetime = timedelta(hours=runtime.settings.console_session_hours)
    with runtime.store_errors(), session_scope(runtime.sessions) as session:
        return start_session(
            session=session,
            token=token.strip(),
            lifetime=lifetime,
            address=client_address(request),
        )


def log_refused(request: Request, token: str | None, why: str) -> None:
    """Log a refused sign-in: from where, why, and which token's prefix it
    named -- only when that is a token's shown prefix; else not a character
    of what was typed (it could be part of some other secret). ``token``
    None: a refusal before any token was read (too many), which costs no
    query of the store."""
    if token is None:
        named = "token not checked"
    else:
        prefix = None
        if token := token.strip():
            runtime = _runtime(request)
            with runtime.store_errors(), session_scope(runtime.sessions) as session:
                prefix = known_prefix(session=session, token=token)
        named = f"token prefix {prefix}" if prefix else "no known token's prefix"
    log.warning("console sign-in refused from %s: %s (%s)", client_address(request), why, named)


class SignInLimits:
    """Wrong tokens at the sign-in form, per client address and per token
    prefix, in a sliding window: at most ``failures`` of each within
    ``window_seconds``. Kept in this process's memory (each ingress process
    counts its own), at most ``keys`` addresses and as many prefixes, the
    least recently failed forgotten first. A prefix is kept as its SHA-256."""

    def __init__(
        self,
        *,
        failures: int,
        window_seconds: float,
        keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.window_seconds = window_seconds
        self._keys = keys
        self._clock = clock
        self._addresses: OrderedDict[str, deque[float]] = OrderedDict()
        self._prefixes: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _prefix(token: str) -> str | None:
        token = token.strip()
        if not token:
            return None
        return hashlib.sha256(token[:SHOWN_PREFIX_LENGTH].encode()).hexdigest()

    def retry_after(self, address: str, token: str) -> int:
        """Seconds until a sign-in from ``address`` with ``token`` is taken
        again; 0: now."""
        now = self._clock()
        with self._lock:
            waits = [self._wait(self._addresses, address, now)]
            if (prefix := self._prefix(token)) is not None:
                waits.append(self._wait(self._prefixes, prefix, now))
        return max(waits)

    def failed(self, address: str, token: str) -> None:
        """Count a wrong token from ``address``."""
        now = self._clock()
        with self._lock:
            self._count(self._addresses, address, now)
            if (prefix := self._prefix(token)) is not None:
                self._count(self._prefixes, prefix, now)

    def _wait(self, table: OrderedDict[str, deque[float]], key: str, now: float) -> int:
        times = table.get(key)
        if times is None:
            return 0
        while times and times[0] <= now - self.window_seconds:
            times.popleft()
        if not times:
            del table[key]
            return 0
        if len(times) < self.failures:
            return 0
        return max(1, math.ceil(times[0] + self.window_seconds - now))

    def _count(self, table: OrderedDict[str, deque[float]], key: str, now: float) -> None:
        times = table.get(key)
        if times is None:
            times = table[key] = deque(maxlen=self.failures)
            while len(table) > self._keys:
                table.popitem(last=False)
        else:
            table.move_to_end(key)
        times.append(now)


def sign_in_limits(request: Request) -> SignInLimits:
    return request.app.state.console_sign_in_limits


def set_session_cookie(response: Response, request: Request, started: StartedSession) -> None:
    hours = _runtime(request).settings.console_session_hours
    response.set_cookie(
        SESSION_COOKIE,
        started.key,
        max_age=int(hours * 3600),
        expires=started.expires_at,
        # The event stream (/api/v1/.../events) takes the session too.
        path="/",
        **_cookie_flags(request),
    )
    response.delete_cookie(SIGN_IN_COOKIE, path=PREFIX)


def sign_out(request: Request, response: Response) -> None:
    key = request.cookies.get(SESSION_COOKIE)
    if key:
        runtime = _runtime(request)
        with runtime.store_errors(), session_scope(runtime.sessions) as session:
            end_session(session=session, key=key)
    response.delete_cookie(SESSION_COOKIE, path="/", **_cookie_flags(request))


def _cookie_flags(request: Request) -> dict:
    return {
        "httponly": True,
        "samesite": "strict",
        # Served over https, or behind a proxy that says so: uvicorn takes
        # X-Forwarded-Proto from the addresses in FORWARDED_ALLOW_IPS.
        "secure": request.url.scheme == "https",
    }


def sign_in_path(next_path: str | None = None) -> str:
    if not next_path or not next_path.startswith(PREFIX):
        return f"{PREFIX}/sign-in"
    return f"{PREFIX}/sign-in?next={quote(next_path, safe='')}"


def safe_next(next_path: str | None) -> str:
    """Where to go after signing in: a console path, never another site."""
    if next_path and next_path.startswith(PREFIX + "/") and not next_path.startswith("//"):
        return next_path
    return PREFIX + "/"
