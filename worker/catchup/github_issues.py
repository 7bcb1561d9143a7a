"""GitHub's issues and pull requests of one repository, newest first: what a scan reads.

GitHub's delivery log reaches back 3 days (7 on Enterprise Server). For what is
older, or for a repository that never had a webhook, the scan lists the items
themselves: the Issues API lists pull requests too, as issues carrying a
``pull_request`` key.

Provider documentation this module follows:

- List repository issues (``state=all``; ``since`` filters by *updated* time,
  so every item created since is in it; ``sort=created``, ``direction=desc``;
  page numbers in the ``Link`` header):
  https://docs.github.com/en/rest/issues/issues#list-repository-issues
  Its items name their repository by URL only (``repository_url``), so the
  repository's ``id`` -- which a synthesized delivery carries, as a webhook's
  does, for the item's stable key (docs/contract.md §15, "Stable keys") --
  comes from https://docs.github.com/en/rest/repos/repos#get-a-repository
- A GitHub App reads a repository with an installation access token, which its
  JWT mints: https://docs.github.com/en/rest/apps/apps#get-a-repository-installation-for-the-authenticated-app
  and https://docs.github.com/en/rest/apps/apps#create-an-installation-access-token-for-an-app
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from worker.catchup.api import BadCredentials, CatchUpError, UnexpectedResponse, aware, iso
from worker.catchup.github_log import PAGE_SIZE, GitHubApi


@dataclass(frozen=True)
class ListedItem:
    """An issue or a pull request as the Issues API lists it."""

    number: int
    pull_request: bool
    created_at: datetime  # aware, UTC
    #: The item as GitHub gave it: a synthesized delivery carries it.
    item: dict[str, Any]


class IssueListing(GitHubApi):
    """The issues and pull requests of the repositories a token may read."""

    permission_hint = (
        "the token may not read this repository's issues (it needs read access to "
        "'Issues' and 'Pull requests', or repo on a classic token)"
    )

    def repository_id(self, repo: str) -> int:
        """Repository ``repo``'s (``OWNER/REPO``) numeric id, which survives its
        renames and transfers."""
        path = f"repos/{repo}"
        response = self._call("GET", path, not_found=_repo_hidden(repo))
        repository = self._json(response, f"GET {path}")
        repository_id = repository.get("id") if isinstance(repository, dict) else None
        if type(repository_id) is not int or repository_id <= 0:
            raise UnexpectedResponse(f"GitHub's answer to GET {path} names no repository id")
        return repository_id

    def created_since(self, repo: str, *, since: datetime) -> Iterator[ListedItem]:
        """Repository ``repo``'s (``OWNER/REPO``) items created at or after
        ``since`` (aware), newest first; paging stops at the first older one."""
        return self._created_since(repo, aware(since, "since"))

    def _created_since(self, repo: str, since: datetime) -> Iterator[ListedItem]:
        path = f"repos/{repo}/issues"
        params: dict[str, str | int] = {
            "state": "all",
            "sort": "created",
            "direction": "desc",
            "since": iso(since),  # updated since: a superset of created since
            "per_page": PAGE_SIZE,
        }
        pages_seen: set[str] = set()
        while True:
            response = self._call("GET", path, params=params, not_found=_repo_hidden(repo))
            rows = self._json(response, f"GET {path}")
            if not isinstance(rows, list):
                raise UnexpectedResponse(f"GitHub's answer to GET {path} is not a list")
            for row in rows:
                item = _listed(row)
                if item.created_at < since:
                    return
                yield item
            page = _next_page(response)
            if page is None:
                return
            if page in pages_seen:
                raise UnexpectedResponse("GitHub's issue listing gave the same next page twice")
            pages_seen.add(page)
            params = {**params, "page": page}


class AppInstallation(GitHubApi):
    """A GitHub App, read with its JWT: the installation access token it may
    read a repository with."""

    permission_hint = "the App may not read this repository"

    def token_for(self, repo: str) -> str:
        """An installation access token (valid an hour) for ``repo``, where the
        App is installed; :class:`BadCredentials` where it is not."""
        path = f"repos/{repo}/installation"
        response = self._call("GET", path, not_found=_not_installed(repo))
        installation = self._json(response, f"GET {path}")
        installation_id = installation.get("id") if isinstance(installation, dict) else None
        if type(installation_id) is not int:
            raise UnexpectedResponse(f"GitHub's answer to GET {path} names no installation id")
        path = f"app/installations/{installation_id}/access_tokens"
        response = self._call("POST", path, not_found=_not_installed(repo))
        minted = self._json(response, f"POST {path}")
        token = minted.get("token") if isinstance(minted, dict) else None
        if not isinstance(token, str) or not token:
            raise UnexpectedResponse(f"GitHub's answer to POST {path} holds no token")
        return token


def _listed(row: Any) -> ListedItem:
    if not isinstance(row, dict):
        raise UnexpectedResponse("GitHub's issue listing holds an item that is not an object")
    number, created = row.get("number"), row.get("created_at")
    if type(number) is not int or number <= 0 or not isinstance(created, str):
        raise UnexpectedResponse("GitHub's issue listing holds an item without a number or date")
    try:
        created_at = datetime.fromisoformat(created)
    except ValueError as error:
        raise UnexpectedResponse(
            "GitHub's issue listing holds an item without a valid 'created_at'"
        ) from error
    return ListedItem(
        number=number,
        pull_request=isinstance(row.get("pull_request"), dict),
        created_at=(
            created_at.replace(tzinfo=UTC)
            if created_at.tzinfo is None
            else created_at.astimezone(UTC)
        ),
        item=row,
    )


def _next_page(response: httpx.Response) -> str | None:
    # Only the page number is taken from the Link: the next page is asked of
    # the same endpoint, so the token never follows a link to another host.
    link = response.links.get("next")
    if link is None:
        return None
    try:
        page = httpx.URL(link.get("url", "")).params.get("page")
    except httpx.InvalidURL:
        page = None
    if not page or not page.isdigit():
        raise UnexpectedResponse("GitHub's Link header names a next page without a page number")
    return page


def _repo_hidden(repo: str):
    def hidden(what: str) -> CatchUpError:
        return BadCredentials(
            f"GitHub answered 404 to {what}: no repository {repo}, or the token may not "
            "see it (GitHub answers 404, not 403, to a token without access)"
        )

    return hidden


def _not_installed(repo: str):
    def absent(what: str) -> CatchUpError:
        return BadCredentials(f"GitHub answered 404 to {what}: the App is not installed on {repo}")

    return absent
