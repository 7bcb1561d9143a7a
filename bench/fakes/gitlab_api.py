"""A fake of GitLab's REST API, the part a catch-up reads: a real HTTP server on 127.0.0.1.

GitLab retries a failing webhook a few times, then disables it for a while. It
records each request it did send (the hook's *events*, kept 7 days), and it
keeps the issues and merge requests, so a catch-up reads both. This server
speaks that part of the API, as GitLab documents it::

    with FakeGitLab(token="glpat-...") as gitlab:
        gitlab.add_project("acme/widgets")
        gitlab.create_issue("acme/widgets", title="Checkout is down")
        ...  # a source read at gitlab.base_url

Routes, under ``/api/v4`` (``OWNER`` is ``projects/ID`` or ``groups/ID``, ID
a number or a URL-encoded full path), each answering 401 without
``Authorization: Bearer TOKEN`` or ``PRIVATE-TOKEN: TOKEN``:

- ``GET /OWNER/hooks``: the owner's hooks (``id``, ``url``, ``created_at``, ...).
- ``GET /OWNER/hooks/:hook_id/events``: its recorded events of the last 7
  days, newest first; ``per_page`` 1 to 20 (else a 400), as GitLab's Grape
  params say. Each has the keys of GitLab's published example
  (tests/fixtures/gitlab_api/project-hook-events.json) and ``created_at``,
  which newer GitLab versions expose; ``with_created_at=False`` leaves it out,
  as older ones do.
- ``GET /OWNER/issues`` and ``GET /OWNER/merge_requests``: ``created_after``,
  ``order_by=created_at``, ``sort``, ``state``, ``scope``; ``per_page`` up to
  100. Items have the keys of the published examples (``issue.json``,
  ``merge-requests.json``). A group's are its projects' and its subgroups'.

Pages are offset-based: ``page``, ``per_page`` (default 20), and the answer's
``X-Page``, ``X-Per-Page``, ``X-Next-Page`` (empty on the last page),
``X-Total`` and ``X-Total-Pages``. An unknown project, group or hook is a 404
``{"message": "404 Project Not Found"}`` (or Group, Hook).

Faults: ``fail_next`` (a 500) and ``rate_limit_next`` (a 429 with
``Retry-After`` and ``RateLimit-Reset``). Every request is recorded in
``requests``.

Not modelled: any other route, ``status`` filters of events, resending,
keyset pagination, confidential-issue permissions, and edits (``updated_at``
is ``created_at``).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from bench.fakes.server import Answer, FakeServer, ReceivedRequest

EXAMPLES = Path(__file__).parents[2] / "tests" / "fixtures" / "gitlab_api"
API = "/api/v4"
DEFAULT_PER_PAGE = 20
MAX_PER_PAGE = 100
MAX_EVENTS_PER_PAGE = 20
#: How long GitLab keeps a hook's events (``WebHookLog::MAX_RECENT_DAYS``).
EVENTS_KEPT = timedelta(days=7)
SAMPLE_INSTANCE = "https://gitlab.example.com"

_ROUTE = re.compile(
    rf"{API}/(?P<kind>projects|groups)/(?P<name>[^/]+)"
    r"/(?P<what>hooks|issues|merge_requests)(?:/(?P<hook>[0-9]+)/events)?"
)


def _example(name: str) -> Any:
    return json.loads((EXAMPLES / name).read_bytes())


@dataclass
class _Project:
    id: int
    path: str
    next_iid: dict[str, int] = field(default_factory=lambda: {"issue": 1, "merge_request": 1})


@dataclass
class _Hook:
    id: int
    owner: str  # "projects/acme/widgets" or "groups/acme"
    url: str
    created_at: datetime
    events: list[dict[str, Any]] = field(default_factory=list)


class FakeGitLab(FakeServer):
    """GitLab's API on 127.0.0.1, on a free port, in a background thread.
    ``token`` is the one access token it takes; ``clock`` its now (aware)."""

    server_version = "FakeGitLab"

    def __init__(self, *, token: str = "glpat-fake", clock: Callable[[], datetime] | None = None):
        super().__init__()
        self.token = token
        self.clock: Callable[[], datetime] = clock or (lambda: datetime.now(UTC))
        #: Whether each event says when it was (GitLab added ``created_at`` later).
        self.with_created_at = True
        self.requests: list[ReceivedRequest] = []
        self._lock = threading.Lock()
        self._projects: dict[str, _Project] = {}
        self._groups: dict[str, int] = {}
        self._items: list[dict[str, Any]] = []  # issues and merge requests, oldest first
        self._hooks: dict[int, _Hook] = {}
        self._ids = itertools.count(1000)
        self._faults: deque[Answer] = deque()

    # -- the world -----------------------------------------------------------

    def add_group(self, path: str) -> int:
        with self._lock:
            return self._groups.setdefault(path, next(self._ids))

    def add_project(self, path: str) -> int:
        with self._lock:
            project = self._projects.setdefault(path, _Project(next(self._ids), path))
            return project.id

    def add_hook(self, owner: str, url: str) -> int:
        """A hook of ``owner`` (``projects/PATH`` or ``groups/PATH``) posting to ``url``."""
        with self._lock:
            hook = _Hook(next(self._ids), owner, url, self.clock())
            self._hooks[hook.id] = hook
            return hook.id

    def create_issue(self, project: str, **fields: Any) -> dict[str, Any]:
        return self._create(project, "issue", fields)

    def create_merge_request(self, project: str, **fields: Any) -> dict[str, Any]:
        return self._create(project, "merge_request", fields)

    def _create(self, path: str, kind: str, fields: dict[str, Any]) -> dict[str, Any]:
        created_at = fields.pop("created_at", None) or self.clock()
        with self._lock:
            project = self._projects[path]
            iid = fields.pop("iid", None) or project.next_iid[kind]
            project.next_iid[kind] = max(project.next_iid[kind], iid + 1)
            if kind == "issue":
                item = copy.deepcopy(_example("issue.json"))
                url_part, marker = "issues", "#"
                item.update(state="opened", closed_at=None, confidential=False)
            else:
                item = copy.deepcopy(_example("merge-requests.json")[0])
                url_part, marker = "merge_requests", "!"
                item.update(
                    state="opened",
                    merged_at=None,
                    merged_by=None,
                    source_project_id=project.id,
                    target_project_id=project.id,
                )
            stamp = created_at.astimezone(UTC).isoformat(timespec="milliseconds")
            item.update(
                id=next(self._ids),
                iid=iid,
                project_id=project.id,
                title=f"{kind} {iid}",
                description=None,
                created_at=stamp.replace("+00:00", "Z"),
                updated_at=stamp.replace("+00:00", "Z"),
                web_url=f"{SAMPLE_INSTANCE}/{path}/-/{url_part}/{iid}",
                references={
                    "short": f"{marker}{iid}",
                    "relative": f"{marker}{iid}",
                    "full": f"{path}{marker}{iid}",
                },
            )
            item.update(fields)
            item["_kind"] = kind
            self._items.append(item)
            return _public(item)

    def record_event(
        self,
        hook_id: int,
        *,
        event: str,
        payload: dict[str, Any] | None,
        response_status: str = "internal error",
        idempotency_key: str | None = None,
        created_at: datetime | None = None,
    ) -> dict[str, Any]:
        """A request GitLab sent the hook (``X-Gitlab-Event: event``) and what
        it got: ``payload`` None is one too large to log (``oversize``)."""
        template = _example("project-hook-events.json")[0]
        with self._lock:
            hook = self._hooks[hook_id]
            row = copy.deepcopy(template)
            row["id"] = next(self._ids)
            row["url"] = hook.url
            row["trigger"] = "issue_hooks" if "Issue" in event else "merge_request_hooks"
            headers = row["request_headers"]
            headers["Idempotency-Key"] = idempotency_key or str(uuid.uuid4())
            headers["X-Gitlab-Event"] = event
            headers["X-Gitlab-Webhook-UUID"] = str(uuid.uuid4())
            headers["X-Gitlab-Event-UUID"] = str(uuid.uuid4())
            row["request_data"] = {"oversize": True} if payload is None else payload
            row["response_status"] = response_status
            if not response_status.isdigit():  # no HTTP answer: nothing came back
                row["response_headers"], row["response_body"] = {}, ""
            moment = (created_at or self.clock()).astimezone(UTC)
            row["created_at"] = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            hook.events.append(row)
            return copy.deepcopy(row)

    def fail_next(self, count: int = 1) -> None:
        for _ in range(count):
            self._faults.append(Answer(500, {"message": "500 Internal Server Error"}))

    def rate_limit_next(self, retry_after: int = 1) -> None:
        reset = int(self.clock().timestamp()) + retry_after
        self._faults.append(
            Answer(
                429,
                {"message": "Retry later"},
                {"Retry-After": str(retry_after), "RateLimit-Reset": str(reset)},
            )
        )

    # -- answering -----------------------------------------------------------

    def _answer(self, request: ReceivedRequest) -> Answer:
        with self._lock:
            self.requests.append(request)
            if self._faults:
                return self._faults.popleft()
            bearer = request.headers.get("authorization", "")
            if self.token not in (
                bearer.removeprefix("Bearer "),
                request.headers.get("private-token"),
            ):
                return Answer(401, {"message": "401 Unauthorized"})
            route = _ROUTE.fullmatch(request.path)
            if request.method != "GET" or route is None:
                return Answer(404, {"error": "404 Not Found"})
            owner = self._owner(route["kind"], unquote(route["name"]))
            if owner is None:
                noun = "Project" if route["kind"] == "projects" else "Group"
                return Answer(404, {"message": f"404 {noun} Not Found"})
            if route["hook"] is not None:
                return self._events(owner, int(route["hook"]), request.query)
            if route["what"] == "hooks":
                rows = [_hook_row(hook) for hook in self._hooks.values() if hook.owner == owner]
                return _page(rows, request.query, MAX_PER_PAGE)
            return self._listing(owner, route["what"], request.query)

    def _owner(self, kind: str, name: str) -> str | None:
        if kind == "projects":
            for project in self._projects.values():
                if name in (str(project.id), project.path):
                    return f"projects/{project.path}"
            return None
        for path, group_id in self._groups.items():
            if name in (str(group_id), path):
                return f"groups/{path}"
        return None

    def _events(self, owner: str, hook_id: int, query: dict[str, str]) -> Answer:
        hook = self._hooks.get(hook_id)
        if hook is None or hook.owner != owner:
            return Answer(404, {"message": "404 Hook Not Found"})
        oldest = (self.clock() - EVENTS_KEPT).replace(hour=0, minute=0, second=0, microsecond=0)
        rows = [
            row
            for row in reversed(hook.events)
            if datetime.fromisoformat(row["created_at"]) >= oldest
        ]
        if not self.with_created_at:
            rows = [{k: v for k, v in row.items() if k != "created_at"} for row in rows]
        return _page(rows, query, MAX_EVENTS_PER_PAGE)

    def _listing(self, owner: str, what: str, query: dict[str, str]) -> Answer:
        kind = "issue" if what == "issues" else "merge_request"
        path = owner.partition("/")[2]
        in_group = owner.startswith("groups/")
        rows = [
            item
            for item in self._items
            if item["_kind"] == kind
            and (
                item["references"]["full"].startswith(path + "/")
                if in_group
                else item["references"]["full"][: -len(item["references"]["short"])] == path
            )
        ]
        if "created_after" in query:
            try:
                after = datetime.fromisoformat(query["created_after"])
            except ValueError:
                return Answer(400, {"error": "created_after is invalid"})
            rows = [row for row in rows if datetime.fromisoformat(row["created_at"]) >= after]
        state = query.get("state", "all")
        if state != "all":
            rows = [row for row in rows if row["state"] == state]
        rows.sort(key=lambda row: (row["created_at"], row["id"]))
        if query.get("sort", "desc") == "desc":
            rows.reverse()
        return _page([_public(row) for row in rows], query, MAX_PER_PAGE)


def _public(item: dict[str, Any]) -> dict[str, Any]:
    return {key: copy.deepcopy(value) for key, value in item.items() if key != "_kind"}


def _hook_row(hook: _Hook) -> dict[str, Any]:
    return {
        "id": hook.id,
        "url": hook.url,
        "created_at": hook.created_at.isoformat().replace("+00:00", "Z"),
        "issues_events": True,
        "merge_requests_events": True,
        "alert_status": "executable",
        "disabled_until": None,
    }


def _page(rows: list[Any], query: dict[str, str], most: int) -> Answer:
    try:
        per_page = int(query.get("per_page", DEFAULT_PER_PAGE))
        page = int(query.get("page", 1))
    except ValueError:
        return Answer(400, {"error": "page and per_page must be integers"})
    if not 1 <= per_page <= most:
        return Answer(400, {"error": "per_page does not have a valid value"})
    page = max(page, 1)
    total_pages = max(1, -(-len(rows) // per_page))
    start = (page - 1) * per_page
    headers = {
        "X-Page": str(page),
        "X-Per-Page": str(per_page),
        "X-Next-Page": str(page + 1) if page < total_pages else "",
        "X-Prev-Page": str(page - 1) if page > 1 else "",
        "X-Total": str(len(rows)),
        "X-Total-Pages": str(total_pages),
        "Content-Type": "application/json",
    }
    return Answer(200, rows[start : start + per_page], headers)
