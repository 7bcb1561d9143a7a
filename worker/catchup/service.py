"""Catch up a source: recover the create deliveries its sender failed to get through.

Three kinds of run, each recorded as a ``catchup_runs`` row whose
``covered_until`` (set only when the run read its whole window) is the next
run's cursor:

- ``log`` (:func:`catch_up_github`): GitHub's delivery log, below;
- ``scan`` (:func:`scan_github`): a repository's issues and pull requests
  created since a time, for what is older than the log;
- ``search`` (:func:`catch_up_jira`): a Jira site's issues created since a time;
- ``gitlab`` (:func:`catch_up_gitlab`): a GitLab hook's recorded events, as the
  log below, then a scan of the project's or group's issues and merge requests.

The log: GitHub never redelivers a delivery that failed. A run lists the hook's log
since the source's cursor, groups the attempts by ``guid`` (constant across
redeliveries), and for every create delivery the inbox does not hold fetches
what GitHub sent and stores it through the ingress's own reading
(``models.intake.incoming_delivery``) under its guid, marked ``catch-up``:
a later real redelivery of it is then a duplicate, and so is this copy of a
delivery the ingress took meanwhile (``models.inbox.same_payload``: the two
are compared by their payload, not their bytes), and the task is created
once, by the worker, as for any delivery. Recovered deliveries commit in
small batches (at most :data:`STORE_BATCH`), each sent to the worker once
committed, so a run cut off halfway loses nothing it stored, and the next
run finds those in the inbox and does not store them twice.

A scan and a search have no delivery to fetch: they synthesize one per item
-- ``issues.opened``/``pull_request.opened`` with the item as GitHub lists it,
``jira:issue_created`` with the issue as Jira's search gives it -- under the
delivery id ``scan:<external id>``, marked ``scan``, and store it through the
same reading. An item whose scan delivery the inbox holds, or whose identity
the workspace has had a task for (held, or released by an operator), is left
alone: running a scan again and again stores nothing twice, and never undoes
a release.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import httpx
from sqlalchemy.orm import Session, sessionmaker

from models import tracing
from models.catchup import (
    GITHUB_LOG_RETENTION,
    GITLAB_KIND,
    GitLabSettings,
    JiraSettings,
    LogSettings,
    checked_repo,
    confirm_hook,
    gitlab_settings,
    held_from_hook,
    jira_settings,
    known_delivery_ids,
    known_identities,
    log_settings,
    window_start,
)
from models.db import session_scope
from models.errors import DeliveryRefused, InvalidSource
from models.inbox import DeliveryStatus, IncomingDelivery, record_delivery
from models.intake import incoming_delivery, kept_header_names, read_delivery
from models.providers import PROVIDERS, Provider
from models.sources import VerifyingSource, verifying_source
from models.tables import CatchUpRun, utcnow
from worker.catchup.api import BadCredentials, CatchUpError
from worker.catchup.github_issues import AppInstallation, IssueListing, ListedItem
from worker.catchup.github_log import (
    AppJwt,
    AttemptNotFound,
    DeliveryLog,
    LoggedAttempt,
    missed_creates,
)
from worker.catchup.gitlab_api import GitLabApi, GitLabItem, HookEvent
from worker.catchup.jira_search import FoundIssue, JiraSearch

log = logging.getLogger(__name__)

ORIGIN = "catch-up"  # deliveries.origin of a delivery fetched from the provider's log
SCAN_ORIGIN = "scan"  # deliveries.origin of one synthesized from an item's state
SCAN_ID_PREFIX = "scan:"
#: The most recovered deliveries one transaction stores. A commit per
#: delivery spent more than the row did (docs/performance.md); a batch cut off
#: is stored by the next run, none of it having been sent.
STORE_BATCH = 50
#: How many fetched deliveries may wait for the store: the log is read one
#: request at a time (as GitHub asks of a client), ahead of the store.
PREFETCHED = 200
#: How many attempts of a hook's log are checked against the inbox at once
#: while confirming the hook: one page of GitHub's.
PAGE_CHECK = 100
GITHUB = PROVIDERS["github"]
JIRA = PROVIDERS["jira"]
GITLAB = PROVIDERS["gitlab"]

#: Hands the keys of stored deliveries, committed, to the worker.
Send = Callable[[list[int]], None]
LogFactory = Callable[[LogSettings], DeliveryLog]
ListingFactory = Callable[[LogSettings, str], IssueListing]
SearchFactory = Callable[[JiraSettings], JiraSearch]
GitLabFactory = Callable[[GitLabSettings], GitLabApi]


@dataclass
class CatchUpReport:
    """What one run read and did."""

    run_id: int
    source: str
    kind: str
    started_at: datetime
    since: datetime
    dry_run: bool
    #: Log attempts, or items (issues, pull requests) listed.
    attempts_listed: int = 0
    #: Distinct deliveries (guids) among the attempts, or items created since.
    deliveries_listed: int = 0
    #: Delivery ids of the creates the inbox did not hold (guids, or
    #: ``scan:<external id>``).
    missed: list[str] = field(default_factory=list)
    #: Inbox rows stored for them (or, with ``redeliver``, attempts GitHub was
    #: asked to redeliver).
    recovered: list[int] = field(default_factory=list)
    #: Delivery ids the ingress's reading refused, with why.
    refused: dict[str, str] = field(default_factory=dict)
    covered_until: datetime | None = None
    #: A GitLab run's: the hook whose events it read (None: it read none), and
    #: how many items its scan listed.
    hook_id: str | None = None
    #: Why the hook's events were not read, when GitLab refused them.
    hook_note: str | None = None
    items_listed: int = 0


@dataclass(frozen=True)
class _Found:
    """A delivery to store: fetched from a log, or synthesized by a scan."""

    delivery_id: str
    headers: httpx.Headers
    body: bytes


def open_log(settings: LogSettings) -> DeliveryLog:
    return DeliveryLog(hook_path=settings.hook_path, **_github_credential(settings))


def open_listing(settings: LogSettings, repo: str) -> IssueListing:
    """The issue listing of ``repo``: with the source's token, or an App's
    installation token for it, which the App's JWT mints."""
    if settings.token is not None:
        return IssueListing(api_base_url=settings.api_base_url, token=settings.token)
    with AppInstallation(**_github_credential(settings)) as app:
        token = app.token_for(repo)
    return IssueListing(api_base_url=settings.api_base_url, token=token)


def open_search(settings: JiraSettings) -> JiraSearch:
    return JiraSearch(site_url=settings.site_url, token=settings.token, email=settings.email)


def open_gitlab(settings: GitLabSettings) -> GitLabApi:
    return GitLabApi(api_base_url=settings.api_base_url, token=settings.token)


def _github_credential(settings: LogSettings) -> dict[str, Any]:
    if settings.token is not None:
        return {"api_base_url": settings.api_base_url, "token": settings.token}
    app = AppJwt(app_id=settings.app_id, private_key=settings.private_key)
    return {"api_base_url": settings.api_base_url, "authorization": app}


def catch_up_github(
    *,
    sessions: sessionmaker[Session],
    slug: str,
    send: Send,
    since: datetime | None = None,
    dry_run: bool = False,
    redeliver: bool = False,
    open_log: LogFactory = open_log,
) -> CatchUpReport:
    """One catch-up of GitHub source ``slug`` from its hook's delivery log;
    see the module docstring.

    ``send`` hands the keys of a stored batch to the worker (after its commit);
    ``redeliver`` asks GitHub to send each missed delivery again instead of
    fetching it. Raises the domain's errors for a source that cannot be
    caught up, and ``worker.catchup.api.CatchUpError`` when GitHub's API
    refuses or is down -- recorded on the run first.
    """
    settings, source, report = _start(sessions, GITHUB, slug, "log", since, dry_run, log_settings)

    def read(report: CatchUpReport) -> None:
        hook = settings
        if settings.unconfirmed:
            hook = _confirmed_hook(sessions, settings, open_log, dry_run=dry_run)
        with open_log(hook) as delivery_log:
            _read_log(sessions, delivery_log, source, report, send, redeliver)

    return _run(sessions, report, read, covers=True)


def _confirmed_hook(
    sessions: sessionmaker[Session], settings: LogSettings, open_log: LogFactory, *, dry_run: bool
) -> LogSettings:
    """The settings of the first of the hooks the source's deliveries named
    whose own log lists a delivery the inbox holds from the source under that
    hook: ``X-GitHub-Hook-ID`` is outside the signature, so a header alone
    never picks the log a run reads (nor stores from). The hook found is
    recorded on the source's access (unless a dry run), and later runs read
    it without asking again. Raises :class:`InvalidSource` when none is
    confirmed; the last candidate's error when none could be read at all."""
    since = utcnow() - GITHUB_LOG_RETENTION
    unread: CatchUpError | None = None
    read_any = False
    for hook_id in settings.unconfirmed:
        candidate = settings.with_hook(hook_id)
        try:
            with open_log(candidate) as delivery_log:
                confirmed = _lists_held(sessions, delivery_log, settings, hook_id, since)
        except BadCredentials as error:  # no such hook, or not one this credential reads
            unread = error
            continue
        read_any = True
        if confirmed:
            if not dry_run:
                with session_scope(sessions) as session:
                    target = settings.hook_path.rpartition("/hooks/")[0]
                    confirm_hook(
                        session=session,
                        source_id=settings.source_id,
                        target=target,
                        hook_id=hook_id,
                    )
            log.info("catch-up %s: hook %s confirmed by its delivery log", settings.slug, hook_id)
            return candidate
    if unread is not None and not read_any:
        raise unread
    raise InvalidSource(
        f"source {settings.slug!r}: no hook its deliveries named "
        f"({', '.join(settings.unconfirmed)}) lists a delivery the inbox holds from it; "
        f"taskhook source catch-up {settings.slug} ... --hook-id ID"
    )


def _lists_held(
    sessions: sessionmaker[Session],
    delivery_log: DeliveryLog,
    settings: LogSettings,
    hook_id: str,
    since: datetime,
) -> bool:
    """Whether hook ``hook_id``'s log lists a delivery the inbox holds from the
    source under that hook, read a page at a time up to the first found."""
    guids: list[str] = []
    for attempt in delivery_log.attempts(since=since):
        guids.append(attempt.guid)
        if len(guids) == PAGE_CHECK:
            if _held_from(sessions, settings, hook_id, guids):
                return True
            guids = []
    return bool(guids) and _held_from(sessions, settings, hook_id, guids)


def _held_from(
    sessions: sessionmaker[Session], settings: LogSettings, hook_id: str, guids: list[str]
) -> bool:
    with session_scope(sessions) as session:
        return held_from_hook(
            session=session, source_id=settings.source_id, hook_id=hook_id, delivery_ids=guids
        )


def scan_github(
    *,
    sessions: sessionmaker[Session],
    slug: str,
    send: Send,
    since: datetime | None = None,
    repo: str | None = None,
    dry_run: bool = False,
    open_listing: ListingFactory = open_listing,
) -> CatchUpReport:
    """One scan of GitHub source ``slug``: the issues and pull requests of
    ``repo`` (by default the repository whose hook the source reads) created
    since ``since``, each create the workspace never had stored as a
    synthesized delivery. A scan of the source's own repository covers the
    source up to when it began; a scan of one repository of an organization's
    or App's hook does not (its other repositories were not read)."""
    if repo is not None:
        checked_repo(repo)

    def scannable(settings: LogSettings) -> None:
        if repo is None and settings.repo is None:
            raise InvalidSource(
                f"source {slug!r} reads {settings.hook_path}, not one repository: "
                "name the repository to scan (--repo OWNER/REPO)"
            )

    settings, source, report = _start(
        sessions, GITHUB, slug, "scan", since, dry_run, log_settings, check=scannable
    )
    repo = repo or settings.repo

    def read(report: CatchUpReport) -> None:
        with open_listing(settings, repo) as listing:
            repository_id = listing.repository_id(repo)
            items = list(listing.created_since(repo, since=report.since))
        report.attempts_listed = report.deliveries_listed = len(items)
        synthesized = (_github_item(repo, repository_id, item) for item in items)
        _store_synthesized(sessions, GITHUB, source, report, send, synthesized)

    return _run(sessions, report, read, covers=repo == settings.repo)


def catch_up_jira(
    *,
    sessions: sessionmaker[Session],
    slug: str,
    send: Send,
    since: datetime | None = None,
    dry_run: bool = False,
    open_search: SearchFactory = open_search,
) -> CatchUpReport:
    """One search of Jira source ``slug``'s site: the issues created since
    ``since`` (by default the last run's end) that the source's filter
    matches, each the workspace never had stored as a synthesized
    ``jira:issue_created``."""
    settings, source, report = _start(sessions, JIRA, slug, "search", since, dry_run, jira_settings)

    def read(report: CatchUpReport) -> None:
        with open_search(settings) as search:
            issues = list(search.created_since(since=report.since, jql=settings.jql))
        report.attempts_listed = report.deliveries_listed = len(issues)
        _store_synthesized(
            sessions, JIRA, source, report, send, (_jira_issue(issue) for issue in issues)
        )

    return _run(sessions, report, read, covers=True)


def catch_up_gitlab(
    *,
    sessions: sessionmaker[Session],
    slug: str,
    send: Send,
    since: datetime | None = None,
    dry_run: bool = False,
    open_api: GitLabFactory = open_gitlab,
) -> CatchUpReport:
    """One catch-up of GitLab source ``slug``: first its hook's recorded
    events (the configured hook, else the one of the project's or group's
    hooks that posts to the source's route), each create delivery the inbox
    does not hold stored under its own delivery id, as the log of GitHub's;
    then the issues and merge requests created since ``since``, each the
    workspace never had -- nor the events just read held -- stored as a
    synthesized ``open``. GitLab stops sending to a hook that keeps failing,
    so only the scan covers the window."""
    settings, source, report = _start(
        sessions, GITLAB, slug, GITLAB_KIND, since, dry_run, gitlab_settings
    )

    def read(report: CatchUpReport) -> None:
        with open_api(settings) as api:
            report.hook_id = settings.hook_id or api.hook_of(settings.owner, slug)
            logged: set[str] = set()
            if report.hook_id is not None:
                try:
                    events = list(
                        api.hook_events(settings.owner, report.hook_id, since=report.since)
                    )
                except BadCredentials as refused:
                    # A GitLab before 17.3, or a token that may read issues but not
                    # the hook (Maintainer): the scan still covers the window.
                    report.hook_note = str(refused)
                else:
                    logged = _store_hook_events(sessions, source, report, send, events)
            items = list(api.created_since(settings.owner, since=report.since))
        # Issues and merge requests, merged newest first, as one listing is.
        items.sort(key=lambda item: item.created_at, reverse=True)
        report.items_listed = len(items)
        report.deliveries_listed += len(items)
        synthesized = (_gitlab_item(item) for item in items)
        _store_synthesized(sessions, GITLAB, source, report, send, synthesized, skip=logged)

    return _run(sessions, report, read, covers=True)


def _store_hook_events(
    sessions: sessionmaker[Session],
    source: VerifyingSource,
    report: CatchUpReport,
    send: Send,
    events: list[HookEvent],
) -> set[str]:
    """Store, oldest first, each create delivery among ``events`` the inbox
    does not hold; the external ids of every create delivery read, stored
    or held already, which the scan then leaves alone."""
    report.attempts_listed = len(events)
    by_id: dict[str, tuple[_Found, str | None]] = {}
    for event in reversed(events):  # listed newest first; a retry repeats its delivery
        headers = {k: v for k, v in event.headers.items() if k.lower() != "x-gitlab-token"}
        if event.payload is None:
            report.refused[f"hook event {event.id}"] = (
                "GitLab kept no body (too large to log); the scan reads its item"
            )
            continue
        body = _json_body(event.payload)
        delivery_id = GITLAB.delivery_id(headers, body)
        name = GITLAB.event_of(headers, event.payload)
        if delivery_id is None or name not in source.create_events:
            continue
        external_id = read_delivery(GITLAB, name, event.payload, source.site_url).external_id
        by_id.setdefault(
            delivery_id, (_Found(delivery_id, httpx.Headers(headers), body), external_id)
        )
    report.deliveries_listed = len(by_id)
    with session_scope(sessions) as session:
        held = known_delivery_ids(session=session, source_id=source.id, delivery_ids=list(by_id))
    missing = [found for delivery_id, (found, _) in by_id.items() if delivery_id not in held]
    report.missed += [found.delivery_id for found in missing]
    if not report.dry_run:
        _store_all(sessions, GITLAB, source, iter(missing), ORIGIN, report, send)
    return {external_id for _, external_id in by_id.values() if external_id is not None}


def _start(
    sessions: sessionmaker[Session],
    provider: Provider,
    slug: str,
    kind: str,
    since: datetime | None,
    dry_run: bool,
    settings_of: Callable[..., Any],
    *,
    check: Callable[[Any], None] | None = None,
) -> tuple[Any, VerifyingSource, CatchUpReport]:
    """The source's access, the source, and the run's row, committed: a run
    that stops is recorded as stopped, not lost. ``check`` may refuse the
    access first, before there is a run to record."""
    started = utcnow()
    with session_scope(sessions) as session:
        settings = settings_of(session=session, slug=slug)
        if check is not None:
            check(settings)
        source = verifying_source(session=session, provider=provider.name, slug=slug)
        if source is None:
            raise InvalidSource(f"source {slug!r} is disabled; enable it to catch it up")
        since = since or window_start(session=session, source_id=source.id, now=started)
        run = CatchUpRun(
            source_id=source.id, kind=kind, since=since, dry_run=dry_run, started_at=started
        )
        session.add(run)
        session.flush()
        report = CatchUpReport(
            run_id=run.id,
            source=slug,
            kind=kind,
            started_at=started,
            since=since,
            dry_run=dry_run,
        )
    return settings, source, report


def _run(
    sessions: sessionmaker[Session],
    report: CatchUpReport,
    read: Callable[[CatchUpReport], None],
    *,
    covers: bool,
) -> CatchUpReport:
    try:
        read(report)
    except Exception as error:
        _record(sessions, report, error=f"{type(error).__name__}: {error}")
        raise
    # Read up to when this run began: the next run's cursor.
    report.covered_until = report.started_at if covers and not report.dry_run else None
    _record(sessions, report)
    return report


def _read_log(
    sessions: sessionmaker[Session],
    delivery_log: DeliveryLog,
    source: VerifyingSource,
    report: CatchUpReport,
    send: Send,
    redeliver: bool,
) -> None:
    attempts = list(delivery_log.attempts(since=report.since))
    report.attempts_listed = len(attempts)
    report.deliveries_listed = len({attempt.guid for attempt in attempts})

    def known(guids: list[str]) -> set[str]:
        with session_scope(sessions) as session:
            return known_delivery_ids(session=session, source_id=source.id, delivery_ids=guids)

    missed = missed_creates(attempts, known_guids=known, create_events=source.create_events)
    report.missed = [attempt.guid for attempt in missed]
    if report.dry_run:
        return
    if redeliver:
        for attempt in missed:
            delivery_log.redeliver(attempt.id)
            report.recovered.append(attempt.id)
        return
    # Closed however the store ends: the reader thread stops with it.
    fetch = functools.partial(_fetched, delivery_log, report=report)
    with contextlib.closing(_read_ahead(fetch, missed)) as fetched:
        _store_all(sessions, GITHUB, source, fetched, ORIGIN, report, send)


def _read_ahead(
    fetch: Callable[[LoggedAttempt], _Found | None], attempts: list[LoggedAttempt]
) -> Iterator[_Found]:
    """What ``fetch`` gives for each attempt, in order, fetched one at a time
    on a thread of its own while the caller stores what came before. An error
    of ``fetch`` is raised here, after what came before it; when the caller
    stops, so does the thread, after the request in flight."""
    ready: queue.Queue[object] = queue.Queue(maxsize=PREFETCHED)
    stopped = threading.Event()
    end = object()

    def reader() -> None:
        try:
            for attempt in attempts:
                if stopped.is_set():
                    return
                found = fetch(attempt)
                if found is not None:
                    _put(found)
            _put(end)
        except BaseException as error:  # handed to the caller, raised there
            _put(error)

    def _put(item: object) -> None:
        while not stopped.is_set():
            try:
                ready.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    # The caller's context goes with it: its requests are spans of the
    # catch-up's trace, and its log lines carry the run's ids.
    in_context = functools.partial(contextvars.copy_context().run, reader)
    thread = threading.Thread(target=in_context, name="catch-up-read-ahead", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not end:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stopped.set()
        thread.join()


def _fetched(
    delivery_log: DeliveryLog, attempt: LoggedAttempt, *, report: CatchUpReport
) -> _Found | None:
    """What GitHub sent for ``attempt``; None when it left the log since it was listed."""
    try:
        sent = delivery_log.request_of(attempt.id)
    except AttemptNotFound as error:
        report.refused[attempt.guid] = str(error)
        return None
    # GitHub's log keeps the payload as JSON, not the bytes it signed: the
    # body is rebuilt from it, as JSON whatever the hook's content type. It
    # was read from GitHub's API with the source's own credential, which
    # stands in for the signature.
    return _Found(attempt.guid, httpx.Headers(sent.headers), _json_body(sent.payload))


def _github_item(repo: str, repository_id: int, listed: ListedItem) -> tuple[str, str, _Found]:
    """The ``issues.opened`` or ``pull_request.opened`` GitHub would have sent
    for ``listed``: what to call it, the event, and the delivery (its id set
    by the caller). The repository's ``id`` makes the item's stable key the
    webhooks' own, whatever the repository was called when they were sent."""
    repository = {"id": repository_id, "full_name": repo, "name": repo.partition("/")[2]}
    if listed.pull_request:
        name = "pull_request"
        payload = {"action": "opened", "number": listed.number, "pull_request": listed.item}
    else:
        name, payload = "issues", {"action": "opened", "issue": listed.item}
    payload["repository"] = repository
    headers = httpx.Headers({GITHUB.event_header: name})
    return f"{repo}#{listed.number}", f"{name}.opened", _Found("", headers, _json_body(payload))


def _jira_issue(found: FoundIssue) -> tuple[str, str, _Found]:
    """The ``jira:issue_created`` Jira would have sent for ``found``."""
    event = "jira:issue_created"
    payload = {
        # When it was made, not when the issue was: the body's own send time.
        "timestamp": int(time.time() * 1000),
        "webhookEvent": event,
        "issue": found.issue,
    }
    return found.key, event, _Found("", httpx.Headers(), _json_body(payload))


def _gitlab_item(listed: GitLabItem) -> tuple[str, str, _Found]:
    """The ``open`` webhook GitLab would have sent for ``listed``: the item's
    fields where a webhook's ``object_attributes`` has them, so its external
    id and stable key are the webhook's own."""
    item = listed.item
    attributes = {
        "id": item.get("id"),
        "iid": listed.iid,
        "title": item.get("title"),
        "description": item.get("description"),
        "state": item.get("state"),
        "created_at": item.get("created_at"),
        "url": item.get("web_url"),
        "confidential": item.get("confidential"),
        "action": "open",
    }
    merge_request = listed.hook == "Merge Request Hook"
    payload = {
        "object_kind": "merge_request" if merge_request else "issue",
        "event_type": "merge_request" if merge_request else "issue",
        "project": {"id": item.get("project_id"), "path_with_namespace": listed.project_path},
        "object_attributes": attributes,
    }
    headers = httpx.Headers({GITLAB.event_header: listed.hook})
    marker = "!" if merge_request else "#"
    label = f"{listed.project_path}{marker}{listed.iid}"
    return label, f"{listed.hook}.open", _Found("", headers, _json_body(payload))


def _store_synthesized(
    sessions: sessionmaker[Session],
    provider: Provider,
    source: VerifyingSource,
    report: CatchUpReport,
    send: Send,
    synthesized: Iterable[tuple[str, str, _Found]],
    *,
    skip: AbstractSet[str] = frozenset(),
) -> None:
    """Store, oldest first, each synthesized create the workspace never had
    (nor ``skip`` names: external ids another read of this run holds)."""
    by_id: dict[str, tuple[str, _Found]] = {}
    for label, event, found in synthesized:
        if event not in source.create_events:
            continue  # the source makes no task of it (say, pull requests)
        payload = json.loads(found.body)
        external_id = read_delivery(provider, event, payload, source.site_url).external_id
        if external_id is None:
            report.refused[label] = "it names no external id the worker could use"
            continue
        if external_id in skip:
            continue
        by_id[external_id] = (event, replace(found, delivery_id=SCAN_ID_PREFIX + external_id))
    with session_scope(sessions) as session:
        held = known_identities(
            session=session, workspace_id=source.workspace_id, external_ids=list(by_id)
        )
        stored = known_delivery_ids(
            session=session,
            source_id=source.id,
            delivery_ids=[found.delivery_id for _, found in by_id.values()],
        )
    missing = [
        found
        for external_id, (_, found) in reversed(by_id.items())  # listed newest first
        if external_id not in held and found.delivery_id not in stored
    ]
    report.missed += [found.delivery_id for found in missing]
    if report.dry_run:
        return
    _store_all(sessions, provider, source, iter(missing), SCAN_ORIGIN, report, send)


def _store_all(
    sessions: sessionmaker[Session],
    provider: Provider,
    source: VerifyingSource,
    found: Iterator[_Found],
    origin: str,
    report: CatchUpReport,
    send: Send,
) -> None:
    """Store each of ``found`` through the ingress's own reading, a batch per
    transaction; hand each new, queued row to the worker once its batch is
    committed."""
    batch: list[IncomingDelivery] = []
    try:
        for one in found:
            incoming = _incoming(provider, source, one, report)
            if incoming is not None:
                batch.append(
                    replace(
                        incoming,
                        origin=origin,
                        catchup_run_id=report.run_id,
                        trace_context=tracing.current_traceparent(),
                    )
                )
            if len(batch) >= STORE_BATCH:
                full, batch = batch, []
                _store_batch(sessions, full, report, send)
    except CatchUpError:
        # The provider stopped answering: what was read before is kept.
        if batch:
            _store_batch(sessions, batch, report, send)
        raise
    if batch:
        _store_batch(sessions, batch, report, send)


def _store_batch(
    sessions: sessionmaker[Session],
    batch: list[IncomingDelivery],
    report: CatchUpReport,
    send: Send,
) -> None:
    with session_scope(sessions) as session:
        recorded = [record_delivery(session=session, incoming=incoming) for incoming in batch]
    log.info("catch-up %s: stored %d deliveries", report.source, len(batch))
    stored = [one.pk for one in recorded if one.is_new and one.status is DeliveryStatus.QUEUED]
    report.recovered += stored
    if stored:
        send(stored)  # committed first: a message never names a row that might not exist


def _incoming(
    provider: Provider, source: VerifyingSource, found: _Found, report: CatchUpReport
) -> IncomingDelivery | None:
    """The inbox row of ``found``, read as the ingress reads a delivery;
    None, with why on the report, when the ingress would refuse it."""
    headers = found.headers
    headers["content-type"] = "application/json"
    try:
        incoming, _known = incoming_delivery(
            provider,
            source,
            delivery_id=found.delivery_id,
            headers=headers,
            body=found.body,
            body_sha256=hashlib.sha256(found.body).hexdigest(),
            kept_headers=_kept(provider, headers),
            max_age_seconds=0,  # read from the provider's API, not replayed by a stranger
        )
    except DeliveryRefused as refused:
        report.refused[found.delivery_id] = str(refused)
        return None
    return incoming


def _kept(provider: Provider, headers: Mapping[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in kept_header_names(provider) if name in headers}


def _json_body(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def _record(
    sessions: sessionmaker[Session], report: CatchUpReport, *, error: str | None = None
) -> None:
    with session_scope(sessions) as session:
        run = session.get(CatchUpRun, report.run_id)
        run.finished_at = utcnow()
        run.covered_until = report.covered_until
        run.attempts_listed = report.attempts_listed
        run.deliveries_listed = report.deliveries_listed
        run.missed = len(report.missed)
        run.recovered = len(report.recovered)
        run.error = error
