"""GitLab's REST API as a catch-up reads it: a hook's recorded events, and the
issues and merge requests created since a time, newest first.

GitLab retries a failing webhook a few times, then disables it for a while
(longer after each failure) and sends nothing at all meanwhile: its log of
recorded events holds what it tried, not what it never sent. So a GitLab
catch-up reads both: the hook's events, for the bodies GitLab did send, under
their own delivery ids; and a scan of the issues and merge requests created
since, for everything else.

Provider documentation this module follows:

- A project's and a group's webhook events (GitLab 17.3 and later; the last 7
  days, newest first, ``per_page`` at most 20; each with ``request_headers``
  and ``request_data``, the body sent, with e-mail addresses redacted and
  ``{"oversize": true}`` in place of a body too large to keep):
  https://docs.gitlab.com/api/project_webhooks/#get-a-list-of-project-webhook-events and
  https://docs.gitlab.com/api/group_webhooks/#get-group-hook-events
- A project's and a group's webhooks, to find the source's hook by its URL:
  https://docs.gitlab.com/api/project_webhooks/#list-webhooks-for-a-project
- Issues and merge requests of a project or a group (``created_after``,
  ``order_by=created_at``, ``sort=desc``, ``scope=all``, ``state=all``; the
  item's project is named in ``references.full``):
  https://docs.gitlab.com/api/issues/#list-project-issues and
  https://docs.gitlab.com/api/merge_requests/#list-project-merge-requests
- Pagination (``page``, ``per_page`` up to 100, ``X-Next-Page`` empty on the
  last page): https://docs.gitlab.com/api/rest/#offset-based-pagination
- A personal, project or group access token, as ``Authorization: Bearer``:
  https://docs.gitlab.com/api/rest/authentication/
- Rate limits (429 with ``Retry-After``):
  https://docs.gitlab.com/security/rate_limits/

Retries, rate-limit waits and errors are ``worker.catchup.api``'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

from worker.catchup.api import (
    ApiClient,
    BadCredentials,
    CatchUpError,
    UnexpectedResponse,
    aware,
    base_url,
    iso,
)

#: GitLab's largest page for issues and merge requests.
PAGE_SIZE = 100
#: The largest page of a hook's events (``values: 1..20`` in GitLab's API).
EVENTS_PAGE_SIZE = 20
#: Where the webhook routes of GitLab sources live; a hook whose URL ends with
#: this and the source's name is the source's hook.
HOOK_PATH = "/webhooks/gitlab/"
#: What GitLab keeps in ``request_data`` for a body too large to log.
OVERSIZE = {"oversize": True}
#: The webhook each kind of item announces itself with when it opens.
ISSUE_HOOK, CONFIDENTIAL_ISSUE_HOOK = "Issue Hook", "Confidential Issue Hook"
MERGE_REQUEST_HOOK = "Merge Request Hook"


@dataclass(frozen=True)
class HookEvent:
    """One request GitLab recorded for a hook: what it sent, and what it got."""

    id: int
    #: None on a GitLab that does not say (its entity gained ``created_at`` later).
    created_at: datetime | None
    headers: dict[str, str]
    #: The body sent; None when GitLab kept none (too large: ``oversize``).
    payload: dict[str, Any] | None
    #: What the receiver answered: ``"200"``, ``"500"``, or ``"internal error"``
    #: when no HTTP answer came.
    response_status: str


@dataclass(frozen=True)
class GitLabItem:
    """An issue or a merge request as GitLab lists it."""

    #: The webhook its opening sends: ``Issue Hook``, ``Confidential Issue
    #: Hook`` or ``Merge Request Hook``.
    hook: str
    #: Its project's full path, from ``references.full``.
    project_path: str
    iid: int
    created_at: datetime  # aware, UTC
    item: dict[str, Any]


class GitLabApi(ApiClient):
    """GitLab's REST API under ``api_base_url`` (``https://HOST/api/v4``),
    read with an access token."""

    service = "GitLab"

    def __init__(self, *, api_base_url: str, token: str, **options: Any) -> None:
        if not token or any(c.isspace() for c in token):
            raise ValueError("the GitLab token must be one word, without spaces")
        super().__init__(
            base_url=base_url(api_base_url, "api_base_url is https://HOST/api/v4"),
            authorization=lambda: f"Bearer {token}",
            secrets=[token],
            headers={"Accept": "application/json"},
            **options,
        )

    def hook_of(self, owner: str, slug: str) -> str | None:
        """The id of ``owner``'s hook that posts to source ``slug``'s route
        (its URL ends with ``/webhooks/gitlab/SLUG``), or None when there is
        no such hook or more than one."""
        path = f"{_owner_path(owner)}/hooks"
        hooks = [
            hook
            for hook in self._pages(path, {"per_page": PAGE_SIZE}, _owner_hidden(owner))
            if isinstance(hook, dict)
            and isinstance(hook.get("url"), str)
            and httpx.URL(hook["url"]).path.rstrip("/").endswith(HOOK_PATH + slug)
        ]
        if len(hooks) != 1 or type(hooks[0].get("id")) is not int:
            return None
        return str(hooks[0]["id"])

    def hook_events(self, owner: str, hook_id: str, *, since: datetime) -> Iterator[HookEvent]:
        """The hook's recorded events, newest first, stopping at the first one
        created before ``since`` (aware); all of the last 7 days when GitLab
        does not say when each was."""
        return self._hook_events(owner, hook_id, aware(since, "since"))

    def _hook_events(self, owner: str, hook_id: str, since: datetime) -> Iterator[HookEvent]:
        if not hook_id.isdigit():
            raise ValueError(f"a hook id is a number, not {hook_id!r}")
        path = f"{_owner_path(owner)}/hooks/{hook_id}/events"
        for row in self._pages(path, {"per_page": EVENTS_PAGE_SIZE}, _no_events(owner, hook_id)):
            event = _hook_event(row)
            if event.created_at is not None and event.created_at < since:
                return
            yield event

    def created_since(self, owner: str, *, since: datetime) -> Iterator[GitLabItem]:
        """``owner``'s issues, then its merge requests, created at or after
        ``since`` (aware), each newest first."""
        return self._created_since(owner, aware(since, "since"))

    def _created_since(self, owner: str, since: datetime) -> Iterator[GitLabItem]:
        params: dict[str, str | int] = {
            "created_after": iso(since),
            "order_by": "created_at",
            "sort": "desc",
            "scope": "all",
            "state": "all",
            "per_page": PAGE_SIZE,
        }
        for kind in ("issues", "merge_requests"):
            path = f"{_owner_path(owner)}/{kind}"
            for row in self._pages(path, params, _owner_hidden(owner)):
                item = _listed(row, merge_request=kind == "merge_requests")
                if item.created_at < since:
                    break
                yield item

    def _pages(self, path: str, params: dict[str, str | int], not_found: Any) -> Iterator[Any]:
        """Every row of every page of ``path``, following ``X-Next-Page``."""
        pages_seen: set[str] = set()
        while True:
            response = self._call("GET", path, params=params, not_found=not_found)
            rows = self._json(response, f"GET {path}")
            if not isinstance(rows, list):
                raise UnexpectedResponse(f"GitLab's answer to GET {path} is not a list")
            yield from rows
            page = response.headers.get("x-next-page", "").strip()
            if not page:
                return
            if not page.isdigit() or page in pages_seen:
                raise UnexpectedResponse(f"GitLab's answer to GET {path} names no new next page")
            pages_seen.add(page)
            params = {**params, "page": page}

    def _forbidden(self, what: str, said: str) -> str:
        return (
            f"GitLab refused {what} (403 {said}): the token needs the read_api scope, and "
            "the Maintainer role (Owner for a group) to read the hook's events"
        )


def _owner_path(owner: str) -> str:
    # A project or group named by its path is one URL-encoded segment.
    kind, _, name = owner.partition("/")
    return f"{kind}/{quote(name, safe='')}"


def _hook_event(row: Any) -> HookEvent:
    if not isinstance(row, dict) or type(row.get("id")) is not int:
        raise UnexpectedResponse("GitLab's hook events hold one without an id")
    headers, data = row.get("request_headers"), row.get("request_data")
    if not isinstance(headers, dict) or not isinstance(data, dict):
        raise UnexpectedResponse(
            f"GitLab's hook event {row['id']} holds no request headers and data"
        )
    created = row.get("created_at")
    return HookEvent(
        id=row["id"],
        created_at=None if created is None else _moment(created, "a hook event"),
        headers={str(name): str(value) for name, value in headers.items()},
        payload=None if data == OVERSIZE else data,
        response_status=str(row.get("response_status")),
    )


def _listed(row: Any, *, merge_request: bool) -> GitLabItem:
    if not isinstance(row, dict):
        raise UnexpectedResponse("GitLab's listing holds an item that is not an object")
    iid, references = row.get("iid"), row.get("references")
    full = references.get("full") if isinstance(references, dict) else None
    marker = "!" if merge_request else "#"
    if type(iid) is not int or iid <= 0 or not isinstance(full, str) or marker not in full:
        raise UnexpectedResponse(
            "GitLab's listing holds an item without an iid or a full reference"
        )
    if merge_request:
        hook = MERGE_REQUEST_HOOK
    else:
        hook = CONFIDENTIAL_ISSUE_HOOK if row.get("confidential") is True else ISSUE_HOOK
    return GitLabItem(
        hook=hook,
        project_path=full.rpartition(marker)[0],
        iid=iid,
        created_at=_moment(row.get("created_at"), "an item"),
        item=row,
    )


def _moment(value: Any, what: str) -> datetime:
    if not isinstance(value, str):
        raise UnexpectedResponse(f"GitLab's answer holds {what} without a created_at")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as error:
        raise UnexpectedResponse(f"GitLab's answer holds {what} with an unreadable date") from error
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _owner_hidden(owner: str):
    def hidden(what: str) -> CatchUpError:
        return BadCredentials(
            f"GitLab answered 404 to {what}: no {owner.replace('s/', ' ', 1)}, or the "
            "token may not see it (GitLab answers 404, not 403, to a token without access)"
        )

    return hidden


def _no_events(owner: str, hook_id: str):
    def absent(what: str) -> CatchUpError:
        return BadCredentials(
            f"GitLab answered 404 to {what}: no hook {hook_id} on {owner}, the token may "
            "not see it, or this GitLab keeps no hook events (before 17.3)"
        )

    return absent
