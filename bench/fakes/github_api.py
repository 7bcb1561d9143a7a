"""A fake of GitHub's REST API for catching up: a real HTTP server on 127.0.0.1.

GitHub never redelivers a failed webhook delivery on its own: it keeps every
attempt for three days and lists them at ``…/hooks/{hook_id}/deliveries``.
This server speaks that API -- the log, one full delivery, a redelivery -- for a
repository's, an organization's and a GitHub App's hook, in the shapes of
GitHub's published examples (tests/fixtures/github_api/, sources in its
SOURCES.md), so a catch-up test runs over real sockets, real cursor pagination
and real failure answers.

What the log cannot tell (a delivery older than three days, one GitHub never
tried) a state scan finds by asking for the state itself, so the fake also holds
repositories' issues and pull requests and serves ``GET /repos/{owner}/{repo}/issues``
with its documented ``state``, ``since``, ``sort`` and ``direction`` and numbered
pages, and ``GET /repos/{owner}/{repo}`` for the repository's ``id``, which a
rename (:meth:`FakeGitHub.rename_repo`) keeps. For a source that is a GitHub
App it serves the way to a token that may read them:
``GET /repos/{owner}/{repo}/installation`` and
``POST /app/installations/{id}/access_tokens``, both with the App's JWT::

    with FakeGitHub(token="ghp_test") as github:
        github.log_delivery(hook="repos/acme/widgets/hooks/123", event="issues",
                            payload=body, status_code=502)
        github.open_issue("acme/widgets", title="Found a bug")
        github.install_app("acme")  # the App, on every repository of acme
        ...  # a source whose API base URL is github.base_url

As a pytest fixture: ``yield from FakeGitHub(token="ghp_test").serve()``.

Not modelled: the log's three-day expiry, its backwards pages (``rel="prev"``),
and GitHub actually sending a redelivery anywhere (a redelivery is only logged).
Of issues: the other filters (``milestone``, ``assignee``, ``type``, ``creator``,
``mentioned``, ``labels``: ignored), labels, assignees, milestones, comments,
locks and reopening; every repository is private (a token that may not see it
gets a 404); page links name ``/repos/{owner}/{repo}/issues`` where GitHub's name
``/repositories/{id}/issues``; a repository is a few of GitHub's fields, and
its old name after a rename is a 404 where GitHub redirects; the objects' own
URLs name api.github.com and github.com, not the fake. Of Apps: a JWT's
signature and claims are not checked (any three-part bearer token is App
``APP_ID``'s); a token request's body (``repositories``, ``permissions``) is
not read; the App and its tokens share the one rate limit.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
import re
import secrets
import string
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from typing import Any
from urllib.parse import urlencode

from bench.fakes.server import Answer, FakeServer, ReceivedRequest

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

# Issues, pull requests and the App's installations.
REPO = re.compile(r"[^/\s]+/[^/\s]+")  # owner/name
ACCOUNT = re.compile(r"[^/\s]+")
REPO_ROUTE = r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)"
ISSUES_ROUTE = re.compile(rf"{REPO_ROUTE}/issues")
REPOSITORY_ROUTE = re.compile(REPO_ROUTE)
INSTALLATION_ROUTE = re.compile(rf"{REPO_ROUTE}/installation")
ACCESS_TOKENS_ROUTE = re.compile(r"/app/installations/(?P<installation>[^/]+)/access_tokens")
LIST_ISSUES_DOCS = f"{DOCS}/issues/issues#list-repository-issues"
GET_REPOSITORY_DOCS = f"{DOCS}/repos/repos#get-a-repository"
GET_INSTALLATION_DOCS = f"{DOCS}/apps/apps#get-a-repository-installation-for-the-authenticated-app"
CREATE_TOKEN_DOCS = f"{DOCS}/apps/apps#create-an-installation-access-token-for-an-app"
#: The objects' own URLs, as GitHub's: what a client follows is the Link header.
API_URL = "https://api.github.com"
WEB_URL = "https://github.com"
FIRST_ISSUE_ID = 2_000_000_001
FIRST_REPOSITORY_ID = 700_000_001
FIRST_INSTALLATION_ID = 42_000_001
FIRST_ACCOUNT_ID = 9_000_001
ISSUE_AUTHOR = ("octocat", 1)  # login and id: every issue is the example user's
APP_SLUG = "taskhook"
APP_CLIENT_ID = "Iv1.7a4f2c9e1b3d5f60"
#: What a state scan needs: to read issues and pull requests (metadata comes with any App).
APP_PERMISSIONS = {"issues": "read", "metadata": "read", "pull_requests": "read"}
APP_EVENTS = ["issues", "pull_request"]
INSTALLATION_TOKEN_LIFETIME = timedelta(hours=1)
NOT_FOR_AN_APP = "Resource not accessible by integration"

# The list's `status` filter, as documented: by status_code range. So a delivery
# that never got an answer (status_code 0) is in neither.
STATUS_FILTERS: dict[str | None, Callable[[int], bool]] = {
    None: lambda code: True,
    "success": lambda code: 200 <= code <= 399,
    "failure": lambda code: 400 <= code <= 599,
}

# The issue list's `state`, `sort` and `direction`, as documented; the number
# breaks ties. Comments are not modelled (none has any): `comments` sorts as `created`.
ISSUE_STATES: dict[str, Callable[[Issue], bool]] = {
    "open": lambda issue: issue.state == "open",
    "closed": lambda issue: issue.state == "closed",
    "all": lambda issue: True,
}
ISSUE_SORTS: dict[str, Callable[[Issue], tuple[Any, ...]]] = {
    "created": lambda issue: (issue.created_at, issue.number),
    "updated": lambda issue: (issue.updated_at, issue.number),
    "comments": lambda issue: (0, issue.created_at, issue.number),
}
DESCENDING = {"desc": True, "asc": False}


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
class Issue:
    """An issue, or a pull request, of a repository: what the Issues API lists."""

    repo: str  # owner/name, spelled as first given
    id: int
    number: int
    title: str
    body: str | None
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None = None
    pull_request: bool = False

    @property
    def state(self) -> str:
        return "open" if self.closed_at is None else "closed"

    def item(self) -> dict[str, Any]:
        """The list's item, keys in the example's order; the unmodelled ones empty."""
        api = f"{API_URL}/repos/{self.repo}"
        url = f"{api}/issues/{self.number}"
        web = f"{WEB_URL}/{self.repo}/{'pull' if self.pull_request else 'issues'}/{self.number}"
        author = _account(*ISSUE_AUTHOR, "User")
        item: dict[str, Any] = {
            "id": self.id,
            "node_id": _node_id("Issue", self.id),
            "url": url,
            "repository_url": api,
            "labels_url": f"{url}/labels{{/name}}",
            "comments_url": f"{url}/comments",
            "events_url": f"{url}/events",
            "html_url": web,
            "number": self.number,
            "state": self.state,
            "title": self.title,
            "body": self.body,
            "user": author,
            "pinned_comment": None,
            "labels": [],
            "assignee": None,
            "assignees": [],
            "milestone": None,
            "locked": False,
            "active_lock_reason": None,
            "comments": 0,
        }
        if self.pull_request:  # the key's presence is how a client tells a pull request
            item["pull_request"] = {
                "url": f"{api}/pulls/{self.number}",
                "html_url": web,
                "diff_url": f"{web}.diff",
                "patch_url": f"{web}.patch",
            }
        closed = self.closed_at is not None
        return {
            **item,
            "closed_at": _iso(self.closed_at) if self.closed_at else None,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "closed_by": author if closed else None,
            "author_association": "COLLABORATOR",  # as in the example
            "state_reason": "completed" if closed else None,
        }


@dataclass(frozen=True)
class MintedToken:
    """An installation access token the fake handed out, for ``installation_id``."""

    token: str
    installation_id: int
    expires_at: datetime

    def is_valid(self) -> bool:
        return _now() < self.expires_at


@dataclass(frozen=True)
class _Installation:
    """The App installed on an account: on all its repositories, or on those selected."""

    id: int
    account: str  # the login, spelled as first given
    account_id: int
    repositories: frozenset[str] | None  # lower-case owner/name; None: all of them
    created_at: datetime

    @property
    def repository_selection(self) -> str:
        return "all" if self.repositories is None else "selected"

    def covers(self, repo: str) -> bool:
        """Whether the installation reaches ``repo`` (lower-case owner/name)."""
        owner = repo.split("/", 1)[0]
        if owner != self.account.lower():
            return False
        return self.repositories is None or repo in self.repositories

    def body(self) -> dict[str, Any]:
        """The "installation", keys in the example's order."""
        created = _iso(self.created_at)
        return {
            "id": self.id,
            "account": _account(self.account, self.account_id, "Organization"),
            "repository_selection": self.repository_selection,
            "access_tokens_url": f"{API_URL}/app/installations/{self.id}/access_tokens",
            "repositories_url": f"{API_URL}/installation/repositories",
            "html_url": f"{WEB_URL}/organizations/{self.account}/settings/installations/{self.id}",
            "app_id": APP_ID,
            "client_id": APP_CLIENT_ID,
            "target_id": self.account_id,
            "target_type": "Organization",
            "permissions": dict(APP_PERMISSIONS),
            "events": list(APP_EVENTS),
            "created_at": created,
            "updated_at": created,
            "single_file_name": None,  # an App without the single-file permission
            "has_multiple_single_files": False,
            "single_file_paths": [],
            "app_slug": APP_SLUG,
            "suspended_at": None,
            "suspended_by": None,
        }


class _InvalidField(ValueError):
    """A query parameter GitHub's validation refuses (a 422 naming the field)."""

    def __init__(self, field: str) -> None:
        super().__init__(field)
        self.field = field


@dataclass(frozen=True)
class _IssueQuery:
    """The issue list's query, checked, defaults filled in."""

    state: str
    since: datetime | None
    sort: str
    descending: bool
    page: int
    page_size: int


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


class FakeGitHub(FakeServer):
    """GitHub's webhook-delivery and issues API on 127.0.0.1, on a free port, in a thread.

    ``token`` is the token the repository and organization endpoints accept
    (``Bearer`` or ``token``); the App's endpoints (``/app/...`` and
    ``/repos/{owner}/{repo}/installation``) accept any JWT-shaped bearer token
    instead and record it in ``app_jwts``. The issue list also accepts an
    installation token the fake minted (``minted_tokens``) while it is valid, for
    the repositories of its installation. With ``redelivery_succeeds`` a
    redelivery request logs a new, successful attempt of the same delivery;
    without it the request is only recorded in ``redeliveries``.
    """

    server_version = "GitHub.com"

    def __init__(
        self,
        token: str = "ghp_test",
        *,
        redelivery_succeeds: bool = True,
        hook_url: str = "https://taskhook.example.com/webhooks/github",
    ) -> None:
        super().__init__()
        self.token = token
        self.redelivery_succeeds = redelivery_succeeds
        self.hook_url = hook_url
        #: per_page is honoured up to this (and never past GitHub's 100).
        self.page_size_cap = MAX_PER_PAGE
        self.requests: list[ReceivedRequest] = []
        self.redeliveries: list[int] = []
        self.app_jwts: list[str] = []
        self.minted_tokens: list[MintedToken] = []
        self._attempts: list[Attempt] = []
        #: The same attempts by id: a benchmark's log holds tens of thousands.
        self._attempts_by_id: dict[int, Attempt] = {}
        self._hooks: set[str] = set()
        self._faults: deque[_Fault] = deque()
        self._ids = itertools.count(FIRST_ATTEMPT_ID)
        self._rate_limit = _RateLimit()
        self._repos: dict[str, str] = {}  # lower-case owner/name: as first spelled
        self._repo_ids: dict[str, int] = {}  # lower-case owner/name: repository.id
        self._next_repo_ids = itertools.count(FIRST_REPOSITORY_ID)
        self._issues: dict[str, dict[int, Issue]] = {}  # by lower-case owner/name, number
        self._issue_ids = itertools.count(FIRST_ISSUE_ID)
        self._installations: dict[int, _Installation] = {}
        self._installation_ids = itertools.count(FIRST_INSTALLATION_ID)
        self._account_ids: dict[str, int] = {}
        self._next_account_ids = itertools.count(FIRST_ACCOUNT_ID)
        # Handler threads and the test's thread share the log and the counters.
        self._lock = threading.Lock()

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
            self._keep(attempt)
        return attempt.id

    def _keep(self, attempt: Attempt) -> None:
        self._attempts.append(attempt)
        self._attempts_by_id[attempt.id] = attempt

    def attempts(self, hook: str | None = None) -> list[Attempt]:
        """The logged attempts (of ``hook``, or of every hook), newest first."""
        with self._lock:
            return self._log(_hook_path(hook) if hook else None)

    # -- issues and pull requests -------------------------------------------

    def add_repo(self, repo: str) -> str:
        """Make repository ``owner/name`` exist with no issues; an unknown one's list is a 404."""
        key, name = _repo_key(repo)
        with self._lock:
            return self._add_repo(key, name)

    def repository_id(self, repo: str) -> int:
        """``repo``'s ``id``, as its webhooks' ``repository.id`` says it."""
        key, _ = _repo_key(repo)
        with self._lock:
            return self._repo_ids[key]

    def rename_repo(self, repo: str, new: str) -> None:
        """Rename (or transfer) ``repo`` to ``new``, both ``owner/name``: its
        ``id``, issues and pull requests go with it, as on GitHub; the old name
        is then unknown (GitHub would redirect it)."""
        key, _ = _repo_key(repo)
        new_key, new_name = _repo_key(new)
        with self._lock:
            if key not in self._repos:
                raise KeyError(f"no repository {repo}")
            if new_key in self._repos and new_key != key:
                raise ValueError(f"{new} exists already")
            del self._repos[key]
            self._repos[new_key] = new_name
            self._repo_ids[new_key] = self._repo_ids.pop(key)
            issues = self._issues.pop(key, {})
            self._issues[new_key] = {n: replace(i, repo=new_name) for n, i in issues.items()}
            for installation in list(self._installations.values()):
                selected = installation.repositories
                if selected is not None and key in selected:
                    moved = replace(installation, repositories=selected - {key} | {new_key})
                    self._installations[installation.id] = moved

    def open_issue(
        self,
        repo: str,
        *,
        title: str,
        body: str | None = None,
        created_at: datetime | None = None,
        pull_request: bool = False,
        number: int | None = None,
    ) -> dict[str, Any]:
        """Open an issue (or a pull request) in ``repo``, ``owner/name``; the listed item.

        Numbers count 1, 2, ... per repository, issues and pull requests alike, as
        on GitHub; a ``number`` given must be free, and the count goes on past it.
        ``created_at`` is now unless given; ``updated_at`` starts equal to it.
        """
        key, name = _repo_key(repo)
        opened = _moment(created_at)
        with self._lock:
            issues = self._issues.setdefault(key, {})
            if number is None:
                number = max(issues, default=0) + 1
            elif number < 1:
                raise ValueError(f"GitHub numbers from 1, not {number}")
            elif number in issues:
                raise ValueError(f"{repo} already has #{number}")
            issue = Issue(
                repo=self._add_repo(key, name),
                id=next(self._issue_ids),
                number=number,
                title=title,
                body=body,
                created_at=opened,
                updated_at=opened,
                pull_request=pull_request,
            )
            issues[number] = issue
        return issue.item()

    def close_issue(self, repo: str, number: int, *, at: datetime | None = None) -> dict[str, Any]:
        """Close ``repo``'s #``number`` at ``at`` (now unless given); the listed item."""
        with self._lock:
            issue = self._issue(repo, number)
            if issue.closed_at is not None:
                raise ValueError(f"{repo}#{number} is closed already")
            closed = self._later(issue, at)
            return self._store(replace(issue, closed_at=closed, updated_at=closed)).item()

    def edit_issue(
        self, repo: str, number: int, *, title: str | None = None, at: datetime | None = None
    ) -> dict[str, Any]:
        """Edit ``repo``'s #``number`` at ``at`` (now unless given): a new ``updated_at``."""
        with self._lock:
            issue = self._issue(repo, number)
            edited = replace(issue, updated_at=self._later(issue, at))
            if title is not None:
                edited = replace(edited, title=title)
            return self._store(edited).item()

    def issues(self, repo: str) -> list[dict[str, Any]]:
        """``repo``'s issues and pull requests as listed, by number."""
        key, _ = _repo_key(repo)
        with self._lock:
            stored = self._issues.get(key, {})
            return [stored[number].item() for number in sorted(stored)]

    # -- the App's installations and tokens --------------------------------

    def install_app(self, repo_or_org: str) -> int:
        """Install the App (``APP_ID``) on a repository or on all of an account's; its id.

        ``repo_or_org`` is ``owner/name`` (that repository is selected, and exists
        from now on) or an account's login (all its repositories). As on GitHub an
        account has one installation of the App: installing on another of its
        repositories adds that one to the selection, on the account selects all.
        A delivery from the App carries this id in ``installation.id``, but the
        log takes any: give ``log_delivery`` a payload with this id to match.
        """
        target = repo_or_org.strip("/")
        if REPO.fullmatch(target):
            key, name = _repo_key(target)
            account = name.split("/", 1)[0]
        elif ACCOUNT.fullmatch(target):
            key, account = None, target
        else:
            raise ValueError(f"not a repository (owner/name) or an account: {repo_or_org!r}")
        with self._lock:
            installation = self._installation_of(account) or _Installation(
                id=next(self._installation_ids),
                account=account,
                account_id=self._account_id(account),
                repositories=frozenset(),
                created_at=_moment(None),
            )
            selected = installation.repositories
            if key is None:
                selected = None
            else:
                self._add_repo(key, name)
                if selected is not None:
                    selected = selected | {key}
            self._installations[installation.id] = replace(installation, repositories=selected)
        return installation.id

    def expire_minted_tokens(self) -> None:
        """End every minted installation token now, as an hour would."""
        now = _now()
        with self._lock:
            self.minted_tokens[:] = [
                replace(minted, expires_at=min(minted.expires_at, now))
                for minted in self.minted_tokens
            ]

    def _add_repo(self, key: str, name: str) -> str:
        if key not in self._repo_ids:
            self._repo_ids[key] = next(self._next_repo_ids)
        return self._repos.setdefault(key, name)

    def _issue(self, repo: str, number: int) -> Issue:
        key, _ = _repo_key(repo)
        issue = self._issues.get(key, {}).get(number)
        if issue is None:
            raise KeyError(f"{repo} has no #{number}")
        return issue

    def _store(self, issue: Issue) -> Issue:
        self._issues[issue.repo.lower()][issue.number] = issue
        return issue

    @staticmethod
    def _later(issue: Issue, at: datetime | None) -> datetime:
        # Nothing happens to an issue before it was opened; a test saying so has a bug.
        moment = _moment(at)
        if moment < issue.created_at:
            raise ValueError(f"{moment} is before {issue.repo}#{issue.number} was opened")
        return moment

    def _installation_of(self, account: str) -> _Installation | None:
        login = account.lower()
        return next((i for i in self._installations.values() if i.account.lower() == login), None)

    def _account_id(self, account: str) -> int:
        login = account.lower()
        if login not in self._account_ids:
            self._account_ids[login] = next(self._next_account_ids)
        return self._account_ids[login]

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

    def _answer(self, request: ReceivedRequest) -> Answer:
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

    def _handle(self, request: ReceivedRequest) -> Answer:
        if self._faults:
            return _fault_answer(self._faults.popleft())
        if route := ROUTE.fullmatch(request.path):
            return self._deliveries(request, route)
        if route := ISSUES_ROUTE.fullmatch(request.path):
            return self._issues_route(request, _route_repo(route))
        if route := INSTALLATION_ROUTE.fullmatch(request.path):
            return self._installation_route(request, _route_repo(route))
        if route := REPOSITORY_ROUTE.fullmatch(request.path):
            return self._repository_route(request, _route_repo(route))
        if route := ACCESS_TOKENS_ROUTE.fullmatch(request.path):
            return self._access_tokens_route(request, route["installation"])
        return _error(404, "Not Found", DOCS)

    def _deliveries(self, request: ReceivedRequest, route: re.Match[str]) -> Answer:
        hook = route["hook"]
        refusal = self._refusal(hook, request.headers.get("authorization", ""))
        if refusal is not None:
            return refusal
        self._rate_limit.spend()
        return self._serve_hook(request, hook, route["delivery"], bool(route["attempts"]))

    def _serve_hook(
        self, request: ReceivedRequest, hook: str, delivery: str | None, attempts: bool
    ) -> Answer:
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
        return Answer(200, attempt.full())

    def _refusal(self, hook: str, authorization: str) -> Answer | None:
        """401 unless the credentials fit the endpoint: the token, or (for an App) a JWT."""
        if hook == "app/hook":
            return self._jwt_refusal(authorization)
        refusal = self._token_refusal(authorization)
        if refusal is None and self._minted(authorization) is not None:
            # Valid, but the App may not read hooks: it asked for no such permission.
            return _error(403, NOT_FOR_AN_APP, DOCS)
        return refusal

    def _jwt_refusal(self, authorization: str) -> Answer | None:
        """401 unless a JWT-shaped bearer token (recorded in ``app_jwts``): the App itself."""
        if not authorization:
            return _error(401, "Requires authentication", DOCS)
        scheme, _, credential = authorization.partition(" ")
        if scheme.lower() == "bearer" and _looks_like_jwt(credential):
            self.app_jwts.append(credential)
            return None
        return _error(401, "A JSON web token could not be decoded", DOCS)

    def _token_refusal(self, authorization: str) -> Answer | None:
        """401 unless the fake's token or a valid installation token it minted."""
        if not authorization:
            return _error(401, "Requires authentication", DOCS)
        scheme, _, credential = authorization.partition(" ")
        if scheme.lower() in ("bearer", "token") and (
            credential == self.token or self._minted(authorization) is not None
        ):
            return None
        return _error(401, "Bad credentials", DOCS)

    def _minted(self, authorization: str) -> MintedToken | None:
        """The valid installation token ``authorization`` carries, if it carries one."""
        credential = authorization.partition(" ")[2]
        return next((m for m in self.minted_tokens if m.token == credential and m.is_valid()), None)

    def _may_read(self, authorization: str, repo: str) -> bool:
        """The fake's token reads every repository, an installation token its installation's."""
        minted = self._minted(authorization)
        return minted is None or self._installations[minted.installation_id].covers(repo)

    # -- the issue list and the App's routes --------------------------------

    def _issues_route(self, request: ReceivedRequest, repo: str) -> Answer:
        authorization = request.headers.get("authorization", "")
        refusal = self._token_refusal(authorization)
        if refusal is not None:
            return refusal
        self._rate_limit.spend()
        # A repository the credential may not read does not exist, for it: all are private.
        known = repo in self._repos and self._may_read(authorization, repo)
        if request.method != "GET" or not known:
            return _error(404, "Not Found", LIST_ISSUES_DOCS)
        try:
            query = self._issue_query(request.query)
        except _InvalidField as invalid:
            return _validation_failed("Issue", invalid.field, LIST_ISSUES_DOCS)
        return self._list_issues(request, repo, query)

    def _repository_route(self, request: ReceivedRequest, repo: str) -> Answer:
        authorization = request.headers.get("authorization", "")
        refusal = self._token_refusal(authorization)
        if refusal is not None:
            return refusal
        self._rate_limit.spend()
        known = repo in self._repos and self._may_read(authorization, repo)
        if request.method != "GET" or not known:
            return _error(404, "Not Found", GET_REPOSITORY_DOCS)
        return Answer(200, self._repository(repo))

    def _repository(self, key: str) -> dict[str, Any]:
        """The repository as ``GET /repos/{owner}/{repo}`` answers it: a few of
        its fields, in the example's order (every repository is private)."""
        full_name, repository_id = self._repos[key], self._repo_ids[key]
        owner, name = full_name.split("/", 1)
        return {
            "id": repository_id,
            "node_id": _node_id("Repository", repository_id),
            "name": name,
            "full_name": full_name,
            "private": True,
            "owner": _account(owner, self._account_id(owner), "User"),
            "html_url": f"{WEB_URL}/{full_name}",
            "url": f"{API_URL}/repos/{full_name}",
            "issues_url": f"{API_URL}/repos/{full_name}/issues{{/number}}",
        }

    def _issue_query(self, query: dict[str, str]) -> _IssueQuery:
        def choice(name: str, choices: dict[str, Any], default: str) -> str:
            value = query.get(name, default)
            if value not in choices:
                raise _InvalidField(name)
            return value

        def number(name: str, default: int) -> int:
            # What GitHub answers to a number that is none is not documented: loud suits a test.
            try:
                return int(query.get(name, default))
            except ValueError:
                raise _InvalidField(name) from None

        return _IssueQuery(
            state=choice("state", ISSUE_STATES, "open"),
            since=_since(query["since"]) if "since" in query else None,
            sort=choice("sort", ISSUE_SORTS, "created"),
            descending=DESCENDING[choice("direction", DESCENDING, "desc")],
            page=max(1, number("page", 1)),
            page_size=self._page_size(str(number("per_page", DEFAULT_PER_PAGE))),
        )

    def _list_issues(self, request: ReceivedRequest, repo: str, query: _IssueQuery) -> Answer:
        wanted = ISSUE_STATES[query.state]
        matching = [
            issue
            for issue in self._issues.get(repo, {}).values()
            if wanted(issue) and (query.since is None or issue.updated_at >= query.since)
        ]
        matching.sort(key=ISSUE_SORTS[query.sort], reverse=query.descending)
        start = (query.page - 1) * query.page_size
        page = matching[start : start + query.page_size]
        last_page = max(1, math.ceil(len(matching) / query.page_size))
        link = self._page_links(request, query.page, last_page)
        return Answer(200, [issue.item() for issue in page], {"Link": link} if link else {})

    def _page_links(self, request: ReceivedRequest, page: int, last_page: int) -> str:
        """GitHub's Link for numbered pages: prev, next, last, first, those that apply."""
        relations: list[tuple[str, int]] = []
        if page > 1:
            relations.append(("prev", page - 1))
        if page < last_page:
            relations += [("next", page + 1), ("last", last_page)]
        if page > 1:
            relations.append(("first", 1))
        return ", ".join(
            f'<{self._page_url(request, number)}>; rel="{relation}"'
            for relation, number in relations
        )

    def _page_url(self, request: ReceivedRequest, page: int) -> str:
        # The query as given, its page (in place, or added last) the one linked to.
        params = {**request.query, "page": str(page)}
        return f"{self.base_url}{request.path}?{urlencode(params)}"

    def _installation_route(self, request: ReceivedRequest, repo: str) -> Answer:
        refusal = self._jwt_refusal(request.headers.get("authorization", ""))
        if refusal is not None:
            return refusal
        self._rate_limit.spend()
        installation = next((i for i in self._installations.values() if i.covers(repo)), None)
        if request.method != "GET" or repo not in self._repos or installation is None:
            return _error(404, "Not Found", GET_INSTALLATION_DOCS)
        return Answer(200, installation.body())

    def _access_tokens_route(self, request: ReceivedRequest, installation_id: str) -> Answer:
        refusal = self._jwt_refusal(request.headers.get("authorization", ""))
        if refusal is not None:
            return refusal
        self._rate_limit.spend()
        installation = (
            self._installations.get(int(installation_id)) if installation_id.isdigit() else None
        )
        if request.method != "POST" or installation is None:
            return _error(404, "Not Found", CREATE_TOKEN_DOCS)
        minted = MintedToken(
            token=_installation_token(),
            installation_id=installation.id,
            expires_at=_moment(None) + INSTALLATION_TOKEN_LIFETIME,
        )
        self.minted_tokens.append(minted)
        return Answer(
            201,
            {
                "token": minted.token,
                "expires_at": _iso(minted.expires_at),
                "permissions": dict(APP_PERMISSIONS),
                "repository_selection": installation.repository_selection,
            },
        )

    def _list(self, request: ReceivedRequest, hook: str) -> Answer:
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
        return Answer(200, [attempt.simple() for attempt in page], headers)

    def _page_size(self, per_page: str | None) -> int:
        wanted = DEFAULT_PER_PAGE if per_page is None else int(per_page)
        return max(1, min(wanted, MAX_PER_PAGE, self.page_size_cap))

    def _cursor_position(self, cursor: str | None) -> tuple[datetime, int] | None:
        """Where the page after ``cursor`` starts: below the attempt it names."""
        if cursor is None:
            return None
        if not cursor.startswith(CURSOR_PREFIX):
            raise ValueError(cursor)
        attempt = self._attempts_by_id.get(int(cursor.removeprefix(CURSOR_PREFIX)))
        if attempt is None:
            raise ValueError(cursor)
        return attempt.position

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
        attempt = self._attempts_by_id.get(int(delivery))
        return attempt if attempt is not None and attempt.hook == hook else None

    def _redeliver(self, attempt: Attempt) -> Answer:
        self.redeliveries.append(attempt.id)
        if self.redelivery_succeeds:
            # GitHub sends the same delivery again: same guid, same headers, a new attempt.
            self._keep(
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
        return Answer(202, {})

    def _log(self, hook: str | None) -> list[Attempt]:
        mine = (a for a in self._attempts if hook is None or a.hook == hook)
        return sorted(mine, key=lambda attempt: attempt.position, reverse=True)


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


def _error(status: int, message: str, documentation_url: str) -> Answer:
    return Answer(
        status, {"message": message, "documentation_url": documentation_url, "status": str(status)}
    )


def _fault_answer(fault: _Fault) -> Answer:
    if not fault.is_rate_limit:
        return Answer(fault.status, {"message": HTTPStatus(fault.status).phrase})
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


def _repo_key(repo: str) -> tuple[str, str]:
    """``owner/name`` as the fake keys it (GitHub's names ignore case) and as given."""
    name = repo.strip("/")
    if not REPO.fullmatch(name):
        raise ValueError(f"not a repository: {repo!r} (owner/name)")
    return name.lower(), name


def _route_repo(route: re.Match[str]) -> str:
    return f"{route['owner']}/{route['name']}".lower()


def _since(text: str) -> datetime:
    """The ``since`` of a query: ISO 8601, UTC unless it says otherwise."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise _InvalidField("since") from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _validation_failed(resource: str, field: str, documentation_url: str) -> Answer:
    """GitHub's 422: "Validation Failed", naming what was invalid."""
    return Answer(
        422,
        {
            "message": "Validation Failed",
            "errors": [{"resource": resource, "field": field, "code": "invalid"}],
            "documentation_url": documentation_url,
            "status": "422",
        },
    )


def _account(login: str, account_id: int, kind: str) -> dict[str, Any]:
    """A user or an organization as the examples show one (an organization has /orgs/ URLs)."""
    users = f"{API_URL}/users/{login}"
    own = f"{API_URL}/orgs/{login}" if kind == "Organization" else users
    return {
        "login": login,
        "id": account_id,
        "node_id": _node_id(kind, account_id),
        "avatar_url": f"{WEB_URL}/images/error/{login}_happy.gif",
        "gravatar_id": "",
        "url": own,
        "html_url": f"{WEB_URL}/{login}",
        "followers_url": f"{users}/followers",
        "following_url": f"{users}/following{{/other_user}}",
        "gists_url": f"{users}/gists{{/gist_id}}",
        "starred_url": f"{users}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{users}/subscriptions",
        "organizations_url": f"{users}/orgs",
        "repos_url": f"{own}/repos",
        "events_url": f"{own}/events" if kind == "Organization" else f"{users}/events{{/privacy}}",
        "received_events_url": f"{users}/received_events",
        "type": kind,
        "site_admin": False,
    }


def _node_id(kind: str, object_id: int) -> str:
    # GitHub's legacy global ids, e.g. MDU6SXNzdWUx: base64 of "05:Issue1".
    return base64.b64encode(f"0{len(kind)}:{kind}{object_id}".encode()).decode()


def _installation_token() -> str:
    # ghs_ and 36 letters and digits, like GitHub's.
    alphabet = string.ascii_letters + string.digits
    return "ghs_" + "".join(secrets.choice(alphabet) for _ in range(36))


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


def _moment(at: datetime | None) -> datetime:
    # GitHub keeps whole seconds: what a `since` compares is then what a client was shown.
    return (_utc(at) if at is not None else _now()).replace(microsecond=0)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
