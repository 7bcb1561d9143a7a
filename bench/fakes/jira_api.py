"""A fake of Jira's issue search REST API: a real HTTP server on 127.0.0.1.

Jira retries a failed webhook a few times, then gives up and keeps no log of it.
What it does keep is the issues, so a catch-up searches for the ones created since
a time and treats each as a ``jira:issue_created`` it may have missed. This server
speaks that search, as Atlassian documents it, so such a catch-up runs over real
sockets, real pagination and real failure answers::

    with FakeJira(email="ops@example.com", api_token="t0ken") as jira:
        jira.create_issue(project="PROJ", summary="Checkout is down")
        ...  # a source whose site URL is jira.base_url

As a pytest fixture: ``yield from FakeJira().serve()``.

Routes (under ``base_url``, the site URL, with its context path if one is given):

- ``GET /rest/api/3/search/jql`` and ``GET /rest/api/2/search/jql``: Jira Cloud's
  enhanced search, HTTP Basic ``email:api_token``. Pages by an opaque
  ``nextPageToken``; ``maxResults`` defaults to 50 and stops at 100 (or
  ``page_size_cap``); ``fields`` defaults to ``id`` alone, as documented. On v3 the
  description is an Atlassian Document Format document, on v2 a plain string.
  https://developer.atlassian.com/cloud/jira/platform/rest/v3/api-group-issue-search/#api-rest-api-3-search-jql-get
- ``GET /rest/api/2/search``: Jira Data Center's search, ``Authorization: Bearer``
  with a personal access token. Pages by ``startAt`` over ``total``; ``maxResults``
  defaults to 50 and stops at 1000 (Data Center's default
  ``jira.search.views.default.max``); ``fields`` defaults to ``*navigable``.
  https://docs.atlassian.com/software/jira/docs/api/REST/9.12.0/#api/2/search-search

Answers have the keys, key order and value types of Atlassian's own examples
(tests/fixtures/jira_api/, sources in its SOURCES.md). Those examples list keys
alphabetically (``isLast, issues, nextPageToken``; ``expand, fields, id, key,
self``), which is not the order a live Jira sends: a client must not care.

The JQL it evaluates -- anything else is a 400 in Jira's error-collection shape:
``project = P``, ``project != P``, ``project [not] in (A, B)``, the same for
``issuetype``; ``created`` with ``= != > >= < <=`` against a relative period
(``-90m``, ``-2h``, ``-1d``, ``-1w``, ``"-1w 2d"``) or an absolute date
(``"2026-11-30 08:15"``, ``"2026/11/30 08:15"``, ``2026-11-30``, ``2026/11/30``);
``AND`` (binding tighter), ``OR``, ``NOT``, parentheses; ``ORDER BY created|key
[ASC|DESC], ...``. An absolute date is read in ``timezone``, the searching user's
time zone in Jira, and ``created`` is written in it too; a relative one is counted
back from ``clock()``. Unknown projects and issue types are a 400, as in Jira.

Choices where we found no documentation: without ``ORDER BY`` the order is
``created DESC`` (then id); an ``ORDER BY`` field without a direction is ``ASC``.
Cloud pages are computed once, at the first page, over the ordered result, so
issues created during a walk shift nothing; Data Center's ``startAt`` pages are
recomputed on every request, so they do shift, as offsets do.

Faults: ``fail_next`` (a 5xx, optionally with ``Retry-After``) and
``rate_limit_next`` (429 with ``Retry-After``, ``X-RateLimit-Reset``,
``X-RateLimit-Limit``, ``X-RateLimit-Remaining`` and ``RateLimit-Reason``, as
https://developer.atlassian.com/cloud/jira/platform/rate-limiting/ describes them;
that page gives no body, so the fake sends an error collection). Every request
is recorded in ``requests``.

Not modelled: other endpoints (``POST`` search included), anonymous access (Cloud
answers an unauthenticated search as anonymous, not with a 401), Basic
credentials on Data Center, the Cloud site's 410 for the removed
``/rest/api/{2,3}/search``, token expiry (7 days), ``expand``, ``properties``,
``reconcileIssues``, ``names``/``schema``, ``warningMessages``, workflows (every
issue is "To Do"), edits (``updated`` is ``created``) and deletions.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import re
import secrets
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, tzinfo
from http import HTTPStatus
from typing import Any, NamedTuple
from urllib.parse import parse_qsl
from zoneinfo import ZoneInfo

from bench.fakes.server import Answer, FakeServer, ReceivedRequest

DEFAULT_MAX_RESULTS = 50
CLOUD_MAX_RESULTS = 100
DATA_CENTER_MAX_RESULTS = 1000
FIRST_ISSUE_ID = 10000
FIRST_PROJECT_ID = 10000
#: Jira does not publish its limits; any number will do for X-RateLimit-Limit.
RATE_LIMIT = 100
#: A documented RateLimit-Reason value: API rate limits breached.
RATE_LIMIT_REASON = "jira-quota-based"
#: Jira's 401 message in Atlassian's examples (tests/fixtures/jira_api/error-401.json).
NOT_LOGGED_IN = "User is not logged in."
BAD_PAGE_TOKEN = "Invalid format of nextPageToken"  # the documented 400's message
UNBOUNDED = (
    "Unbounded JQL queries are not allowed here. Please add a search restriction to your query."
)
DATE_FORMATS = ("%Y/%m/%d %H:%M", "%Y-%m-%d %H:%M", "%Y/%m/%d", "%Y-%m-%d")
BAD_DATE = (
    "Date value '{value}' for field 'created' is invalid. Valid formats include: "
    "'yyyy/MM/dd HH:mm', 'yyyy-MM-dd HH:mm', 'yyyy/MM/dd', 'yyyy-MM-dd', or a period "
    "format e.g. '-5d', '4w 2d'."
)
CONTENT_TYPE = "application/json;charset=UTF-8"

CLOUD_SEARCH = re.compile(r"/rest/api/(?P<version>[23])/search/jql")
DATA_CENTER_SEARCH = "/rest/api/2/search"
PROJECT_KEY = re.compile(r"[A-Z][A-Z0-9_]+")

#: The fields the fake knows, all navigable, in the order it writes them.
NAVIGABLE = ("summary", "description", "issuetype", "project", "status", "created", "updated")
#: A new site's issue types and their ids; other types get ids as they are used.
STANDARD_ISSUE_TYPES = {
    "Epic": "10000",
    "Task": "10001",
    "Story": "10002",
    "Sub-task": "10003",
    "Bug": "10004",
}
PERIOD_PART = re.compile(r"(\d+)([wdhm])")
PERIOD_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes"}


@dataclass(frozen=True)
class Issue:
    """One issue as the fake stores it."""

    id: int
    key: str
    project: str
    summary: str
    description: str | None
    created: datetime  # aware, UTC, to the millisecond as Jira keeps it
    issue_type: str

    @property
    def number(self) -> int:
        return int(self.key.rsplit("-", 1)[1])


@dataclass(frozen=True)
class _Fault:
    """An answer injected in place of the next request's: a server error or a rate limit."""

    status: int
    retry_after: int | None = None
    reason: str | None = None  # set: a rate limit


@dataclass(frozen=True)
class _Cursor:
    """Where a Cloud page starts: an offset into a search's result, fixed at its first page."""

    search: str
    jql: str
    ids: tuple[int, ...]
    offset: int


class JqlError(ValueError):
    """A JQL the fake cannot run; its text is Jira's error message."""


class _BadRequest(ValueError):
    """A 400 for a parameter other than the JQL."""


class FakeJira(FakeServer):
    """Jira's issue search on 127.0.0.1, on a free port, in a background thread.

    ``email`` and ``api_token`` are the Cloud endpoints' Basic credentials; ``pat``
    is Data Center's bearer token. ``timezone`` (an IANA name or a tzinfo) is the
    searching user's: absolute JQL dates are read in it and ``created`` is written
    in it. ``clock`` is the fake's now (aware), for relative dates and new issues.
    ``context_path`` (e.g. ``/jira``) puts the site below the root, as a Data
    Center site often is.
    """

    server_version = "FakeJira"

    def __init__(
        self,
        *,
        email: str = "ops@example.com",
        api_token: str = "jira-api-token",
        pat: str = "jira-pat",
        timezone: str | tzinfo = "UTC",
        clock: Callable[[], datetime] | None = None,
        context_path: str = "",
    ) -> None:
        super().__init__()
        self.email = email
        self.api_token = api_token
        self.pat = pat
        self.timezone: tzinfo = ZoneInfo(timezone) if isinstance(timezone, str) else timezone
        self.clock: Callable[[], datetime] = clock or (lambda: datetime.now(UTC))
        self.context_path = "/" + context_path.strip("/") if context_path.strip("/") else ""
        #: Cloud's maxResults is honoured up to this (and never past 100): Jira
        #: documents that it may return fewer issues a page than asked.
        self.page_size_cap = CLOUD_MAX_RESULTS
        self.requests: list[ReceivedRequest] = []
        self._issues: list[Issue] = []
        self._projects: dict[str, int] = {}  # key -> id
        self._issue_types = dict(STANDARD_ISSUE_TYPES)
        self._cursors: dict[str, _Cursor] = {}
        self._faults: deque[_Fault] = deque()
        self._issue_ids = itertools.count(FIRST_ISSUE_ID)
        # Handler threads and the test's thread share the issues and the cursors.
        self._lock = threading.Lock()

    def _query(self, raw: str) -> dict[str, str]:
        """A repeated parameter's values joined with commas, as Jira reads a
        repeated ``fields``."""
        query: dict[str, str] = {}
        for name, value in parse_qsl(raw, keep_blank_values=True):
            query[name] = f"{query[name]},{value}" if name in query else value
        return query

    def _path_prefix(self) -> str:
        return self.context_path  # the site URL, with its context path

    # -- the issues --------------------------------------------------------

    def add_project(self, key: str) -> str:
        """Make a project exist without issues: JQL naming an unknown project is a 400."""
        with self._lock:
            return self._project(key)

    def create_issue(
        self,
        *,
        project: str = "PROJ",
        summary: str,
        description: str | None = None,
        created_at: datetime | None = None,
        issue_type: str = "Task",
    ) -> dict[str, Any]:
        """Create ``{project}-{n}`` (numbered per project, with a numeric id) and
        return it as ``GET /rest/api/2/issue/{id}`` would show it. ``created_at``
        (aware) defaults to ``clock()``; an empty description is none, as in Jira."""
        if self._port is None:
            raise RuntimeError("start FakeJira before creating issues: their URLs name its port")
        created = _to_the_millisecond(_utc(created_at) if created_at else _utc(self.clock()))
        if not issue_type.strip():
            raise ValueError("an issue needs an issue type")
        with self._lock:
            key = self._project(project)
            number = 1 + sum(1 for issue in self._issues if issue.project == key)
            issue = Issue(
                id=next(self._issue_ids),
                key=f"{key}-{number}",
                project=key,
                summary=summary,
                description=description or None,
                created=created,
                issue_type=issue_type,
            )
            self._issue_types.setdefault(issue_type, str(10000 + len(self._issue_types)))
            self._issues.append(issue)
            return self._stored(issue)

    def issues(self) -> list[dict[str, Any]]:
        """Every issue, in the order created, as ``create_issue`` returned it."""
        with self._lock:
            return [self._stored(issue) for issue in self._issues]

    def _project(self, key: str) -> str:
        if not PROJECT_KEY.fullmatch(key):
            raise ValueError(f"not a Jira project key: {key!r} (e.g. PROJ)")
        self._projects.setdefault(key, FIRST_PROJECT_ID + len(self._projects))
        return key

    def _stored(self, issue: Issue) -> dict[str, Any]:
        return self._render(issue, version=2, fields=NAVIGABLE)

    # -- faults ------------------------------------------------------------

    def fail_next(self, n: int, status: int = 502, *, retry_after: int | None = None) -> None:
        """The next ``n`` requests, whatever they ask, answer ``status`` (a 5xx, usually).
        Jira documents that some transient 5xx come with ``Retry-After``."""
        HTTPStatus(status)  # a real status, or a ValueError now
        with self._lock:
            self._faults.extend(_Fault(status, retry_after) for _ in range(n))

    def rate_limit_next(
        self, n: int, *, retry_after: int = 1, reason: str = RATE_LIMIT_REASON
    ) -> None:
        """The next ``n`` requests are rate-limited: 429 with ``Retry-After`` seconds."""
        with self._lock:
            self._faults.extend(_Fault(429, retry_after, reason) for _ in range(n))

    # -- answering (called from the server's threads) ----------------------

    def _answer(self, request: ReceivedRequest) -> Answer:
        with self._lock:
            self.requests.append(request)
            answer = self._handle(request)
        return replace(answer, headers={"Content-Type": CONTENT_TYPE, **answer.headers})

    def _handle(self, request: ReceivedRequest) -> Answer:
        if self._faults:
            return self._fault_answer(self._faults.popleft())
        route = _within(request.path, self.context_path)
        cloud = CLOUD_SEARCH.fullmatch(route) if route is not None else None
        if cloud is None and route != DATA_CENTER_SEARCH:
            return _error(404, f"null for uri: {request.path}")
        if request.method != "GET":
            return _error(405, "Method Not Allowed")  # the fake has no POST search
        authorization = request.headers.get("authorization", "")
        try:
            if cloud is not None:
                if not self._basic_fits(authorization):
                    return _error(401, NOT_LOGGED_IN)
                return self._cloud_search(request.query, int(cloud["version"]))
            if not self._bearer_fits(authorization):
                return _error(401, NOT_LOGGED_IN)
            return self._data_center_search(request.query)
        except (JqlError, _BadRequest) as error:
            return _error(400, str(error))

    def _basic_fits(self, authorization: str) -> bool:
        scheme, _, credential = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(credential.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        return secrets.compare_digest(decoded, f"{self.email}:{self.api_token}")

    def _bearer_fits(self, authorization: str) -> bool:
        scheme, _, credential = authorization.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(credential.strip(), self.pat)

    def _cloud_search(self, query: dict[str, str], version: int) -> Answer:
        page_size = max(1, _page_size(query, min(CLOUD_MAX_RESULTS, self.page_size_cap)))
        fields = _selected_fields(query.get("fields"), default="id")
        jql = query.get("jql", "")
        token = query.get("nextPageToken")
        cursor = self._cursor(token, jql) if token else self._first_cursor(jql)
        ids = cursor.ids[cursor.offset : cursor.offset + page_size]
        by_id = {issue.id: issue for issue in self._issues}
        body: dict[str, Any] = {
            "isLast": cursor.offset + len(ids) >= len(cursor.ids),
            "issues": [self._render(by_id[i], version=version, fields=fields) for i in ids],
        }
        if not body["isLast"]:  # documented: no nextPageToken at all on the last page
            body["nextPageToken"] = self._next_token(cursor, cursor.offset + len(ids))
        return Answer(200, body)

    def _first_cursor(self, jql: str) -> _Cursor:
        where, order = self._parse(jql)
        if where is None:  # Cloud's enhanced search wants a bounded query
            raise JqlError(UNBOUNDED)
        ids = tuple(issue.id for issue in self._search(where, order))
        return _Cursor(search=secrets.token_hex(8), jql=jql, ids=ids, offset=0)

    def _cursor(self, token: str, jql: str) -> _Cursor:
        cursor = self._cursors.get(token)
        if cursor is None or cursor.jql != jql:  # a token only goes with its own query
            raise _BadRequest(BAD_PAGE_TOKEN)
        return cursor

    def _next_token(self, cursor: _Cursor, offset: int) -> str:
        # The same page asked again (a retry) hands out the same token; the token
        # says nothing a client could compute, like Jira's.
        digest = hashlib.sha256(f"{cursor.search}:{offset}".encode()).digest()
        token = base64.urlsafe_b64encode(digest).decode().rstrip("=")
        self._cursors[token] = replace(cursor, offset=offset)
        return token

    def _data_center_search(self, query: dict[str, str]) -> Answer:
        start_at = max(0, _int_param(query, "startAt", 0))
        page_size = _page_size(query, DATA_CENTER_MAX_RESULTS)
        fields = _selected_fields(query.get("fields"), default="*navigable")
        where, order = self._parse(query.get("jql", ""))
        found = self._search(where, order)
        page = found[start_at : start_at + page_size]
        body = {
            "expand": "names,schema",
            "issues": [self._render(issue, version=2, fields=fields) for issue in page],
            "maxResults": page_size,
            "startAt": start_at,
            "total": len(found),
        }
        return Answer(200, body)

    def _parse(self, jql: str) -> tuple[_Predicate | None, list[tuple[str, bool]]]:
        context = _JqlContext(
            now=_utc(self.clock()),
            timezone=self.timezone,
            projects={key: str(pid) for key, pid in self._projects.items()},
            issue_types=dict(self._issue_types),
        )
        return _JqlParser(jql, context).parse()

    def _search(self, where: _Predicate | None, order: list[tuple[str, bool]]) -> list[Issue]:
        found = [issue for issue in self._issues if where is None or where(issue)]
        return _ordered(found, order or [("created", True)])

    def _fault_answer(self, fault: _Fault) -> Answer:
        headers = {} if fault.retry_after is None else {"Retry-After": str(fault.retry_after)}
        if fault.reason is None:
            return replace(_error(fault.status, HTTPStatus(fault.status).phrase), headers=headers)
        reset = _utc(self.clock()) + timedelta(seconds=fault.retry_after or 0)
        headers |= {
            # Documented as the request's time plus Retry-After, as yyyy-MM-ddTHH:mmZ.
            "X-RateLimit-Reset": reset.strftime("%Y-%m-%dT%H:%MZ"),
            "X-RateLimit-Limit": str(RATE_LIMIT),
            "X-RateLimit-Remaining": "0",
            "RateLimit-Reason": fault.reason,
        }
        return replace(_error(429, "Rate limit exceeded."), headers=headers)

    # -- the issue, as an API version shows it -----------------------------

    def _render(
        self, issue: Issue, *, version: int, fields: tuple[str, ...] | None
    ) -> dict[str, Any]:
        if fields is None:  # fields=id: the issue's id and nothing else
            return {"id": str(issue.id)}
        api = f"{self.base_url}/rest/api/{version}"
        return {
            "expand": "",
            "fields": {name: self._field(issue, name, api, version) for name in fields},
            "id": str(issue.id),
            "key": issue.key,
            "self": f"{api}/issue/{issue.id}",
        }

    def _field(self, issue: Issue, name: str, api: str, version: int) -> Any:
        if name == "summary":
            return issue.summary
        if name == "description":
            if issue.description is None:
                return None
            return _adf(issue.description) if version == 3 else issue.description
        if name in ("created", "updated"):  # the fake edits nothing: updated is created
            return _jira_time(issue.created, self.timezone)
        if name == "issuetype":
            type_id = self._issue_types[issue.issue_type]
            return {
                "self": f"{api}/issuetype/{type_id}",
                "id": type_id,
                "name": issue.issue_type,
                "subtask": issue.issue_type == "Sub-task",
            }
        if name == "project":
            project_id = str(self._projects[issue.project])
            return {
                "self": f"{api}/project/{project_id}",
                "id": project_id,
                "key": issue.project,
                "name": issue.project,
                "projectTypeKey": "software",
            }
        return {"self": f"{api}/status/10000", "id": "10000", "name": "To Do"}  # status


# -- JQL -------------------------------------------------------------------------

_Predicate = Callable[[Issue], bool]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<op>>=|<=|!=|=|>|<|\(|\)|,)
      | (?P<word>[^\s=!<>(),"']+)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "order", "by", "asc", "desc"}
_FIELDS = {"project": "project", "issuetype": "issuetype", "type": "issuetype"}
_DATE_FIELDS = {"created": "created", "createddate": "created"}
_ORDER_FIELDS = {"created": "created", "createddate": "created", "key": "key", "issuekey": "key"}
_COMPARISONS: dict[str, Callable[[datetime, datetime], bool]] = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
}


class _Token(NamedTuple):
    kind: str  # "string", "op", "word" or "end"
    text: str
    at: int  # 1-based character, as Jira's messages count

    @property
    def value(self) -> str:
        if self.kind != "string":
            return self.text
        return re.sub(r"\\(.)", r"\1", self.text[1:-1])

    @property
    def shown(self) -> str:
        return "the end of the query" if self.kind == "end" else f"'{self.text}'"

    def keyword(self, *words: str) -> bool:
        return self.kind == "word" and self.text.lower() in words


@dataclass(frozen=True)
class _JqlContext:
    now: datetime
    timezone: tzinfo
    projects: dict[str, str]  # key -> id
    issue_types: dict[str, str]  # name -> id


class _JqlParser:
    """The fake's JQL: clauses on project, issuetype and created, AND/OR/NOT and
    parentheses, ORDER BY. It parses to a predicate over issues."""

    def __init__(self, jql: str, context: _JqlContext) -> None:
        self._tokens = _tokens(jql)
        self._at = 0
        self._context = context

    def parse(self) -> tuple[_Predicate | None, list[tuple[str, bool]]]:
        where = None  # only ORDER BY, or nothing: no restriction
        if not (self._peek().kind == "end" or self._peek().keyword("order")):
            where = self._or()
        order = self._order_by() if self._peek().keyword("order") else []
        end = self._peek()
        if end.kind != "end":
            raise _syntax(f"Expecting either 'OR' or 'AND' but got {end.shown}.", end)
        return where, order

    def _or(self) -> _Predicate:
        terms = [self._and()]
        while self._peek().keyword("or"):
            self._next()
            terms.append(self._and())
        return terms[0] if len(terms) == 1 else lambda issue: any(t(issue) for t in terms)

    def _and(self) -> _Predicate:
        terms = [self._unary()]
        while self._peek().keyword("and"):
            self._next()
            terms.append(self._unary())
        return terms[0] if len(terms) == 1 else lambda issue: all(t(issue) for t in terms)

    def _unary(self) -> _Predicate:
        token = self._peek()
        if token.keyword("not"):
            self._next()
            inner = self._unary()
            return lambda issue: not inner(issue)
        if token.text == "(" and token.kind == "op":
            self._next()
            inner = self._or()
            self._expect(")", "Expecting ')' before the end of the query.")
            return inner
        return self._clause()

    def _clause(self) -> _Predicate:
        name = self._next()
        if name.kind not in ("word", "string") or name.keyword(*_KEYWORDS):
            raise _syntax(f"Expecting a field name but got {name.shown}.", name)
        field_name = name.value.lower()
        if field_name in _DATE_FIELDS:
            return self._date_clause(name)
        if field_name in _FIELDS:
            return self._list_clause(_FIELDS[field_name], name)
        raise JqlError(
            f"Field '{name.value}' does not exist or you do not have permission to view it. "
            "(FakeJira evaluates only project, issuetype and created.)"
        )

    def _date_clause(self, name: _Token) -> _Predicate:
        operator = self._next()
        if operator.kind != "op" or operator.text not in _COMPARISONS:
            if operator.keyword("in", "not"):
                raise JqlError(
                    f"The operator '{operator.text}' is not supported by the 'created' field."
                )
            raise _syntax(f"Expecting operator but got {operator.shown}.", operator)
        value = self._value()
        moment = _moment(value.value, self._context)
        compare = _COMPARISONS[operator.text]
        return lambda issue: compare(issue.created, moment)

    def _list_clause(self, field_name: str, name: _Token) -> _Predicate:
        operator = self._next()
        negated = operator.keyword("not")
        if negated:
            operator = self._expect_keyword("in")
        if operator.keyword("in"):
            values = self._value_list()
        elif operator.kind == "op" and operator.text in ("=", "!="):
            negated = operator.text == "!="
            values = [self._value()]
        elif operator.kind == "op" and operator.text in _COMPARISONS:
            raise JqlError(
                f"The operator '{operator.text}' is not supported by the '{name.value}' field."
            )
        else:
            raise _syntax(f"Expecting operator but got {operator.shown}.", operator)
        wanted = {self._resolve(field_name, value.value) for value in values}
        attribute = "project" if field_name == "project" else "issue_type"
        return lambda issue: (getattr(issue, attribute) in wanted) != negated

    def _resolve(self, field_name: str, value: str) -> str:
        """A project by key or id, an issue type by name or id (case-insensitively),
        or Jira's 400 for a value that does not exist."""
        known = self._context.projects if field_name == "project" else self._context.issue_types
        for name, known_id in known.items():
            if value.lower() == name.lower() or value == known_id:
                return name
        raise JqlError(f"The value '{value}' does not exist for the field '{field_name}'.")

    def _value_list(self) -> list[_Token]:
        self._expect("(", "Expecting '(' after 'in'.")
        values = [self._value()]
        while self._peek().kind == "op" and self._peek().text == ",":
            self._next()
            values.append(self._value())
        self._expect(")", "Expecting ')' or ',' in the list of values.")
        return values

    def _value(self) -> _Token:
        token = self._next()
        if token.kind == "string" or (token.kind == "word" and not token.keyword(*_KEYWORDS)):
            return token
        raise _syntax(f"Expecting a value but got {token.shown}.", token)

    def _order_by(self) -> list[tuple[str, bool]]:
        self._next()  # ORDER
        self._expect_keyword("by")
        order = [self._sort_key()]
        while self._peek().kind == "op" and self._peek().text == ",":
            self._next()
            order.append(self._sort_key())
        return order

    def _sort_key(self) -> tuple[str, bool]:
        name = self._next()
        if name.kind not in ("word", "string") or name.keyword(*_KEYWORDS):
            raise _syntax(f"Expecting a field name but got {name.shown}.", name)
        sort_field = _ORDER_FIELDS.get(name.value.lower())
        if sort_field is None:
            raise JqlError(
                f"Field '{name.value}' does not exist or you do not have permission to view it. "
                "(FakeJira orders only by created and key.)"
            )
        descending = False
        if self._peek().keyword("asc", "desc"):
            descending = self._next().text.lower() == "desc"
        return sort_field, descending

    def _peek(self) -> _Token:
        return self._tokens[self._at]

    def _next(self) -> _Token:
        token = self._tokens[self._at]
        if token.kind != "end":
            self._at += 1
        return token

    def _expect(self, text: str, message: str) -> None:
        token = self._next()
        if token.kind != "op" or token.text != text:
            raise _syntax(message, token)

    def _expect_keyword(self, word: str) -> _Token:
        token = self._next()
        if not token.keyword(word):
            raise _syntax(f"Expecting '{word.upper()}' but got {token.shown}.", token)
        return token


def _tokens(jql: str) -> list[_Token]:
    tokens, at = [], 0
    while jql[at:].strip():
        match = _TOKEN.match(jql, at)
        if match is None:
            start = len(jql) - len(jql[at:].lstrip()) + 1
            raise _syntax(f"The character '{jql[start - 1]}' is not expected here.", start)
        kind = match.lastgroup or "word"
        tokens.append(_Token(kind, match[kind], match.start(kind) + 1))
        at = match.end()
    tokens.append(_Token("end", "", len(jql) + 1))
    return tokens


def _syntax(detail: str, where: _Token | int) -> JqlError:
    at = where.at if isinstance(where, _Token) else where
    return JqlError(f"Error in the JQL Query: {detail} (line 1, character {at})")


def _moment(value: str, context: _JqlContext) -> datetime:
    """A JQL date: a period back (or on) from now, or a date in the user's time zone."""
    period = _period(value)
    if period is not None:
        return context.now + period
    for form in DATE_FORMATS:
        try:
            local = datetime.strptime(value, form)
        except ValueError:
            continue
        return local.replace(tzinfo=context.timezone).astimezone(UTC)
    raise JqlError(BAD_DATE.format(value=value))


def _period(value: str) -> timedelta | None:
    """``-90m``, ``-1d``, ``"-1w 2d"``: a signed sum of weeks, days, hours, minutes."""
    sign = -1 if value.startswith("-") else 1
    parts = value.lstrip("+-").split()
    if not parts or not all(PERIOD_PART.fullmatch(part) for part in parts):
        return None
    total = timedelta()
    for part in parts:
        amount, unit = PERIOD_PART.fullmatch(part).groups()  # type: ignore[union-attr]
        total += timedelta(**{PERIOD_UNITS[unit]: int(amount)})
    return sign * total


def _ordered(issues: list[Issue], order: list[tuple[str, bool]]) -> list[Issue]:
    # A stable sort per key, last key first; ties fall to the id, in the first
    # key's direction, so every page of a walk sees one order.
    result = sorted(issues, key=lambda issue: issue.id, reverse=order[0][1])
    for sort_field, descending in reversed(order):
        result.sort(key=_sort_value(sort_field), reverse=descending)
    return result


def _sort_value(sort_field: str) -> Callable[[Issue], Any]:
    if sort_field == "key":  # by project, then by number: PROJ-10 after PROJ-9
        return lambda issue: (issue.project, issue.number)
    return lambda issue: issue.created


# -- parameters and shapes -------------------------------------------------------


def _int_param(query: dict[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise _BadRequest(f"The value '{raw}' is not valid for the parameter '{name}'.") from None


def _page_size(query: dict[str, str], cap: int) -> int:
    wanted = _int_param(query, "maxResults", DEFAULT_MAX_RESULTS)
    if wanted < 0:
        raise _BadRequest("The maxResults parameter must be zero or more.")
    return min(wanted, cap)


def _selected_fields(raw: str | None, *, default: str) -> tuple[str, ...] | None:
    """The fields to write, in the fake's order; None for ``id`` alone.

    ``*all`` and ``*navigable`` are every field the fake has, a name adds one, a
    ``-name`` takes one away (alone, from ``*navigable``, as documented), an
    unknown name is ignored, as Jira ignores it."""
    names = [name.strip() for name in (raw or default).split(",") if name.strip()]
    if not names or all(name == "id" for name in names):
        return None
    wanted = set(NAVIGABLE) if all(name.startswith("-") for name in names) else set()
    for name in names:
        if name in ("*all", "*navigable"):
            wanted |= set(NAVIGABLE)
        elif not name.startswith("-"):
            wanted.add(name)
    wanted -= {name[1:] for name in names if name.startswith("-")}
    return tuple(name for name in NAVIGABLE if name in wanted)


def _error(status: int, message: str) -> Answer:
    """Jira's error collection, as in Atlassian's examples."""
    return Answer(status, {"errorMessages": [message], "errors": {}})


def _adf(text: str) -> dict[str, Any]:
    """The text as an Atlassian Document Format document: a paragraph per blank-line
    separated block, a hard break per line break."""
    content = []
    for block in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")):
        if not block.strip():
            continue
        nodes: list[dict[str, Any]] = []
        for number, line in enumerate(block.split("\n")):
            if number:
                nodes.append({"type": "hardBreak"})
            if line:
                nodes.append({"type": "text", "text": line})
        content.append({"type": "paragraph", "content": nodes})
    return {"type": "doc", "version": 1, "content": content}


def _jira_time(moment: datetime, zone: tzinfo) -> str:
    """Jira's timestamp: ``2026-11-30T08:15:00.000+0000``, in the user's time zone."""
    local = moment.astimezone(zone)
    return f"{local:%Y-%m-%dT%H:%M:%S}.{local.microsecond // 1000:03d}{local:%z}"


def _within(path: str, context_path: str) -> str | None:
    if not context_path:
        return path
    if path == context_path or path.startswith(context_path + "/"):
        return path[len(context_path) :]
    return None


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError(f"give an aware datetime, not {moment!r}")
    return moment.astimezone(UTC)


def _to_the_millisecond(moment: datetime) -> datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)
