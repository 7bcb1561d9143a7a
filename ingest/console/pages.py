"""The console's pages: what operators read, and the few things they do.

Every page is rendered on the server from ``templates/`` by Jinja2 with
autoescaping on, so a webhook body's text -- an issue titled
``<script>...`` -- reaches the browser as text. Pages run no inline script
(the Content-Security-Policy in ``ingest.console.headers`` forbids it):
``static/console.js`` adds the live parts and the copy buttons.

A GET only reads. Each action is a POST from a form of the console (its CSRF
token and Origin are checked in ``ingest.console.auth``), by an operator,
and ends in a page that says what happened: the action's own answer, or a
redirect to the page it changed (``?done=...`` names one of ``NOTICES``).
What cannot be taken back is confirmed, never by a script's dialog: a
release, finishing a rotation and revoking a token take a name typed, a
replay with a warning a box ticked, each checked here, not only by the
browser's ``required``.

Everything a page shows is scoped to the token's workspaces, as the REST
API is: a workspace the token may not see, and its sources, deliveries and
tasks, are answered like ones that do not exist.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from ingest.console import auth, retries
from ingest.console.auth import PREFIX, Refused, User
from ingest.console.body import SHOWN_CHARS, SHOWN_DEPTH, shown_body
from ingest.rest import STATUS_OF_KIND, console_session_of
from ingest.runtime import IngressRuntime
from models import idempotency, retry_safe
from models.broker.lanes import Sender, lane_of
from models.console_sessions import SignedIn
from models.db import session_scope
from models.display import format_age, format_when
from models.errors import HolderChanged, NotReplayable, TaskStoreError
from models.inbox import BULK_REPLAYABLE, REPLAYABLE, DeliveryStatus, replay
from models.merges import list_merges, merge
from models.operations import (
    DeliveryFilter,
    bulk_replay,
    checked_named,
    count_replayable,
    list_operations,
)
from models.replay_plan import plan_replay
from models.reports import (
    LISTED_BACKLOGS,
    SourceSummary,
    WorkspaceSummary,
    deliveries_per_minute,
    gaps,
    inbox_stats,
    known_events,
    lineage,
    list_deliveries,
    list_source_summaries,
    list_workspaces,
    redacted_headers,
    show_delivery,
    task_named,
    timeline,
    workspace_backlogs,
)
from models.sources import add_secret, get_source, retire_older_secrets
from models.tables import Delivery, EventStream, Task, WebhookSource
from models.tokens import list_tokens, revoke_token, token_in_scope

T = TypeVar("T")

router = APIRouter(prefix=PREFIX, include_in_schema=False)

templates = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters["when"] = format_when
templates.filters["age"] = format_age


def web_link(url: str | None) -> str:
    """``url`` if a link to it is safe to follow (http or https), else ``""``.
    A task's source URL comes from a webhook body: a ``javascript:`` one is
    shown as text, never made a link."""
    if url and urlsplit(url).scheme in ("http", "https"):
        return url
    return ""


templates.filters["web_link"] = web_link
#: What the deliveries filter's date fields take (``_when`` reads it): a date,
#: and a 24-hour time if any.
templates.globals["WHEN_PATTERN"] = r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2})?)?"


def url_breaks(url: str) -> Markup:
    """``url`` as HTML that a narrow page wraps only after a ``/`` of its path,
    never inside a word or a slug (``acme-github``): each part is one unbroken
    span, a ``<wbr>`` between them. The text, and so what is copied, is the URL."""
    start = url.find("://") + 3 if "://" in url else 0
    head, *path = url[start:].split("/")
    parts = [url[:start] + head, *path]
    spans = [
        Markup("<span>{}</span>").format(part + ("/" if index < len(parts) - 1 else ""))
        for index, part in enumerate(parts)
    ]
    return Markup("<wbr>").join(spans)


templates.filters["url_breaks"] = url_breaks

#: How far back the overview's chart reaches.
CHART_HOURS = 3
PAGE_SIZE = 50

#: What a redirect after an action says (``?done=``): fixed words, never the
#: query's own text. An action of the task page answers with the page itself,
#: and its notice names the tasks by identifier (``ACME-3``).
NOTICES = {
    "replayed": "The delivery is queued again and sent to the worker.",
    "rotation-finished": "Rotation finished: only the newest secret verifies now.",
    "revoked": "The token is revoked; its sessions have ended.",
    "revoked-own": "Your own token is revoked: you are signed out. Sign in with another token.",
    "signed-out": "Signed out.",
    "replay-started": "Bulk replay done: its deliveries are queued and sent to the worker.",
}


def _runtime(request: Request) -> IngressRuntime:
    return request.app.state.runtime


def read(request: Request, work: Callable[[Session], T]) -> T:
    runtime = _runtime(request)
    with runtime.store_errors(), session_scope(runtime.sessions) as session:
        return work(session)


def render(
    request: Request, name: str, user: SignedIn | None, *, status: int = 200, **context: Any
) -> HTMLResponse:
    page = templates.get_template(name).render(
        request=request,
        user=user,
        principal=user.principal if user else None,
        csrf=user.csrf_token if user else None,
        prefix=PREFIX,
        new_key=retries.new_key,
        notice=NOTICES.get(request.query_params.get("done", "")),
        **context,
    )
    return HTMLResponse(page, status_code=status)


def error_page(request: Request, user: SignedIn | None, status: int, message: str) -> HTMLResponse:
    return render(request, "error.html", user, status=status, message=message)


def domain_error_page(request: Request, error: TaskStoreError) -> HTMLResponse:
    """A store error met on a console page, in the REST API's status and words."""
    status = STATUS_OF_KIND[error.kind]
    message = "temporarily unavailable; retry later" if status == 503 else str(error)
    return error_page(
        request, console_session_of(request) if status != 503 else None, status, message
    )


def _redirect(path: str, done: str | None = None) -> RedirectResponse:
    return RedirectResponse(path + (f"?done={done}" if done else ""), status_code=303)


@dataclass(frozen=True)
class Scope:
    """The workspaces the signed-in token may see, and their sources' slugs."""

    workspaces: list[WorkspaceSummary]
    sources: frozenset[str]

    @property
    def ids(self) -> frozenset[int]:
        return frozenset(workspace.id for workspace in self.workspaces)

    def by_slug(self, slug: str | None) -> WorkspaceSummary | None:
        return next((w for w in self.workspaces if w.slug == slug), None)


def _sources(request: Request, session: Session, scope: Scope) -> list[SourceSummary]:
    """The scope's sources. Their last deliveries come from the process's one
    reader, which /metrics shares: it reads only what was stored since."""
    return list_source_summaries(
        session=session,
        workspace_ids=scope.ids,
        last_deliveries=_runtime(request).metrics.last_deliveries,
    )


def scope_of(session: Session, user: SignedIn) -> Scope:
    caller = user.principal.caller
    workspaces = [w for w in list_workspaces(session=session) if caller.may_access(w.id)]
    sources = session.scalars(
        select(WebhookSource.slug).where(WebhookSource.workspace_id.in_([w.id for w in workspaces]))
    )
    return Scope(workspaces, frozenset(sources))


# --- signing in and out --------------------------------------------------------------------


@router.get("/sign-in")
def sign_in_form(request: Request, next: str | None = None) -> HTMLResponse:
    return _sign_in_page(request, next_path=next)


def _sign_in_page(
    request: Request, *, next_path: str | None, status: int = 200, error: str | None = None
) -> HTMLResponse:
    holder = Response()
    csrf = auth.new_sign_in_form(holder, request)
    page = render(
        request,
        "sign_in.html",
        None,
        status=status,
        sign_in_csrf=csrf,
        next_path=auth.safe_next(next_path),
        error=error,
    )
    for name, value in holder.raw_headers:
        if name == b"set-cookie":
            page.raw_headers.append((name, value))
    return page


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    form = await request.form()
    next_path = str(form.get("next") or "")
    if not auth.sign_in_form_is_ours(request, form):
        return _sign_in_page(
            request,
            next_path=next_path,
            status=403,
            error="This sign-in form is out of date; sign in again.",
        )
    token = str(form.get("token") or "")
    limits = auth.sign_in_limits(request)
    address = auth.client_address(request)
    if wait := limits.retry_after(address, token):
        # Refused before the token is checked: else guesses would go on.
        auth.log_refused(request, None, f"too many wrong tokens, retry after {wait} s")
        page = _sign_in_page(
            request,
            next_path=next_path,
            status=429,
            error=f"Too many wrong tokens from here or for this token; try again in {wait} s.",
        )
        page.headers["Retry-After"] = str(wait)
        return page
    started = await run_in_threadpool(auth.sign_in, request, token) if token.strip() else None
    if started is None:
        limits.failed(address, token)
        await run_in_threadpool(auth.log_refused, request, token, "not a valid token")
        return _sign_in_page(
            request,
            next_path=next_path,
            status=401,
            error="That token is not valid, or it was revoked.",
        )
    response = _redirect(auth.safe_next(next_path))
    auth.set_session_cookie(response, request, started)
    return response


@router.post("/sign-out")
async def sign_out(request: Request, user: User) -> Response:
    await auth.checked_form(request, user)
    response = _redirect(f"{PREFIX}/sign-in", "signed-out")
    await run_in_threadpool(auth.sign_out, request, response)
    return response


# --- overview --------------------------------------------------------------------------------


@router.get("/")
def overview(request: Request, user: User) -> HTMLResponse:
    now = datetime.now(UTC)

    def work(session: Session) -> dict[str, Any]:
        scope = scope_of(session, user)
        stats = inbox_stats(session=session, workspace_ids=scope.ids, now=now)
        backlogs = workspace_backlogs(
            session=session, top=LISTED_BACKLOGS, now=now, workspace_ids=scope.ids
        )
        rate = deliveries_per_minute(
            session=session,
            since=now - timedelta(hours=CHART_HOURS),
            now=now,
            workspace_ids=scope.ids,
        )
        summaries = _sources(request, session, scope)
        sources = {s.slug for s in summaries}
        # A paused source's backlog grows until someone resumes it: said
        # beside the backlogs, so that nobody forgets one.
        paused = [s for s in summaries if s.paused_at is not None]
        found = gaps(
            session=session, heartbeat_seconds=_runtime(request).settings.ingress_heartbeat_seconds
        )
        streams = dict(
            session.execute(
                select(EventStream.workspace_id, EventStream.last_position).where(
                    EventStream.workspace_id.in_(scope.ids)
                )
            ).all()
        )
        return {
            "stats": stats,
            "backlogs": backlogs,
            "paused_sources": paused,
            "chart": {
                "minutes": [int(minute.timestamp()) for minute in rate.minutes],
                "counts": rate.counts,
            },
            "catch_ups": [run for run in found.last_catch_ups if run.source in sources],
            # Each window with the command that covers it (models.catchup.catch_up_command).
            "uncovered": [
                (source, window, found.command(source, window), found.mark_command(source, window))
                for source, windows in found.uncovered.items()
                if source in sources
                for window in windows
            ],
            "workspaces": [(w, streams.get(w.id, 0)) for w in scope.workspaces],
        }

    context = read(request, work)
    return render(request, "overview.html", user, page="overview", hours=CHART_HOURS, **context)


# --- deliveries ------------------------------------------------------------------------------


def _when(value: str | None, what: str) -> datetime | None:
    """A date and time the filter's field took (``2026-12-02 04:21``, or with a
    ``T``, seconds or an offset), taken as UTC when it names no offset."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise Refused(400, f"{what}: {value!r} is not a date and time") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _filter_from(values: Any, scope: Scope) -> DeliveryFilter:
    """The deliveries filter a query string or a form names, within ``scope``."""
    status = values.get("status") or None
    if status is not None and status not in {s.value for s in DeliveryStatus}:
        raise Refused(400, f"status: {status!r} is not a delivery status")
    source = values.get("source") or None
    if source is not None and source not in scope.sources:
        # Another workspace's source answers like one that does not exist.
        raise Refused(404, f"no source {source!r}")
    return DeliveryFilter(
        status=status,
        source=source,
        event=values.get("event") or None,
        received_from=_when(values.get("since"), "since"),
        received_until=_when(values.get("until"), "until"),
        search=(values.get("q") or "").strip() or None,
        workspace_ids=scope.ids,
    )


def _filter_fields(values: Any) -> dict[str, str]:
    """The filter's fields as the form sent them, to carry into the next form."""
    names = ("status", "source", "event", "since", "until", "q")
    return {name: str(values.get(name)) for name in names if values.get(name)}


def _before(value: str | None) -> int | None:
    if not value:
        return None
    if not value.isdigit() or not 1 <= int(value) <= 2**31 - 1:
        raise Refused(400, f"before: {value!r} is not a delivery id")
    return int(value)


@router.get("/deliveries")
def deliveries(request: Request, user: User) -> HTMLResponse:
    values = request.query_params
    fields = _filter_fields(values)

    def work(session: Session) -> dict[str, Any]:
        scope = scope_of(session, user)
        context: dict[str, Any] = {
            "sources": _sources(request, session, scope),
            "events": known_events(session=session, workspace_ids=scope.ids),
        }
        try:
            found = _filter_from(values, scope)
            before = _before(values.get("before"))
        except Refused as refused:
            return context | {"error": refused.message, "status": refused.status, "page_of": None}
        except TaskStoreError as invalid:  # the filter's own checks (models.operations)
            return context | {"error": str(invalid), "status": 400, "page_of": None}
        return context | {
            "page_of": list_deliveries(
                session=session, filter=found, limit=PAGE_SIZE, before=before
            ),
            "before": before,
        }

    context = read(request, work)
    page_of = context.get("page_of")
    rows = page_of.deliveries if page_of else []
    template = "delivery_rows.html" if values.get("fragment") == "rows" else "deliveries.html"
    return render(
        request,
        template,
        user,
        status=context.pop("status", 200),
        page="deliveries",
        fields=fields,
        statuses=[status.value for status in DeliveryStatus],
        rows=rows,
        live_after=max((row.id for row in rows), default=_newest_id(request)),
        watch=[row.id for row in rows if row.status in _IN_WORK],
        older=_older_link(fields, page_of.next_before) if page_of else None,
        replayable_statuses=sorted(BULK_REPLAYABLE),
        **context,
    )


_IN_WORK = {DeliveryStatus.QUEUED.value, DeliveryStatus.PROCESSING.value}


def _newest_id(request: Request) -> int:
    return read(
        request,
        lambda session: (
            session.scalar(select(Delivery.id).order_by(Delivery.id.desc()).limit(1)) or 0
        ),
    )


def _older_link(fields: dict[str, str], next_before: int | None) -> str | None:
    if next_before is None:
        return None
    return f"{PREFIX}/deliveries?" + urlencode(fields | {"before": str(next_before)})


@router.get("/deliveries/{delivery_id:int}")
def delivery(request: Request, user: User, delivery_id: int) -> HTMLResponse:
    def work(session: Session) -> dict[str, Any]:
        scope = scope_of(session, user)
        detail = show_delivery(session=session, delivery_pk=delivery_id)
        if scope.by_slug(detail.workspace) is None:
            raise Refused(404, f"delivery {delivery_id} not found")
        body, headers = session.execute(
            select(Delivery.body, Delivery.headers).where(Delivery.id == delivery_id)
        ).one()
        found, events = None, []
        if detail.summary.external_id:
            found = lineage(
                session=session,
                workspace_slug=detail.workspace,
                external_id=detail.summary.external_id,
            )
            events = timeline(found)
        try:
            plan = plan_replay(session=session, delivery_pk=delivery_id)
        except NotReplayable:
            plan = None
        return {
            "detail": detail,
            "plan": plan,
            "headers": redacted_headers(headers or {}),
            "body": shown_body(body or b""),
            "timeline": events,
            "found": found,
        }

    context = read(request, work)
    return render(
        request,
        "delivery.html",
        user,
        page="deliveries",
        replayable=context["detail"].summary.status in REPLAYABLE,
        shown_kib=SHOWN_CHARS // 1024,
        shown_depth=SHOWN_DEPTH,
        **context,
    )


#: What a download of a body is served as, by the media type it came with:
#: only these; anything else is plain bytes.
_DOWNLOAD_TYPES = {
    "application/json": "json",
    "application/x-www-form-urlencoded": "txt",
    "text/plain": "txt",
}


@router.get("/deliveries/{delivery_id:int}/body")
def delivery_body(request: Request, user: User, delivery_id: int) -> Response:
    """The delivery's body byte for byte, as a download: what its page shows
    only in part (``ingest.console.body``). Seen by whoever sees the page."""

    def work(session: Session) -> tuple[bytes, str | None]:
        detail = show_delivery(session=session, delivery_pk=delivery_id)
        if scope_of(session, user).by_slug(detail.workspace) is None:
            raise Refused(404, f"delivery {delivery_id} not found")
        if detail.body_dropped:
            raise Refused(
                404, f"delivery {delivery_id}: {detail.body_dropped}; nothing to download"
            )
        body = session.scalar(select(Delivery.body).where(Delivery.id == delivery_id))
        return body or b"", detail.content_type

    body, content_type = read(request, work)
    media_type = (content_type or "").split(";")[0].strip().lower()
    extension = _DOWNLOAD_TYPES.get(media_type)
    if extension is None:
        media_type, extension = "application/octet-stream", "bin"
    return Response(
        body,
        media_type=media_type,
        headers={
            "content-disposition": (
                f'attachment; filename="delivery-{delivery_id}-body.{extension}"'
            )
        },
    )


@router.post("/deliveries/{delivery_id:int}/replay")
async def replay_one(request: Request, user: User, delivery_id: int) -> Response:
    form = await auth.checked_form(request, user)
    auth.require_operator(user, "Replaying a delivery")
    consent = str(form.get("consent") or "")

    def visible_then_once(session: Session) -> bool:
        scope = scope_of(session, user)
        detail = show_delivery(session=session, delivery_pk=delivery_id)
        if scope.by_slug(detail.workspace) is None:
            raise Refused(404, f"delivery {delivery_id} not found")
        return retries.once(
            session,
            retries.form_retry(request, user, form),
            action=idempotency.Action.REPLAY,
            target=f"delivery {delivery_id}",
            body={"consent": consent},
            work=work,
        )[1]

    def work(session: Session) -> str:
        # As the CLI asks even a script: a replay that runs a resent body or
        # creates again a deleted task needs the box beside its warning ticked.
        plan = plan_replay(session=session, delivery_pk=delivery_id)
        if plan.needs_consent and consent != "yes":
            raise Refused(
                400,
                f"Delivery {delivery_id} was not replayed: {plan.warning}. Tick the box "
                "beside the warning to replay it anyway.",
            )
        replay(session=session, delivery_pk=delivery_id)
        return "replayed"

    replayed = await run_in_threadpool(read, request, visible_then_once)
    # Committed: only now may a worker see the message (store, commit, enqueue);
    # a form sent again enqueued it the first time.
    if not replayed:
        _runtime(request).relay.submit(delivery_id, lane_of(Sender.OPERATOR_REPLAY))
    return _redirect(f"{PREFIX}/deliveries/{delivery_id}", "replayed")


# --- bulk replay -----------------------------------------------------------------------------


@router.post("/replays/dry-run")
async def replay_dry_run(request: Request, user: User) -> HTMLResponse:
    form = await auth.checked_form(request, user)
    auth.require_operator(user, "A bulk replay")

    def work(session: Session) -> dict[str, Any]:
        found = _filter_from(form, scope_of(session, user))
        return {"count": count_replayable(session=session, filter=found), "criteria": found}

    context = await run_in_threadpool(read, request, work)
    return render(
        request, "dry_run.html", user, page="deliveries", fields=_filter_fields(form), **context
    )


@router.post("/replays")
async def replay_matching(request: Request, user: User) -> Response:
    form = await auth.checked_form(request, user)
    auth.require_operator(user, "A bulk replay")
    runtime = _runtime(request)
    expected = str(form.get("expected") or "")
    scope = await run_in_threadpool(read, request, lambda s: scope_of(s, user))

    lane = lane_of(Sender.BULK_REPLAY)

    def publish(keys: list[int]) -> None:
        for key in keys:
            runtime.relay.submit(key, lane)

    def work() -> None:
        with runtime.store_errors():
            bulk_replay(
                sessions=runtime.sessions,
                filter=_filter_from(form, scope),
                name=str(form.get("name") or ""),
                operator=user.principal.name,
                expected=int(expected) if expected.isdigit() else None,
                send=publish,
                # Ticked one by one on the dry run's page: a task created again.
                named=checked_named(form.getlist("recreate")),
                # Sent again (a double click), the form starts no second run.
                retry=retries.form_retry(request, user, form),
            )

    await run_in_threadpool(work)
    return _redirect(f"{PREFIX}/operations", "replay-started")


@router.get("/operations")
def operations(request: Request, user: User) -> HTMLResponse:
    found = read(
        request,
        lambda session: list_operations(session=session, workspace_ids=scope_of(session, user).ids),
    )
    return render(request, "operations.html", user, page="operations", operations=found)


# --- tasks and releases ----------------------------------------------------------------------


@router.get("/tasks")
def task(request: Request, user: User) -> HTMLResponse:
    slug = request.query_params.get("workspace") or None
    external_id = (request.query_params.get("external_id") or "").strip()
    return _task_page(request, user, slug, external_id)


def _task_page(
    request: Request,
    user: SignedIn,
    slug: str | None,
    external_id: str,
    *,
    status: int = 200,
    error: str | None = None,
    notice: str | None = None,
) -> HTMLResponse:
    def work(session: Session) -> dict[str, Any]:
        scope = scope_of(session, user)
        workspace = scope.by_slug(slug) or (scope.workspaces[0] if scope.workspaces else None)
        context: dict[str, Any] = {"workspaces": scope.workspaces, "workspace": workspace}
        if not external_id or workspace is None:
            return context
        # No workspace named (a link, a typed URL): the one the form shows.
        if slug is not None and scope.by_slug(slug) is None:
            return context | {"error": f"no workspace {slug!r}"}
        found = lineage(session=session, workspace_slug=workspace.slug, external_id=external_id)
        merges = (
            list_merges(session=session, caller=user.principal.caller, task_id=found.holder.id)
            if found.holder is not None
            else []
        )
        return context | {"found": found, "timeline": timeline(found), "merges": merges}

    context = read(request, work)
    found_error = context.pop("error", None)
    error = error or found_error
    return render(
        request,
        "task.html",
        user,
        status=status if not (error and status == 200) else 404,
        page="tasks",
        external_id=external_id,
        error=error,
        action_notice=notice,
        **context,
    )


@router.post("/tasks/release")
async def release(request: Request, user: User) -> HTMLResponse:
    form = await auth.checked_form(request, user)
    auth.require_operator(user, "Releasing an identity")
    slug = str(form.get("workspace") or "")
    external_id = str(form.get("external_id") or "").strip()
    expected = str(form.get("expected_holder") or "").strip()
    reason = str(form.get("reason") or "")
    confirm = str(form.get("confirm") or "").strip()

    def work(session: Session) -> str:
        scope = scope_of(session, user)
        workspace = scope.by_slug(slug)
        if workspace is None:
            raise Refused(404, f"no workspace {slug!r}")
        retry = retries.form_retry(request, user, form)
        if confirm != external_id:
            raise Refused(400, f"Type the external id ({external_id}) to confirm the release.")
        holder = task_named(session=session, workspace_slug=slug, identifier=expected)
        if holder is None:
            raise Refused(
                400,
                f"Expected holder: no task {expected!r} in workspace {slug}; "
                "give the identifier of the task you looked at (like ACME-12).",
            )
        retry_safe.release(
            session=session,
            caller=user.principal.caller,
            workspace_id=workspace.id,
            external_id=external_id,
            operator=user.principal.name,
            reason=reason,
            expected_task_id=holder.id,
            retry=retry,
        )
        return (
            f"Released {external_id}: {holder.identifier} stays, without it. "
            "The next create for this identity makes a new task."
        )

    try:
        notice = await run_in_threadpool(read, request, work)
    except HolderChanged as changed:
        # The model's words name the expected task by its row id; the operator typed its identifier.
        answer = partial(
            _task_page,
            status=409,
            error=f"{external_id} is held by {changed.identifier}, not by {expected} "
            "(the task you named); nothing was released.",
        )
    except (Refused, TaskStoreError) as error:
        status, message = (
            (error.status, error.message)
            if isinstance(error, Refused)
            else (STATUS_OF_KIND[error.kind], str(error))
        )
        answer = partial(_task_page, status=status, error=message)
    else:
        answer = partial(_task_page, notice=notice)
    return await run_in_threadpool(answer, request, user, slug, external_id)


def _acted(
    request: Request, user: SignedIn, slug: str, external_id: str, work: Callable[[Session], str]
) -> HTMLResponse:
    """Run an action of the task page, then show the page with the notice the
    action returns, or its refusal."""
    try:
        notice = read(request, work)
    except (Refused, TaskStoreError) as error:
        status, message = (
            (error.status, error.message)
            if isinstance(error, Refused)
            else (STATUS_OF_KIND[error.kind], str(error))
        )
        return _task_page(request, user, slug, external_id, status=status, error=message)
    return _task_page(request, user, slug, external_id, notice=notice)


@router.post("/tasks/merge")
async def merge_tasks(request: Request, user: User) -> HTMLResponse:
    """Merge another task's names into the task shown (docs/contract.md §15, item 10)."""
    form = await auth.checked_form(request, user)
    auth.require_operator(user, "Merging two tasks")
    slug = str(form.get("workspace") or "")
    external_id = str(form.get("external_id") or "").strip()
    into = str(form.get("into") or "").strip()
    from_identifier = str(form.get("from") or "").strip()
    confirm = str(form.get("confirm") or "").strip()
    reason = str(form.get("reason") or "")

    def visible_then_once(session: Session) -> str:
        if scope_of(session, user).by_slug(slug) is None:
            raise Refused(404, f"no workspace {slug!r}")
        return retries.once(
            session,
            retries.form_retry(request, user, form),
            action=idempotency.Action.MERGE,
            target=f"task {into}",
            body={"from": from_identifier, "reason": reason.strip()},
            work=work,
        )[0]

    def work(session: Session) -> str:
        if not into.isdigit():
            raise Refused(400, "The task to merge into is missing; look it up again.")
        if confirm != from_identifier:
            raise Refused(400, f"Type the identifier ({from_identifier}) to confirm the merge.")
        from_task = task_named(session=session, workspace_slug=slug, identifier=from_identifier)
        if from_task is None:
            raise Refused(
                400,
                f"No task {from_identifier!r} in workspace {slug}: give an identifier "
                "like ACME-12.",
            )
        if from_task.id == int(into):
            raise Refused(
                400,
                f"{from_identifier} cannot be merged into itself: name another task to merge "
                "into it.",
            )
        done = merge(
            session=session,
            caller=user.principal.caller,
            into_task_id=int(into),
            from_task_id=from_task.id,
            operator=user.principal.name,
            reason=reason,
        )
        into_identifier = _identifier(session, done.into_task_id)
        return (
            f"Merged {from_task.identifier} into {into_identifier}: its names are aliases of "
            f"{into_identifier} now, and {from_task.identifier} is archived."
        )

    return await run_in_threadpool(_acted, request, user, slug, external_id, visible_then_once)


@router.post("/merges/{merge_id:int}/undo")
async def undo_merge(request: Request, user: User, merge_id: int) -> HTMLResponse:
    """Undo a merge from its audit row on the task page."""
    form = await auth.checked_form(request, user)
    auth.require_operator(user, "Undoing a merge")
    slug = str(form.get("workspace") or "")
    external_id = str(form.get("external_id") or "").strip()
    reason = str(form.get("reason") or "")

    def undo(session: Session) -> str:
        # Another workspace's merge answers as one that does not exist, replayed or not;
        # a form sent again shows the notice the first one did.
        undone, _replayed = retry_safe.unmerge(
            session=session,
            caller=user.principal.caller,
            merge_id=merge_id,
            operator=user.principal.name,
            reason=reason,
            retry=retries.form_retry(request, user, form),
        )
        from_identifier = _identifier(session, undone.from_task_id)
        return (
            f"Undone: the names merged into {_identifier(session, undone.into_task_id)} are "
            f"{from_identifier}'s again."
        )

    return await run_in_threadpool(_acted, request, user, slug, external_id, undo)


def _identifier(session: Session, task_id: int) -> str:
    """A task's identifier (``ACME-3``), for a notice; its id if it is gone."""
    return session.scalar(select(Task.identifier).where(Task.id == task_id)) or f"task {task_id}"


# --- sources ---------------------------------------------------------------------------------


@router.get("/sources")
def sources(request: Request, user: User) -> HTMLResponse:
    return _sources_page(request, user)


def _sources_page(
    request: Request, user: SignedIn, *, status: int = 200, error: str | None = None
) -> HTMLResponse:
    found = read(
        request,
        lambda session: _sources(request, session, scope_of(session, user)),
    )
    settings = _runtime(request).settings
    return render(
        request,
        "sources.html",
        user,
        status=status,
        error=error,
        page="sources",
        sources=[(source, settings.webhook_url(source.provider, source.slug)) for source in found],
    )


def _visible_source(session: Session, user: SignedIn, slug: str):
    source = get_source(session=session, slug=slug)
    if not user.principal.caller.may_access(source.workspace_id):
        raise Refused(404, f"no source {slug!r}")
    return source


@router.post("/sources/{slug}/rotate-secret")
async def rotate_secret(request: Request, user: User, slug: str) -> HTMLResponse:
    form = await auth.checked_form(request, user)
    auth.require_operator(user, "Rotating a secret")
    secret = secrets.token_urlsafe(32)

    def work(session: Session):
        _visible_source(session, user, slug)
        added = []

        def add(session: Session) -> str:
            added.append(add_secret(session=session, slug=slug, new_secret=secret))
            return "rotated"

        retries.once(
            session,
            retries.form_retry(request, user, form),
            action=idempotency.Action.ROTATE_SECRET,
            target=f"source {slug}",
            body={},
            work=add,
        )
        return added[0] if added else None

    source = await run_in_threadpool(read, request, work)
    if source is None:
        # The form was sent again: its secret was added and shown the first
        # time, and is never shown twice; no second one was added.
        return await run_in_threadpool(
            partial(
                _sources_page,
                status=409,
                error=f"This form rotated {slug}'s secret already and showed it then; "
                "nothing changed. Rotate again for another secret.",
            ),
            request,
            user,
        )
    page = render(request, "secret.html", user, page="sources", source=source, secret=secret)
    # Shown once: no cache, no history entry a back button could bring back.
    page.headers["Cache-Control"] = "no-store"
    return page


@router.post("/sources/{slug}/finish-rotation")
async def finish_rotation(request: Request, user: User, slug: str) -> Response:
    """Retire every secret of the source but the newest, once its slug is typed
    (as a release takes its external id): a sender still signing with an older
    secret is refused from then on."""
    form = await auth.checked_form(request, user)
    auth.require_operator(user, "Finishing a rotation")
    confirm = str(form.get("confirm") or "").strip()

    def work(session: Session) -> None:
        _visible_source(session, user, slug)
        if confirm != slug:
            raise Refused(
                400,
                f"Type the source's name ({slug}) to confirm finishing its rotation; "
                "nothing changed.",
            )
        retries.once(
            session,
            retries.form_retry(request, user, form),
            action=idempotency.Action.FINISH_ROTATION,
            target=f"source {slug}",
            body={},
            work=lambda session: f"retired {retire_older_secrets(session=session, slug=slug)}",
        )

    try:
        await run_in_threadpool(read, request, work)
    except Refused as refused:
        if refused.status != 400:
            raise
        return await run_in_threadpool(
            partial(_sources_page, status=400, error=refused.message), request, user
        )
    return _redirect(f"{PREFIX}/sources", "rotation-finished")


# --- tokens ----------------------------------------------------------------------------------


@router.get("/tokens")
def tokens(request: Request, user: User) -> HTMLResponse:
    return _tokens_page(request, user)


def _tokens_page(
    request: Request, user: SignedIn, *, status: int = 200, error: str | None = None
) -> HTMLResponse:
    def work(session: Session) -> dict[str, Any]:
        scope = scope_of(session, user)
        slugs = {w.id: w.slug for w in scope.workspaces}
        # A token that may also see a workspace of someone else's is shown
        # (it can see one of ours), but is not ours to revoke.
        revocable = {
            token.id
            for token, workspaces in list_tokens(session=session)
            if set(workspaces) <= scope.ids
        }
        return {
            "tokens": [
                (token, [slugs[w] for w in workspaces], token.id in revocable)
                for token, workspaces in list_tokens(session=session, workspace_ids=scope.ids)
            ]
        }

    return render(
        request,
        "tokens.html",
        user,
        status=status,
        error=error,
        page="tokens",
        own_token=user.principal.token_id,
        **read(request, work),
    )


@router.post("/tokens/{token_id:int}/revoke")
async def revoke(request: Request, user: User, token_id: int) -> Response:
    """Revoke a token once its name is typed (as a release takes its external
    id). Revoking the token one is signed in with ends one's own session: the
    answer is the sign-in page, which says so."""
    form = await auth.checked_form(request, user)
    auth.require_operator(user, "Revoking a token")
    confirm = str(form.get("confirm") or "").strip()

    def work(session: Session) -> None:
        # Scoped first, sent again or not: another workspace's token answers 404.
        token_in_scope(
            session=session, token_id=token_id, workspace_ids=scope_of(session, user).ids
        )
        retries.once(
            session,
            retries.form_retry(request, user, form),
            action=idempotency.Action.REVOKE_TOKEN,
            target=f"token {token_id}",
            body={"confirm": confirm},
            work=revoke_confirmed,
        )

    def revoke_confirmed(session: Session) -> str:
        record = revoke_token(
            session=session, token_id=token_id, workspace_ids=scope_of(session, user).ids
        )
        if confirm != record.name:
            # Raised inside the session scope: the revocation and the key are rolled back.
            raise Refused(
                400,
                f"Type the token's name ({record.name}) to confirm revoking it; nothing changed.",
            )
        return "revoked"

    try:
        await run_in_threadpool(read, request, work)
    except Refused as refused:
        if refused.status != 400:
            raise
        return await run_in_threadpool(
            partial(_tokens_page, status=400, error=refused.message), request, user
        )
    if token_id == user.principal.token_id:
        response = _redirect(f"{PREFIX}/sign-in", "revoked-own")
        await run_in_threadpool(auth.sign_out, request, response)
        return response
    return _redirect(f"{PREFIX}/tokens", "revoked")
