"""Jira's issue search: the issues of a site created since a time, newest first.

Jira retries a failed webhook delivery a few times, then gives up, and keeps
no log of it for us to read. What it does keep is the issues: a search by
creation time finds every issue whose ``jira:issue_created`` we may have
missed.

Provider documentation this module follows:

- Jira Cloud, read with an account's email and an API token (HTTP Basic):
  ``GET /rest/api/3/search/jql`` (``jql``, ``fields``, ``maxResults``, and
  ``nextPageToken`` until ``isLast``):
  https://developer.atlassian.com/cloud/jira/platform/rest/v3/api-group-issue-search/#api-rest-api-3-search-jql-get
  and https://developer.atlassian.com/cloud/jira/platform/basic-auth-for-rest-apis/
- Jira Data Center, read with a personal access token (``Bearer``):
  ``GET /rest/api/2/search`` (``startAt``, ``maxResults``, ``total``):
  https://docs.atlassian.com/software/jira/docs/api/REST/9.12.0/#api/2/search-search
  and https://confluence.atlassian.com/enterprise/using-personal-access-tokens-1026032365.html
- JQL dates: an absolute date is read in the *searching user's* time zone, a
  relative one (``-90m``) is not -- so the search asks for a relative window,
  a few minutes wider than asked, and keeps what was created since by the
  ``created`` field, which carries its offset:
  https://support.atlassian.com/jira-software-cloud/docs/jql-fields/#Created
- Rate limits (429 with ``Retry-After``):
  https://developer.atlassian.com/cloud/jira/platform/rate-limiting/
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from worker.catchup.api import (
    ApiClient,
    BadCredentials,
    CatchUpError,
    NotFound,
    UnexpectedResponse,
    aware,
    base_url,
)

#: Jira Cloud's largest page for a search that returns fields.
PAGE_SIZE = 100
#: What a synthesized ``jira:issue_created`` needs of each issue.
FIELDS = "summary,description,created,issuetype,project"
#: How much wider than asked the relative window is: Jira's clock may run
#: ahead of ours, and what is older than asked is dropped here anyway.
CLOCK_MARGIN = timedelta(minutes=5)


@dataclass(frozen=True)
class FoundIssue:
    """One issue the search found."""

    key: str
    created_at: datetime  # aware, UTC
    #: The issue as Jira gave it (``id``, ``key``, ``self``, ``fields``).
    issue: dict[str, Any]


class JiraSearch(ApiClient):
    """The issue search of the Jira site at ``site_url`` (with its context
    path, e.g. ``https://jira.example.com/jira``): Jira Cloud's when an
    ``email`` is given (with an API token), Data Center's otherwise (with a
    personal access token)."""

    service = "Jira"

    def __init__(
        self,
        *,
        site_url: str,
        token: str,
        email: str | None = None,
        clock: Callable[[], float] = time.time,
        **options: Any,
    ) -> None:
        if not token or any(c.isspace() for c in token):
            raise ValueError("the Jira token must be one word, without spaces")
        if email is not None:
            basic = base64.b64encode(f"{email}:{token}".encode()).decode("ascii")
            authorization, credential = f"Basic {basic}", "the email and API token"
        else:
            authorization, credential = f"Bearer {token}", "the personal access token"
        super().__init__(
            base_url=base_url(site_url, "site_url is the Jira site's http(s) URL"),
            authorization=lambda: authorization,
            credential_name=credential,
            secrets=[token],
            headers={"Accept": "application/json"},
            clock=clock,
            **options,
        )
        self._cloud = email is not None
        self._now = clock

    def created_since(self, *, since: datetime, jql: str | None = None) -> Iterator[FoundIssue]:
        """The issues created at or after ``since`` (aware) that ``jql``, the
        source's filter, also matches; newest first."""
        return self._created_since(aware(since, "since"), jql)

    def _created_since(self, since: datetime, jql: str | None) -> Iterator[FoundIssue]:
        query = search_jql(since, jql, now=datetime.fromtimestamp(self._now(), UTC))
        pages = self._cloud_pages(query) if self._cloud else self._data_center_pages(query)
        for rows in pages:
            for row in rows:
                found = _found(row)
                if found.created_at >= since:
                    yield found

    def _cloud_pages(self, jql: str) -> Iterator[list[Any]]:
        path = "rest/api/3/search/jql"
        params: dict[str, str | int] = {"jql": jql, "fields": FIELDS, "maxResults": PAGE_SIZE}
        tokens_seen: set[str] = set()
        while True:
            page = self._page(path, params)
            yield _issues(page, path)
            token = page.get("nextPageToken")
            if page.get("isLast") is True or not token:
                return
            if not isinstance(token, str) or token in tokens_seen:
                raise UnexpectedResponse("Jira's search gave no new nextPageToken")
            tokens_seen.add(token)
            params = {**params, "nextPageToken": token}

    def _data_center_pages(self, jql: str) -> Iterator[list[Any]]:
        path, start = "rest/api/2/search", 0
        while True:
            params = {"jql": jql, "fields": FIELDS, "maxResults": PAGE_SIZE, "startAt": start}
            page = self._page(path, params)
            rows = _issues(page, path)
            yield rows
            total = page.get("total")
            start += len(rows)
            if not rows or type(total) is not int or start >= total:
                return

    def _page(self, path: str, params: dict[str, str | int]) -> dict[str, Any]:
        response = self._call("GET", path, params=params, not_found=_no_search(self._cloud))
        page = self._json(response, f"GET {path}")
        if not isinstance(page, dict):
            raise UnexpectedResponse(f"Jira's answer to GET {path} is not an object")
        return page

    def _refusal(self, response: httpx.Response, what: str, not_found: NotFound) -> CatchUpError:
        if response.status_code == 400:
            # A JQL Jira cannot run: most likely the source's filter.
            said = self._quoted(response)
            return UnexpectedResponse(
                f"Jira refused the search {what} (400 {said}): check the source's JQL filter"
            )
        return super()._refusal(response, what, not_found)

    def _forbidden(self, what: str, said: str) -> str:
        return (
            f"Jira refused {what} (403 {said}): the account may not browse these "
            "projects, or the site does not take this kind of token"
        )


def search_jql(since: datetime, jql: str | None, *, now: datetime) -> str:
    """The search's JQL: the source's filter, wrapped, and created within a
    relative window reaching back past ``since``; newest first."""
    minutes = max(1, math.ceil((now - since + CLOCK_MARGIN).total_seconds() / 60))
    window = f"created >= -{minutes}m"
    where = f"({jql}) AND {window}" if jql else window
    return f"{where} ORDER BY created DESC"


def _issues(page: dict[str, Any], path: str) -> list[Any]:
    rows = page.get("issues")
    if not isinstance(rows, list):
        raise UnexpectedResponse(f"Jira's answer to GET {path} holds no issues list")
    return rows


def _found(row: Any) -> FoundIssue:
    fields = row.get("fields") if isinstance(row, dict) else None
    key = row.get("key") if isinstance(row, dict) else None
    created = fields.get("created") if isinstance(fields, dict) else None
    if not isinstance(key, str) or not isinstance(created, str):
        raise UnexpectedResponse("Jira's search holds an issue without a key or a created date")
    try:
        created_at = datetime.fromisoformat(created)
    except ValueError as error:
        raise UnexpectedResponse(f"Jira's search holds {key} with an unreadable date") from error
    if created_at.tzinfo is None:
        raise UnexpectedResponse(f"Jira's search holds {key} with a date without an offset")
    return FoundIssue(key=key, created_at=created_at.astimezone(UTC), issue=row)


def _no_search(cloud: bool):
    def absent(what: str) -> CatchUpError:
        where = "Jira Cloud" if cloud else "Jira Data Center"
        return BadCredentials(
            f"Jira answered 404 to {what}: the site URL is not a {where} site "
            "(an email means Jira Cloud; a personal access token alone, Data Center)"
        )

    return absent
