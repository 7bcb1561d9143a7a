"""GitHub's webhook delivery log: list what GitHub sent, fetch one request, ask for a redelivery.

GitHub never redelivers a failed delivery on its own. It keeps every attempt
for 3 days (7 on GitHub Enterprise Server) and serves them through its REST
API; :class:`DeliveryLog` reads that log for one webhook, and
:func:`missed_creates` picks out of a listing the deliveries the inbox never
stored.

Provider documentation this module follows:

- The deliveries of a repository, organization and app webhook (list, get,
  redeliver): https://docs.github.com/en/rest/repos/webhooks#list-deliveries-for-a-repository-webhook,
  https://docs.github.com/en/rest/orgs/webhooks#list-deliveries-for-an-organization-webhook and
  https://docs.github.com/en/rest/apps/webhooks#list-deliveries-for-an-app-webhook (a JWT)
- Pagination (``per_page``, ``cursor``, the ``Link`` header):
  https://docs.github.com/en/rest/using-the-rest-api/using-pagination-in-the-rest-api
- Rate limits (``Retry-After``, ``X-RateLimit-Remaining``/``-Reset``, "wait at
  least one minute" when neither is said):
  https://docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api
- GitHub Enterprise Server: the same API under ``https://HOST/api/v3``.
- A GitHub App's JWT (RS256; ``iat`` 60 s back for clock drift, ``exp`` at most
  10 minutes ahead, ``iss`` the app id):
  https://docs.github.com/en/apps/creating-github-apps/authenticating-with-a-github-app/generating-a-json-web-token-jwt-for-a-github-app

Every request carries the credential -- a token, or a GitHub App's JWT
(:class:`AppJwt`, for ``app/hook``); neither it nor the App's private key is
ever in a message. Retries, rate-limit waits (one budget per client) and the
errors are ``worker.catchup.api``'s, shared with the Jira search.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Container, Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
import jwt

from models.catchup import rsa_private_key
from models.providers import PROVIDERS
from worker.catchup.api import (  # noqa: F401  (re-exported: the errors a log read raises)
    ApiClient,
    ApiUnavailable,
    BadCredentials,
    CatchUpError,
    Forbidden,
    RateLimited,
    UnexpectedResponse,
    aware,
    base_url,
)

log = logging.getLogger(__name__)

API_VERSION = "2022-11-28"
USER_AGENT = "taskhook-catch-up"
#: GitHub's maximum: the fewest requests for a log.
PAGE_SIZE = 100

#: Where a hook's deliveries live below the API's base URL.
_HOOK_PATH = re.compile(r"repos/[^/\s]+/[^/\s]+/hooks/\d+|orgs/[^/\s]+/hooks/\d+|app/hook")
#: Visible ASCII: anything else would be refused by the HTTP library in an
#: error that quotes the header, token included.
_TOKEN = re.compile(r"[\x21-\x7e]+")
_APP_ID = re.compile(r"[0-9]{1,20}")

#: GitHub's advice: an ``iat`` 60 s in the past, in case its clock is behind ours.
_JWT_CLOCK_DRIFT_SECONDS = 60
#: GitHub refuses an ``exp`` more than 10 minutes ahead; 9 leaves room for drift.
_JWT_LIFETIME_SECONDS = 9 * 60
#: A JWT this close to its ``exp`` is replaced: a request in flight, or one
#: retried after a backoff, must not arrive with an expired one.
_JWT_REFRESH_MARGIN_SECONDS = 60

_T = TypeVar("_T")
_GITHUB = PROVIDERS["github"]


@dataclass(frozen=True)
class LoggedAttempt:
    """One attempt in GitHub's delivery log. A redelivery is a new attempt (its own
    ``id``) of the same delivery: the same ``guid``, the ``X-GitHub-Delivery`` header."""

    id: int
    guid: str
    delivered_at: datetime  # aware, UTC
    redelivery: bool
    #: What the receiver answered; GitHub logs 0 when it got no HTTP answer at all.
    status_code: int
    event: str
    action: str | None

    @property
    def event_name(self) -> str:
        """The event as the GitHub provider names it (``issues.opened``, ``ping``):
        the names a source's ``create_events`` lists."""
        # Read as the ingress reads a delivery's event, so the two cannot disagree.
        payload = {} if self.action is None else {"action": self.action}
        return _GITHUB.event_of({_GITHUB.event_header: self.event}, payload) or self.event

    @property
    def succeeded(self) -> bool:
        """The receiver answered 2xx."""
        return 200 <= self.status_code < 300


@dataclass(frozen=True)
class LoggedRequest:
    """What GitHub says it sent in one attempt: the headers and the decoded JSON body."""

    attempt: LoggedAttempt
    headers: dict[str, str]
    payload: dict[str, Any]


class AttemptNotFound(CatchUpError):
    """GitHub knows no such attempt: it left the log (3 days, 7 on Enterprise Server)."""


class AppJwt:
    """A GitHub App's credential for ``app/hook``: ``authorization`` of a
    :class:`DeliveryLog`. Each call gives the ``Authorization`` header's value, a
    JWT signed with the App's private key, minted again once the last one is
    within a minute of its ``exp``. Neither the key nor a JWT is in its repr."""

    def __init__(
        self, *, app_id: str, private_key: str, clock: Callable[[], float] = time.time
    ) -> None:
        if not _APP_ID.fullmatch(app_id):
            raise ValueError("a GitHub App id is a number")
        self._app_id = app_id
        self._key = rsa_private_key(private_key)  # parsed once: every JWT is signed with it
        self._clock = clock
        self._jwt: str | None = None
        self._expires_at = 0.0

    def __repr__(self) -> str:
        return f"<AppJwt app {self._app_id}>"

    def __call__(self) -> str:
        now = self._clock()
        if self._jwt is None or now >= self._expires_at - _JWT_REFRESH_MARGIN_SECONDS:
            self._jwt, self._expires_at = self._minted(int(now))
        return f"Bearer {self._jwt}"

    def _minted(self, now: int) -> tuple[str, float]:
        expires_at = now + _JWT_LIFETIME_SECONDS
        claims = {"iat": now - _JWT_CLOCK_DRIFT_SECONDS, "exp": expires_at, "iss": self._app_id}
        return jwt.encode(claims, self._key, algorithm="RS256"), float(expires_at)


class GitHubApi(ApiClient):
    """GitHub's REST API under ``api_base_url``: ``https://api.github.com``, or
    ``https://HOST/api/v3`` on Enterprise Server. The credential is either
    ``token`` or ``authorization``, a function giving the ``Authorization``
    header's value for each request (an :class:`AppJwt`). Retries, waits and
    errors are :class:`worker.catchup.api.ApiClient`'s."""

    service = "GitHub"
    #: What a 403 that is no rate limit means for this client's requests.
    permission_hint = "the token lacks the permission"

    def __init__(
        self,
        *,
        api_base_url: str,
        token: str | None = None,
        authorization: Callable[[], str] | None = None,
        **options: Any,
    ) -> None:
        if (token is None) == (authorization is None):
            raise ValueError(f"give {type(self).__name__} either a token or an authorization")
        if token is not None and not _TOKEN.fullmatch(token):
            raise ValueError("the GitHub token must be non-empty visible ASCII")
        super().__init__(
            base_url=base_url(
                api_base_url,
                "api_base_url is https://api.github.com, "
                "or https://HOST/api/v3 on Enterprise Server",
            ),
            authorization=authorization or (lambda: f"Bearer {token}"),
            credential_name="the token" if token is not None else "the credentials",
            secrets=[token] if token else [],
            headers={
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "User-Agent": USER_AGENT,
            },
            **options,
        )

    def _forbidden(self, what: str, said: str) -> str:
        return f"GitHub refused {what} (403 {said}): {self.permission_hint}"


class DeliveryLog(GitHubApi):
    """The delivery log of one webhook. ``hook_path`` is the hook below the API's base
    URL: ``repos/acme/widgets/hooks/123``, ``orgs/acme/hooks/123`` or ``app/hook``."""

    permission_hint = (
        "the token may not read this hook's deliveries (it needs the 'Webhooks' "
        "permission of the repository or organization, admin:repo_hook or "
        "admin:org_hook on a classic token, or the App's JWT for app/hook)"
    )

    def __init__(self, *, hook_path: str, **client: Any) -> None:
        self._hook = _hook_path(hook_path)
        super().__init__(**client)

    def __repr__(self) -> str:
        return f"<DeliveryLog {self._base}/{self._hook}>"

    def attempts(self, *, since: datetime) -> Iterator[LoggedAttempt]:
        """Newest first, page after page (``per_page=100``, the cursor from the ``Link``
        header), stopping at the first attempt delivered before ``since`` (aware)."""
        # Checked now, not at the first next(): the generator below starts late.
        return self._attempts_since(aware(since, "since"))

    def _attempts_since(self, since: datetime) -> Iterator[LoggedAttempt]:
        path, cursor, cursors_seen = f"{self._hook}/deliveries", None, set()
        while True:
            response = self._call("GET", path, params=_page_params(cursor), not_found=_hook_hidden)
            for attempt in _page_attempts(self._json(response, "a delivery log page")):
                if attempt.delivered_at < since:
                    return
                yield attempt
            cursor = _next_cursor(response)
            if cursor is None:
                return
            if cursor in cursors_seen:  # a log that pages in a circle must not loop forever
                raise UnexpectedResponse("GitHub's delivery log gave the same page cursor twice")
            cursors_seen.add(cursor)

    def request_of(self, attempt_id: int) -> LoggedRequest:
        """The headers and JSON body GitHub sent in attempt ``attempt_id``."""
        path = self._attempt_path(attempt_id)
        response = self._call("GET", path, not_found=_attempt_gone(attempt_id))
        return _logged_request(self._json(response, f"GET {path}"), attempt_id)

    def redeliver(self, attempt_id: int) -> None:
        """Ask GitHub to send attempt ``attempt_id``'s delivery again (under its guid).

        Retried like any request: if GitHub took a POST whose answer was lost, the
        second redelivery carries the same guid, which the inbox stores once."""
        self._call(
            "POST",
            f"{self._attempt_path(attempt_id)}/attempts",
            not_found=_attempt_gone(attempt_id),
        )

    def _attempt_path(self, attempt_id: int) -> str:
        # bool is an int; an attempt id is a positive int, never text spliced into a path.
        if type(attempt_id) is not int or attempt_id <= 0:
            raise ValueError(f"an attempt id is a positive integer, not {attempt_id!r}")
        return f"{self._hook}/deliveries/{attempt_id}"


def missed_creates(
    attempts: Iterable[LoggedAttempt],
    *,
    known_guids: AbstractSet[str] | Callable[[list[str]], AbstractSet[str]],
    create_events: Container[str] | Callable[[str, str | None], bool],
) -> list[LoggedAttempt]:
    """For each create delivery the inbox does not hold, the one attempt to fetch;
    the deliveries in the order GitHub first sent them, so tasks come in that order.

    A delivery is its guid: every attempt of it, first or redelivery, carries the
    same guid and the same request. ``create_events`` are the event names a
    source lists (``issues.opened``), or a function of the log's ``event`` and
    ``action``; ``known_guids`` is the inbox's answer, a set or a function from
    the candidate guids to those of them it holds (asked once). The rule:

    - a create delivery whose guid the inbox does not hold is recovered, whatever
      its attempts' status: a 2xx for a guid the inbox lacks means the row was
      lost or something else answered, and the create is missing either way;
    - a guid the inbox holds is never recovered, whatever its attempts or its
      row's state: the inbox has the delivery, and replaying a stored one is the
      operator's call (``models.inbox.replay``), not the catch-up's;
    - of a guid's attempts, the newest is the one to fetch: they all carry the same
      request, and the newest is the last to leave GitHub's log.
    """
    by_guid: dict[str, list[LoggedAttempt]] = {}
    for attempt in attempts:
        by_guid.setdefault(attempt.guid, []).append(attempt)
    creates = {
        guid: group for guid, group in by_guid.items() if _creates(_newest(group), create_events)
    }
    held = _held(known_guids, list(creates))
    missed = [group for guid, group in creates.items() if guid not in held]
    missed.sort(key=lambda group: _sent_order(min(group, key=_sent_order)))
    return [_newest(group) for group in missed]


def _creates(
    attempt: LoggedAttempt, create_events: Container[str] | Callable[[str, str | None], bool]
) -> bool:
    if callable(create_events):
        return create_events(attempt.event, attempt.action)
    return attempt.event_name in create_events


def _newest(group: list[LoggedAttempt]) -> LoggedAttempt:
    return max(group, key=_sent_order)


def _sent_order(attempt: LoggedAttempt) -> tuple[datetime, int]:
    # Attempt ids grow with time: they break a tie within one second.
    return attempt.delivered_at, attempt.id


def _held(
    known_guids: AbstractSet[str] | Callable[[list[str]], AbstractSet[str]], guids: list[str]
) -> AbstractSet[str]:
    if isinstance(known_guids, AbstractSet):
        return known_guids
    return known_guids(guids) if guids else set()


def _hook_path(hook_path: str) -> str:
    path = hook_path.strip().strip("/")
    if not _HOOK_PATH.fullmatch(path):
        raise ValueError(
            "hook_path is repos/OWNER/REPO/hooks/ID, orgs/ORG/hooks/ID or app/hook, "
            f"not {hook_path!r}"
        )
    return path


def _hook_hidden(what: str) -> CatchUpError:
    return BadCredentials(
        f"GitHub answered 404 to {what}: no such hook, or the token may not see it "
        "(GitHub answers 404, not 403, to a token without access)"
    )


def _attempt_gone(attempt_id: int) -> Callable[[str], CatchUpError]:
    def gone(what: str) -> CatchUpError:
        return AttemptNotFound(
            f"GitHub answered 404 to {what}: attempt {attempt_id} is no longer in the "
            "delivery log (kept 3 days, 7 on Enterprise Server), or the token may not see it"
        )

    return gone


def _page_params(cursor: str | None) -> dict[str, str | int]:
    return {"per_page": PAGE_SIZE} if cursor is None else {"per_page": PAGE_SIZE, "cursor": cursor}


def _next_cursor(response: httpx.Response) -> str | None:
    # Only the cursor is taken from the Link: the next page is asked of the same
    # endpoint, so the token never follows a link to another host (an Enterprise
    # Server behind a proxy may name its own host there).
    link = response.links.get("next")
    if link is None:
        return None
    try:
        cursor = httpx.URL(link.get("url", "")).params.get("cursor")
    except httpx.InvalidURL:
        cursor = None
    if not cursor:
        raise UnexpectedResponse("GitHub's Link header names a next page without a cursor")
    return cursor


def _page_attempts(rows: Any) -> list[LoggedAttempt]:
    if not isinstance(rows, list):
        raise UnexpectedResponse("GitHub's delivery log page is not a list")
    return [_attempt_from(row) for row in rows]


def _attempt_from(row: Any) -> LoggedAttempt:
    if not isinstance(row, dict):
        raise UnexpectedResponse("GitHub's delivery log holds an attempt that is not an object")
    return LoggedAttempt(
        id=_field(row, "id", int),
        guid=_field(row, "guid", str),
        delivered_at=_timestamp(row),
        redelivery=_field(row, "redelivery", bool),
        # GitHub logs 0 when no HTTP answer came; null is read the same way.
        status_code=0 if row.get("status_code") is None else _field(row, "status_code", int),
        event=_field(row, "event", str),
        action=None if row.get("action") is None else _field(row, "action", str),
    )


def _logged_request(body: Any, attempt_id: int) -> LoggedRequest:
    attempt = _attempt_from(body)
    request = body.get("request")
    headers = request.get("headers") if isinstance(request, dict) else None
    payload = request.get("payload") if isinstance(request, dict) else None
    if not isinstance(headers, dict) or not isinstance(payload, dict):
        raise UnexpectedResponse(
            f"GitHub's log holds no JSON request (headers and payload) for attempt {attempt_id}"
        )
    return LoggedRequest(
        attempt=attempt,
        headers={str(name): str(value) for name, value in headers.items()},
        payload=payload,
    )


def _field(row: dict[str, Any], name: str, kind: type[_T]) -> _T:
    value = row.get(name)
    # bool is an int: an id or a status code of true is not one.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise UnexpectedResponse(f"GitHub's delivery log holds an attempt without a valid {name!r}")
    if kind is str and not value:
        raise UnexpectedResponse(f"GitHub's delivery log holds an attempt with an empty {name!r}")
    return value


def _timestamp(row: dict[str, Any]) -> datetime:
    try:
        moment = datetime.fromisoformat(_field(row, "delivered_at", str))
    except ValueError as error:
        raise UnexpectedResponse(
            "GitHub's delivery log holds an attempt without a valid 'delivered_at'"
        ) from error
    # GitHub writes UTC with a Z; a time without an offset is read as UTC too.
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
