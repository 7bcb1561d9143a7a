"""The HTTP client every catch-up reads a provider's API with: bounded retries,
rate-limit waits, and errors that never hold a credential.

GitHub's delivery log and issue listing (``worker.catchup.github_log``,
``worker.catchup.github_issues``) and Jira's search
(``worker.catchup.jira_search``) are :class:`ApiClient` subclasses: they say
what their requests mean and how their provider words a refusal; how a
request is sent, retried and waited for is written here once.

- A request is sent at most ``1 + retries`` times: a 5xx or a connection that
  fails is retried after a backoff (0.5 s, doubled, at most 8 s).
- A rate-limited answer (403 or 429 with ``Retry-After``, or
  ``X-RateLimit-Remaining: 0`` and ``X-RateLimit-Reset``; a minute when neither
  is said, as GitHub advises) is waited out -- but rate-limit waits share one
  budget per client (``max_wait_seconds``), so one run never waits longer than
  that in all, and then stops with :class:`RateLimited` saying until when.
  Providers documenting this: GitHub,
  https://docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api;
  Jira Cloud, https://developer.atlassian.com/cloud/jira/platform/rate-limiting/.
- Every request carries the credential; nothing this module raises, logs or
  prints does, and text the provider sends back is scrubbed of it before it
  reaches a message: whole, and any run of 8 or more of its characters (a
  provider may echo part of it), before the text is cut to a quotable length
  -- so a cut never leaves a piece the scrubbing would not have recognized.
"""

from __future__ import annotations

import email.utils
import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Self

import httpx

log = logging.getLogger(__name__)
# httpx logs each request's URL (INFO) and httpcore each answer's raw headers
# (DEBUG), unscrubbed: a provider's cursor, Location or Link may echo the
# credential, and a process run at DEBUG would print it. This client logs its
# own lines, scrubbed; theirs stay below WARNING (tests/e2e/test_canaries.py).
for _library in ("httpx", "httpcore"):
    logging.getLogger(_library).setLevel(logging.WARNING)

_FIRST_BACKOFF_SECONDS = 0.5  # doubled on each retry
_MAX_BACKOFF_SECONDS = 8.0
#: GitHub's advice when a rate-limited answer does not say how long to wait.
_UNSAID_RATE_LIMIT_WAIT = 60.0
#: X-RateLimit-Reset is in whole seconds: one more, so the window has reset on
#: the provider's clock too and the retry is not spent on a second refusal.
_RESET_MARGIN_SECONDS = 1.0
#: Rate-limit windows last an hour; a longer figure is clamped so it stays a date.
_LONGEST_RATE_LIMIT_WAIT = 86_400.0
#: What of the provider's own message an error quotes: enough to read, one line.
_MAX_MESSAGE_CHARS = 200
#: What stands where a credential, or a piece of one, was.
SCRUBBED = "[credential]"
#: The shortest run of a credential's characters scrubbed out of a message that
#: does not hold it whole: shorter runs are no help to a guesser.
_SHORTEST_PIECE = 8
#: Visible ASCII, at most one space (``Bearer x``, ``Basic x``): anything else
#: would be refused by the HTTP library in an error that quotes the header.
_HEADER_VALUE = re.compile(r"[\x21-\x7e]+(?: [\x21-\x7e]+)?")


class CatchUpError(Exception):
    """The provider's API could not be read. The message is one line and never
    holds the credential."""


class BadCredentials(CatchUpError):
    """The provider refused the credential (401), or answered 404 for the thing
    itself, which is how GitHub answers a token that may not see it."""


class Forbidden(BadCredentials):
    """A 403 that is not a rate limit: the credential is valid but lacks the
    permission. A :class:`BadCredentials` because the fix is the same: another one."""


class RateLimited(CatchUpError):
    """The rate limit holds longer than this client may still wait (its wait
    budget or its tries are spent); ``retry_at`` is when the provider said it lifts."""

    def __init__(self, message: str, *, retry_at: datetime) -> None:
        super().__init__(message)
        self.retry_at = retry_at


class ApiUnavailable(CatchUpError):
    """The provider answered 5xx, or could not be reached, on every try."""


class UnexpectedResponse(CatchUpError):
    """The provider answered something this client has no rule for: another
    status, or a body that is not what the API documents."""


NotFound = Callable[[str], CatchUpError]


class ApiClient:
    """One provider API under ``base_url``, read with a credential:
    ``authorization`` gives the ``Authorization`` header's value for each
    request (asked each time: an App's JWT expires within minutes).
    ``secrets`` are scrubbed from every message besides the header's own value.

    Subclasses set ``service`` (the provider's name in messages) and may word
    a refusal their own way (:meth:`_forbidden`, :meth:`_unauthorized`)."""

    service = "the API"

    def __init__(
        self,
        *,
        base_url: str,
        authorization: Callable[[], str],
        credential_name: str = "the token",
        secrets: Iterable[str] = (),
        headers: dict[str, str] | None = None,
        timeout: float = 10.0,
        retries: int = 3,
        max_wait_seconds: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if retries < 0 or max_wait_seconds < 0:
            raise ValueError("retries and max_wait_seconds must not be negative")
        self._base = base_url
        self._authorization = authorization
        self._credential_name = credential_name
        self._secrets = {secret for secret in secrets if secret}
        # The last credential sent, kept only to scrub it out of messages.
        self._credential = ""
        self._retries = retries
        self._wait_budget = max_wait_seconds
        self._waited = 0.0
        self._sleep = sleep
        self._clock = clock
        self._client = httpx.Client(
            headers=headers or {},
            timeout=timeout,
            transport=transport,
            # A redirect would turn a POST into a GET, and could carry the
            # credential to another host: an answer to change the URL is clearer.
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._base}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        not_found: NotFound,
        params: dict[str, str | int] | None = None,
    ) -> httpx.Response:
        """The provider's 2xx answer, after the retries and rate-limit waits
        this client allows."""
        what = f"{method} {path}"
        for tries in range(1, self._retries + 2):
            out_of_tries = tries > self._retries
            try:
                response = self._client.request(
                    method,
                    f"{self._base}/{path}",
                    params=params,
                    headers={"Authorization": self._authorization_header()},
                )
            except httpx.TransportError as error:
                reason = self._scrubbed(f"{type(error).__name__}: {error}")
                if out_of_tries:
                    raise ApiUnavailable(
                        f"{self.service} unreachable for {what} after {_tries(tries)} ({reason})"
                    ) from error
                self._back_off(tries, what, reason)
                continue
            if response.is_success:
                return response
            if response.is_server_error:
                if out_of_tries:
                    raise ApiUnavailable(
                        f"{self.service} answered {response.status_code} to {what} "
                        f"on each of {_tries(tries)}"
                    )
                self._back_off(tries, what, f"HTTP {response.status_code}")
                continue
            now = self._clock()
            wait = rate_limit_wait(response, now=now)
            if wait is None:
                raise self._refusal(response, what, not_found)
            self._wait_out_rate_limit(wait, what, now=now, tries=tries)
        raise AssertionError("unreachable: the last try returns or raises")

    def _json(self, response: httpx.Response, what: str) -> Any:
        try:
            return response.json()
        except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
            raise UnexpectedResponse(f"{self.service}'s answer to {what} is not JSON") from error

    def _authorization_header(self) -> str:
        value = self._authorization()
        if not _HEADER_VALUE.fullmatch(value):
            # Not quoted: the HTTP library's own refusal would quote the header.
            raise ValueError("the Authorization value must be visible ASCII, one space at most")
        self._credential = value.rpartition(" ")[2]
        return value

    def _back_off(self, tries: int, what: str, reason: str) -> None:
        delay = min(_FIRST_BACKOFF_SECONDS * 2 ** (tries - 1), _MAX_BACKOFF_SECONDS)
        log.warning("%s from %s on %s; retrying in %.1fs", reason, self.service, what, delay)
        self._sleep(delay)

    def _wait_out_rate_limit(self, wait: float, what: str, *, now: float, tries: int) -> None:
        retry_at = datetime.fromtimestamp(now + wait, UTC)
        left = self._wait_budget - self._waited
        if tries > self._retries or wait > left:
            why = (
                f"still limited after {_tries(tries)}"
                if tries > self._retries
                else f"waiting {wait:.0f}s would exceed the {left:.0f}s left of the wait budget"
            )
            raise RateLimited(
                f"{self.service}'s rate limit holds {what} until {iso(retry_at)} ({why})",
                retry_at=retry_at,
            )
        log.warning(
            "%s's rate limit on %s: waiting %.0fs, until %s",
            self.service,
            what,
            wait,
            iso(retry_at),
        )
        self._waited += wait
        self._sleep(wait)

    def _refusal(self, response: httpx.Response, what: str, not_found: NotFound) -> CatchUpError:
        said = self._quoted(response)
        status = response.status_code
        if status == 401:
            return BadCredentials(self._unauthorized(what, said))
        if status == 403:
            return Forbidden(self._forbidden(what, said))
        if status == 404:
            return not_found(what)
        if response.is_redirect:
            return UnexpectedResponse(
                f"{self.service} answered {status} to {what}: it moved to "
                f"{self._scrubbed(_moved_to(response))}; update the URL"
            )
        return UnexpectedResponse(f"{self.service} answered {status} to {what}: {said}")

    def _unauthorized(self, what: str, said: str) -> str:
        return (
            f"{self.service} rejected {self._credential_name} for {what} (401 {said}): "
            "it is wrong, expired or revoked"
        )

    def _forbidden(self, what: str, said: str) -> str:
        return f"{self.service} refused {what} (403 {said}): the credential lacks the permission"

    def _quoted(self, response: httpx.Response) -> str:
        """What the provider said, fit to quote: scrubbed first, then cut."""
        return shortened(
            scrubbed(
                service_message(response),
                (self._credential, *self._secrets),
                within=_MAX_MESSAGE_CHARS,
            )
        )

    def _scrubbed(self, text: str) -> str:
        return scrubbed(text, (self._credential, *self._secrets))


def scrubbed(text: str, secrets: Iterable[str], *, within: int | None = None) -> str:
    """``text`` without any of ``secrets``: each whole, then every run of at
    least 8 characters found in one of them (a prefix a provider echoed, a
    piece of one cut elsewhere), each run in :data:`SCRUBBED`'s place.
    ``within``: only that many characters are wanted (a cut follows), so the
    scan ends once there are more -- a provider's long message costs no more."""
    secrets = sorted({secret for secret in secrets if secret}, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, SCRUBBED)
    size = _SHORTEST_PIECE
    pieces = {secret[at : at + size] for secret in secrets for at in range(len(secret) - size + 1)}
    if not pieces:
        return text
    kept: list[str] = []
    length = hidden_until = 0
    for at, char in enumerate(text):
        if within is not None and length > within:
            break
        if text[at : at + size] in pieces:
            if at >= hidden_until:
                kept.append(SCRUBBED)
                length += len(SCRUBBED)
            hidden_until = at + size
        elif at >= hidden_until:
            kept.append(char)
            length += 1
    return "".join(kept)


def shortened(line: str) -> str:
    """``line`` cut to what an error quotes of a provider's message."""
    return line if len(line) <= _MAX_MESSAGE_CHARS else line[: _MAX_MESSAGE_CHARS - 1] + "…"


def rate_limit_wait(response: httpx.Response, *, now: float) -> float | None:
    """How long the provider asks to wait before the retry, or None when this
    is no rate limit. GitHub sends X-RateLimit-* on every answer: only a
    remaining of 0 is a limit."""
    if response.status_code not in (403, 429):
        return None
    headers = response.headers
    if "retry-after" in headers:
        return _clamped(_retry_after_seconds(headers["retry-after"], now=now))
    if headers.get("x-ratelimit-remaining") == "0":
        return _clamped(_seconds_until_reset(headers.get("x-ratelimit-reset"), now=now))
    # A secondary rate limit may say nothing but its message.
    if response.status_code == 429 or "rate limit" in service_message(response).lower():
        return _UNSAID_RATE_LIMIT_WAIT
    return None


def service_message(response: httpx.Response) -> str:
    """What the provider said, on one line, uncut (:meth:`ApiClient._quoted`
    scrubs it, then cuts it): GitHub's ``message``, Jira's ``errorMessages``
    and ``errors``; the reason phrase when there is none."""
    try:
        body = response.json()
    except ValueError:
        body = None
    said = _said(body) if isinstance(body, dict) else ""
    if not said.strip():
        said = response.reason_phrase or "no message"
    return " ".join(said.split())


def _said(body: dict[str, Any]) -> str:
    message = body.get("message")
    if isinstance(message, str):
        return message
    parts = [part for part in body.get("errorMessages") or () if isinstance(part, str)]
    errors = body.get("errors")
    if isinstance(errors, dict):
        parts += [f"{name}: {text}" for name, text in errors.items() if isinstance(text, str)]
    return "; ".join(parts)


def _retry_after_seconds(value: str, *, now: float) -> float:
    try:
        return float(value)
    except ValueError:
        pass
    try:  # the HTTP-date form, which HTTP allows
        return email.utils.parsedate_to_datetime(value).timestamp() - now
    except (TypeError, ValueError, IndexError):
        return _UNSAID_RATE_LIMIT_WAIT


def _seconds_until_reset(value: str | None, *, now: float) -> float:
    try:
        reset = int(value or "")
    except ValueError:
        return _UNSAID_RATE_LIMIT_WAIT
    return reset - now + _RESET_MARGIN_SECONDS


def _clamped(wait: float) -> float:
    if not math.isfinite(wait):
        return _UNSAID_RATE_LIMIT_WAIT
    return min(max(wait, 0.0), _LONGEST_RATE_LIMIT_WAIT)


def _moved_to(response: httpx.Response) -> str:
    # The path alone: a redirect's query is no business of an error message.
    try:
        return httpx.URL(response.headers.get("location", "")).path or "an unnamed place"
    except httpx.InvalidURL:
        return "an unreadable place"


def _tries(count: int) -> str:
    return "1 try" if count == 1 else f"{count} tries"


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def aware(moment: datetime, name: str) -> datetime:
    """``moment`` in UTC; a ValueError for a naive one (which zone would it be?)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime")
    return moment.astimezone(UTC)


def base_url(url: str, help: str) -> str:
    """``url`` without a trailing slash, when it is an http(s) URL with a host
    and no query; else a ValueError saying ``help``."""
    base = url.strip().rstrip("/")
    parsed = httpx.URL(base)
    if parsed.scheme not in ("https", "http") or not parsed.host or parsed.query or parsed.fragment:
        raise ValueError(help)
    return base
