"""``taskhook``: the operator's command line, and every step of ``docs/runbook.md``.

A thin shell over the same service functions the worker and the ingress use
(``models.workspaces``, ``models.sources``, ``models.inbox``, ``models.tasks``)
and the read-only ``models.reports``. Each command opens one unit of work,
calls one service, commits, and only then talks to the broker.

For people, commands print aligned plain-text tables; for scripts, every
command takes ``--json`` and prints one JSON document on stdout. Exit codes:

- 0: done;
- 1: refused or not found (unknown workspace, source or delivery, an invalid
  external id, a duplicate, a declined confirmation, an unreachable database
  or broker) -- one line on stderr, never a traceback;
- 2: a usage error, as click reports it (a missing option, an unknown event);
- 3: ``release`` sent its request but no operator worker answered in time, so
  the outcome is unknown (the request may still run when a worker starts).

Nothing is built at import: the settings, the engine and the Celery app are
made when a command runs (the app only by the commands that send a message).
Secrets are printed exactly once -- when ``taskhook`` generates one -- and
never listed.
"""

from __future__ import annotations

import getpass
import json
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from ingest import github, jira
from models.db import make_engine, make_session_factory, session_scope
from models.errors import TaskStoreError
from models.external_id import InvalidExternalId
from models.inbox import DeliveryStatus, replay
from models.messages import DELIVERIES_QUEUE, OPERATOR_QUEUE, PROCESS_DELIVERY, RELEASE_IDENTITY
from models.reports import (
    MAX_PAGE,
    DeliveryDetail,
    DeliverySummary,
    Lineage,
    TaskView,
    get_workspace,
    inbox_stats,
    lineage,
    list_deliveries,
    list_source_summaries,
    list_workspaces,
    show_delivery,
    timeline,
)
from models.settings import Settings
from models.sources import (
    PROVIDERS,
    add_secret,
    add_source,
    retire_older_secrets,
    set_source_enabled,
)
from models.tables import utcnow
from models.tokens import Role, issue_token, list_tokens, revoke_token
from models.workspaces import DEFAULT_STEPS, StepSpec, create_workspace

#: Per provider: the adapter's handled events (what ``--events`` may name) and its defaults.
ADAPTERS = {
    "github": (github.HANDLED_EVENTS, github.DEFAULT_CREATE_EVENTS),
    "jira": (jira.HANDLED_EVENTS, jira.DEFAULT_CREATE_EVENTS),
}

DEFAULT_RELEASE_TIMEOUT_SECONDS = 30.0

#: Exit code of a release whose request went out but got no answer.
EXIT_NO_ANSWER = 3


def load_celery_app() -> Any:
    """The Celery app, imported only by the commands that send a message.

    A module-level hook: tests replace it with a fake app to see what would
    be sent without a broker.
    """
    from worker.celery_app import app

    return app


# --- errors ---------------------------------------------------------------------------


class Refused(click.ClickException):
    """A user mistake or a refusal: one line on stderr, exit 1."""

    exit_code = 1


class NoAnswer(click.ClickException):
    exit_code = EXIT_NO_ANSWER


def _redacted(url: str) -> str:
    """``url`` without its password, safe to print."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _database_refusal(error: DBAPIError, url: str) -> Refused:
    reason = _first_line(error.orig if error.orig is not None else error)
    # SQLite says "no such table"; PostgreSQL's undefined_table is SQLSTATE 42P01.
    if "no such table" in reason or getattr(error.orig, "sqlstate", None) == "42P01":
        return Refused(
            f"the database at {url} has no taskhook tables yet: run `taskhook db upgrade`"
        )
    if isinstance(error, IntegrityError):  # a concurrent change won a unique constraint
        return Refused(f"the database refused the change: {reason}")
    return Refused(f"cannot use the database at {url}: {reason}")


class _TaskhookGroup(click.Group):
    """The root group: turns the models' domain errors into one-line refusals."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (TaskStoreError, InvalidExternalId) as error:
            raise Refused(str(error)) from None
        except DBAPIError as error:
            runtime = ctx.find_object(_Runtime)
            url = runtime.database_url_for_people if runtime else "?"
            raise _database_refusal(error, url) from None


# --- per-invocation runtime: settings, engine, sessions -----------------------------


class _Runtime:
    """What a command needs, built on first use: nothing at import, nothing unused."""

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._engine: Engine | None = None
        self._sessions: sessionmaker[Session] | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            # Settings() rather than the process-wide cached get_settings(): each
            # invocation reads the environment as it is now.
            try:
                self._settings = Settings()
            except ValidationError as error:
                first = error.errors()[0]
                where = "".join(f"TASKHOOK_{str(part).upper()}: " for part in first["loc"][:1])
                raise Refused(f"invalid settings: {where}{first['msg']}") from None
        return self._settings

    @property
    def database_url_for_people(self) -> str:
        try:
            return make_url(self.settings.database_url).render_as_string(hide_password=True)
        except ArgumentError:
            return "<invalid TASKHOOK_DATABASE_URL>"

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            try:
                self._engine = make_engine(self.settings.database_url, settings=self.settings)
            except ArgumentError as error:
                raise Refused(f"invalid TASKHOOK_DATABASE_URL: {_first_line(error)}") from None
        return self._engine

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One unit of work: commits when the block ends, rolls back on error."""
        if self._sessions is None:
            self._sessions = make_session_factory(self.engine)
        with session_scope(self._sessions) as session:
            yield session

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


pass_runtime = click.make_pass_decorator(_Runtime)


# --- output ---------------------------------------------------------------------------


def json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document, for scripts."
    )(command)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, frozenset | set):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def emit_json(document: Any) -> None:
    if is_dataclass(document) and not isinstance(document, type):
        document = asdict(document)
    click.echo(json.dumps(document, indent=2, ensure_ascii=False, default=_jsonable))


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def _age(seconds: float) -> str:
    seconds = int(seconds)
    for unit, size, smaller, smaller_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if seconds >= size:
            rest = (seconds % size) // smaller_size
            return (
                f"{seconds // size}{unit} {rest}{smaller}" if rest else f"{seconds // size}{unit}"
            )
    return f"{seconds}s"


def _cell(value: Any, width: int = 60) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return _when(value)
    text = " ".join(str(value).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str) -> None:
    """Plain aligned columns: readable, and still easy to grep or cut."""
    cells = [[_cell(value) for value in row] for row in rows]
    if not cells:
        click.echo(empty)
        return
    widths = [max(len(header), *(len(row[i]) for row in cells)) for i, header in enumerate(headers)]
    for row in [list(headers), *cells]:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def print_fields(fields: Sequence[tuple[str, Any]], *, err: bool = False) -> None:
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        text = value if isinstance(value, str) else _cell(value, width=200)
        click.echo(f"  {name.ljust(width)}  {text}", err=err)


# --- the command tree -----------------------------------------------------------------


@click.group(cls=_TaskhookGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def cli(ctx: click.Context) -> None:
    """taskhook: GitHub and Jira webhooks in, tasks out, exactly once per external id.

    Settings come from TASKHOOK_ environment variables (TASKHOOK_DATABASE_URL,
    TASKHOOK_BROKER_URL, TASKHOOK_PUBLIC_URL). Every command takes --json.
    """
    runtime = ctx.ensure_object(_Runtime)
    ctx.call_on_close(runtime.close)


def main() -> None:
    """The ``taskhook`` console script."""
    cli(prog_name="taskhook")


# --- db -------------------------------------------------------------------------------


@cli.group()
def db() -> None:
    """The database schema."""


@db.command("upgrade")
@json_option
@pass_runtime
def db_upgrade(runtime: _Runtime, as_json: bool) -> None:
    """Migrate the configured database to the newest schema (safe to repeat)."""
    # Imported here: Alembic is needed by this command alone.
    from alembic.runtime.migration import MigrationContext

    from migrations import upgrade_to_head

    with runtime.engine.begin() as connection:
        upgrade_to_head(connection)
        revision = MigrationContext.configure(connection).get_current_revision()
    url = runtime.database_url_for_people
    if as_json:
        emit_json({"database": url, "revision": revision})
    else:
        click.echo(f"Database {url} is at revision {revision}.")


# --- workspaces -----------------------------------------------------------------------


@cli.group()
def workspace() -> None:
    """Workspaces: where tasks land."""


@workspace.command("add")
@click.argument("slug")
@click.option("--name", required=True, help="Human-readable name.")
@click.option("--prefix", required=True, help="Task identifier prefix, e.g. ACME for ACME-12.")
@click.option(
    "--wip-limit",
    type=click.IntRange(min=0),
    default=None,
    help="Work-in-progress limit of the intake step (none by default).",
)
@json_option
@pass_runtime
def workspace_add(
    runtime: _Runtime, slug: str, name: str, prefix: str, wip_limit: int | None, as_json: bool
) -> None:
    """Create workspace SLUG with the steps Inbox, In progress, Done."""
    intake, *rest = DEFAULT_STEPS
    steps = (StepSpec(intake.name, wip_limit), *rest)
    try:
        with runtime.session() as session:
            created = create_workspace(
                session=session, slug=slug, name=name, task_prefix=prefix, steps=steps
            )
            summary = {
                "id": created.id,
                "slug": created.slug,
                "name": created.name,
                "task_prefix": created.task_prefix,
                "intake_wip_limit": wip_limit,
            }
    except IntegrityError:  # a concurrent add won the unique slug
        raise Refused(f"a workspace with slug {slug!r} already exists") from None
    if as_json:
        emit_json(summary)
        return
    click.echo(
        f"Workspace {slug} ({summary['name']}) added: tasks will be {prefix}-1, {prefix}-2, …"
    )
    click.echo(f"Next: taskhook source add github|jira --workspace {slug}")


@workspace.command("list")
@json_option
@pass_runtime
def workspace_list(runtime: _Runtime, as_json: bool) -> None:
    """Every workspace, with its task and source counts."""
    with runtime.session() as session:
        found = list_workspaces(session=session)
    if as_json:
        emit_json({"workspaces": [asdict(item) for item in found]})
        return
    print_table(
        ("SLUG", "NAME", "PREFIX", "TASKS", "SOURCES", "CREATED"),
        ((w.slug, w.name, w.task_prefix, w.tasks, w.sources, w.created_at) for w in found),
        empty="No workspaces yet: taskhook workspace add SLUG --name NAME --prefix PREFIX",
    )


# --- sources --------------------------------------------------------------------------


@cli.group()
def source() -> None:
    """Webhook sources: which GitHub or Jira webhook feeds which workspace."""


def webhook_url(settings: Settings, provider: str, slug: str) -> str:
    return f"{settings.public_url.rstrip('/')}/webhooks/{provider}/{slug}"


def _events_for(provider: str, given: str | None) -> list[str]:
    handled, defaults = ADAPTERS[provider]
    if given is None:
        return sorted(defaults)
    events = sorted({event.strip() for event in given.split(",") if event.strip()})
    unknown = [event for event in events if event not in handled]
    if not events or unknown:
        raise click.BadParameter(
            f"{', '.join(unknown) or 'no event given'}: {provider} sources can create tasks "
            f"from {', '.join(sorted(handled))}",
            param_hint="--events",
        )
    return events


def _print_secret_once(secret: str, provider: str) -> None:
    where = "GitHub's webhook “Secret” field" if provider == "github" else "Jira's webhook secret"
    click.echo(f"Secret:      {secret}")
    click.echo(f"             Paste it into {where} now: it will not be shown again.")


@source.command("add")
@click.argument("provider", type=click.Choice(PROVIDERS))
@click.option("--workspace", "workspace_slug", required=True, help="Workspace slug.")
@click.option("--name", default=None, help="Source name, the URL's last part [WORKSPACE-PROVIDER].")
@click.option("--secret", default=None, help="Signing secret; generated when omitted.")
@click.option(
    "--events",
    default=None,
    help="Comma-separated events that create tasks [the adapter's defaults].",
)
@click.option("--site", default=None, help="Jira only: the site links point at.")
@json_option
@pass_runtime
def source_add(
    runtime: _Runtime,
    provider: str,
    workspace_slug: str,
    name: str | None,
    secret: str | None,
    events: str | None,
    site: str | None,
    as_json: bool,
) -> None:
    """Connect a PROVIDER (github or jira) webhook to a workspace; print its URL."""
    create_events = _events_for(provider, events)
    if site is not None:
        if provider != "jira":
            raise click.BadParameter("only Jira sources have a site", param_hint="--site")
        if urlsplit(site).scheme not in ("http", "https") or not urlsplit(site).netloc:
            raise click.BadParameter(
                f"{site!r} is not an http(s) URL, e.g. https://acme.atlassian.net",
                param_hint="--site",
            )
    slug = name or f"{workspace_slug}-{provider}"
    generated = secret is None
    secret = secrets.token_urlsafe(32) if secret is None else secret
    try:
        with runtime.session() as session:
            target = get_workspace(session=session, slug=workspace_slug)
            added = add_source(
                session=session,
                provider=provider,
                workspace_id=target.id,
                slug=slug,
                secret=secret,
                create_events=create_events,
                site_url=site,
            )
            site_url = added.site_url
    except IntegrityError:  # a concurrent add won the unique name
        raise Refused(f"a source named {slug!r} already exists") from None
    url = webhook_url(runtime.settings, provider, slug)
    # Printed only now, after the commit: a secret for a source that was never
    # stored would be pasted into GitHub or Jira for nothing.
    if as_json:
        document = {
            "source": slug,
            "provider": provider,
            "workspace": workspace_slug,
            "url": url,
            "events": create_events,
            "site_url": site_url,
        }
        emit_json(document | ({"secret": secret} if generated else {}))
        return
    click.echo(f"Source {slug} added: {provider} → workspace {workspace_slug}.")
    click.echo(f"Webhook URL: {url}")
    click.echo(f"Events:      {', '.join(create_events)} create tasks; other events are stored")
    if generated:
        _print_secret_once(secret, provider)
    else:
        click.echo("Secret:      the one you gave (never printed)")
    if provider == "github":
        click.echo("In GitHub:   Settings → Webhooks → Add webhook; content type application/json;")
        click.echo("             send the Issues and Pull requests events.")
    else:
        click.echo("In Jira:     Settings → System → WebHooks → Create a WebHook;")
        click.echo("             send Issue created events.")


@source.command("list")
@json_option
@pass_runtime
def source_list(runtime: _Runtime, as_json: bool) -> None:
    """Every source and its webhook URL. Secrets are counted, never shown."""
    with runtime.session() as session:
        found = list_source_summaries(session=session)
    urls = [webhook_url(runtime.settings, s.provider, s.slug) for s in found]
    if as_json:
        emit_json(
            {"sources": [asdict(s) | {"url": url} for s, url in zip(found, urls, strict=True)]}
        )
        return
    print_table(
        ("NAME", "PROVIDER", "WORKSPACE", "ENABLED", "SECRETS", "EVENTS", "URL"),
        (
            (
                s.slug,
                s.provider,
                s.workspace,
                s.enabled,
                s.active_secrets,
                ",".join(s.create_events),
                url,
            )
            for s, url in zip(found, urls, strict=True)
        ),
        empty="No sources yet: taskhook source add github|jira --workspace SLUG",
    )


def _set_enabled(runtime: _Runtime, name: str, enabled: bool, as_json: bool) -> None:
    with runtime.session() as session:
        set_source_enabled(session=session, slug=name, enabled=enabled)
    if as_json:
        emit_json({"source": name, "enabled": enabled})
    elif enabled:
        click.echo(f"Source {name} enabled: its deliveries are accepted again.")
    else:
        click.echo(
            f"Source {name} disabled: its deliveries are now answered 404 and not stored; "
            f"`taskhook source enable {name}` undoes it."
        )


@source.command("disable")
@click.argument("name")
@json_option
@pass_runtime
def source_disable(runtime: _Runtime, name: str, as_json: bool) -> None:
    """Stop accepting deliveries from source NAME."""
    _set_enabled(runtime, name, False, as_json)


@source.command("enable")
@click.argument("name")
@json_option
@pass_runtime
def source_enable(runtime: _Runtime, name: str, as_json: bool) -> None:
    """Accept deliveries from source NAME again."""
    _set_enabled(runtime, name, True, as_json)


@source.command("rotate-secret")
@click.argument("name")
@click.option("--secret", default=None, help="The new secret; generated when omitted.")
@click.option("--finish", is_flag=True, help="Retire every secret but the newest.")
@json_option
@pass_runtime
def source_rotate_secret(
    runtime: _Runtime, name: str, secret: str | None, finish: bool, as_json: bool
) -> None:
    """Rotate source NAME's signing secret without rejecting a delivery.

    Without --finish: add a new secret; old ones keep verifying until you have
    pasted the new one into the provider. Then run again with --finish.
    """
    if finish:
        if secret is not None:
            raise click.UsageError("--finish retires old secrets; it takes no --secret")
        with runtime.session() as session:
            retired = retire_older_secrets(session=session, slug=name)
        if as_json:
            emit_json({"source": name, "retired": retired})
        else:
            click.echo(
                f"Retired {retired} older secret(s) of {name}: only the newest verifies now."
            )
        return

    generated = secret is None
    secret = secrets.token_urlsafe(32) if secret is None else secret
    with runtime.session() as session:
        rotated = add_secret(session=session, slug=name, new_secret=secret)
        provider = rotated.provider
    if as_json:
        emit_json({"source": name} | ({"secret": secret} if generated else {}))
        return
    click.echo(f"New secret added to {name}; the old ones keep verifying until --finish.")
    if generated:
        _print_secret_once(secret, provider)
    click.echo(f"Then: taskhook source rotate-secret {name} --finish")


# --- tasks and identities ----------------------------------------------------------------


def _task_json(view: TaskView | None) -> dict[str, Any] | None:
    if view is None:
        return None
    return asdict(view) | {"settled": view.settled, "archived": view.archived}


def _settlement(view: TaskView) -> str:
    if view.settled:
        return f"settled at {_when(view.settled_at)} (creation complete)"
    return "NOT SETTLED: its create had not finished when looked at (it may still be running)"


def creator_advice(found: Lineage, holder: TaskView, now: datetime) -> tuple[bool, str]:
    """(may the create still finish on its own?, what the creator is doing and what to do).

    Only the delivery that inserted an unsettled task may finish its create,
    and replaying it does exactly that, so the advice points there first.
    """
    creator = found.creator_of(holder)
    if creator is None:
        if holder.created_by_delivery:
            return False, (
                f"its creating delivery {holder.created_by_delivery} is gone from the inbox: "
                "nothing will finish this create"
            )
        return False, (
            "it was created outside the webhooks (REST API): only its caller could have finished it"
        )
    pk, status, lease = creator.id, creator.status, creator.lease_expires_at
    if status == DeliveryStatus.PROCESSING and lease is not None and lease > now:
        return True, (
            f"delivery {pk} is being processed now (attempt {creator.attempts}, lease until "
            f"{_when(lease)} UTC): wait for it"
        )
    if status == DeliveryStatus.PROCESSING:
        return True, (
            f"delivery {pk}'s worker stopped (its lease ran out at {_when(lease)} UTC); the "
            "sweeper sends it again and it finishes its own create: wait a sweep or two"
        )
    if status == DeliveryStatus.QUEUED:
        return True, f"delivery {pk} is queued: when it runs it finishes its own create. Wait."
    if status in (DeliveryStatus.DEAD, DeliveryStatus.NEEDS_OPERATOR):
        return False, (
            f"delivery {pk} is {status}: read `taskhook deliveries show {pk}`, fix the cause, "
            f"then `taskhook deliveries replay {pk}` finishes its own create"
        )
    return False, (
        f"delivery {pk} is {status} but its create never settled: read "
        f"`taskhook deliveries show {pk}` before anything else"
    )


def _task_fields(found: Lineage, view: TaskView) -> list[tuple[str, Any]]:
    fields: list[tuple[str, Any]] = [
        ("task", f"{view.identifier}  {view.title}"),
        ("external id", view.external_id),
        ("state", _settlement(view)),
    ]
    if not view.settled:
        fields.append(("creator", creator_advice(found, view, utcnow())[1]))
    return [
        *fields,
        ("archived", _when(view.archived_at) if view.archived else "no"),
        ("created", view.created_at),
        ("created by", f"delivery {view.created_by_delivery}" if view.created_by_delivery else "-"),
        ("source", view.source_url),
    ]


def _print_deliveries(deliveries: Sequence[DeliverySummary], *, empty: str) -> None:
    print_table(
        ("ID", "RECEIVED", "SOURCE", "EVENT", "STATUS", "TRIES", "OUTCOME", "TASK", "REASON"),
        (
            (
                d.id,
                d.received_at,
                d.source,
                d.event,
                d.status,
                d.attempts,
                d.outcome,
                d.task_identifier or d.task_id,
                d.last_error if d.status == DeliveryStatus.DEAD else d.status_reason,
            )
            for d in deliveries
        ),
        empty=empty,
    )


def _lineage(runtime: _Runtime, workspace_slug: str, external_id: str) -> Lineage:
    with runtime.session() as session:
        return lineage(session=session, workspace_slug=workspace_slug, external_id=external_id)


def _nobody_holds(found: Lineage) -> Refused:
    released = (
        f" (released {len(found.releases)} time(s): "
        f"taskhook explain --workspace {found.workspace} {found.external_id!r})"
        if found.releases
        else ""
    )
    return Refused(
        f"no task in workspace {found.workspace} holds external id {found.external_id!r}{released}"
    )


workspace_option = click.option(
    "--workspace", "workspace_slug", required=True, help="Workspace slug."
)


@cli.group()
def task() -> None:
    """Tasks, by the external id that made them."""


@task.command("lookup")
@workspace_option
@click.argument("external_id")
@json_option
@pass_runtime
def task_lookup(runtime: _Runtime, workspace_slug: str, external_id: str, as_json: bool) -> None:
    """The task holding EXTERNAL_ID (settled or not) and the deliveries that touched it.

    Put `--` before an EXTERNAL_ID that starts with a dash.
    """
    found = _lineage(runtime, workspace_slug, external_id)
    if found.holder is None:
        raise _nobody_holds(found)
    touched = found.deliveries_of(found.holder.id)
    if as_json:
        emit_json(
            {
                "workspace": found.workspace,
                "external_id": found.external_id,
                "task": _task_json(found.holder),
                "deliveries": [asdict(d) for d in touched],
            }
        )
        return
    print_fields(_task_fields(found, found.holder))
    click.echo()
    _print_deliveries(touched, empty="No delivery touched it (it was created through the API).")


@cli.command("explain")
@workspace_option
@click.argument("external_id")
@json_option
@pass_runtime
def explain(runtime: _Runtime, workspace_slug: str, external_id: str, as_json: bool) -> None:
    """The lineage of EXTERNAL_ID, delivery → outcome → task, in time order."""
    found = _lineage(runtime, workspace_slug, external_id)
    if not found.known:
        raise Refused(
            f"nothing in workspace {found.workspace} holds or held external id "
            f"{found.external_id!r}"
        )
    events = timeline(found)
    if as_json:
        emit_json(
            {
                "workspace": found.workspace,
                "external_id": found.external_id,
                "holder": _task_json(found.holder),
                "former_holders": [_task_json(view) for view in found.former_holders],
                "releases": [asdict(release) for release in found.releases],
                "deliveries": [asdict(d) for d in found.deliveries],
                "events": [asdict(event) for event in events],
            }
        )
        return
    click.echo(f"External id {found.external_id!r} in workspace {found.workspace}:")
    click.echo()
    print_table(
        ("TIME", "EVENT", "DETAIL"),
        ((event.at, event.what, event.detail) for event in events),
        empty="(no events)",
    )
    click.echo()
    holder = found.holder
    if holder is None:
        click.echo("Now: no task holds it; the next delivery for the item creates a new task.")
    elif holder.settled:
        click.echo(f"Now: held by {holder.identifier}, settled. Nothing to do.")
    else:
        click.echo(f"Now: held by {holder.identifier}, {_settlement(holder)}.")
        click.echo(f"Its creator: {creator_advice(found, holder, utcnow())[1]}.")
        click.echo(
            "Other deliveries for it wait, then park as needs_operator. Read "
            "docs/runbook.md (needs_operator) before any `taskhook release`."
        )


def _default_operator() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (some containers)
        return os.environ.get("USER") or None


def _release_preview(found: Lineage, holder: TaskView) -> list[tuple[str, Any]]:
    touched = found.deliveries_of(holder.id)
    parked = [d.id for d in touched if d.status == DeliveryStatus.NEEDS_OPERATOR]
    waiting = f"; needs_operator: {', '.join(map(str, parked))}" if parked else ""
    return [
        *_task_fields(found, holder),
        ("deliveries", f"{len(touched)} touched it{waiting}"),
    ]


def _release_warning(found: Lineage, holder: TaskView) -> str:
    if holder.settled:
        return (
            "Its create FINISHED. After a release the task stays, without this identity, and "
            "the next delivery for the item creates a SECOND task."
        )
    may_finish, _ = creator_advice(found, holder, utcnow())
    if may_finish:
        return (
            "WARNING: its create may still finish on its own (see creator above). Releasing "
            "now leaves it without its identity and the next delivery makes a SECOND task."
        )
    return (
        "After a release the task stays, without this identity, and the next delivery for "
        "the item creates a NEW task."
    )


@cli.command("release")
@workspace_option
@click.argument("external_id")
@click.option("--reason", required=True, help="Why; kept in the audit row.")
@click.option("--operator", default=None, help="Who releases [the OS user].")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_RELEASE_TIMEOUT_SECONDS,
    show_default=True,
    help="Seconds to wait for the operator worker's answer.",
)
@json_option
@pass_runtime
def release(
    runtime: _Runtime,
    workspace_slug: str,
    external_id: str,
    reason: str,
    operator: str | None,
    yes: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Free EXTERNAL_ID from its task, through the operator worker, audited.

    The one unsafe command: afterwards the next delivery for the item creates
    a new task. Read docs/runbook.md first.
    """
    if not reason.strip():
        raise click.BadParameter("a release must give a reason", param_hint="--reason")
    operator = (operator or _default_operator() or "").strip()
    if not operator:
        raise click.BadParameter(
            "cannot tell who you are; pass --operator", param_hint="--operator"
        )

    found = _lineage(runtime, workspace_slug, external_id)
    holder = found.holder
    if holder is None:
        raise _nobody_holds(found)
    # With --json the preview and the question go to stderr; stdout stays one document.
    click.echo(
        f"Release external id {found.external_id!r} in workspace {found.workspace} from:",
        err=as_json,
    )
    print_fields(_release_preview(found, holder), err=as_json)
    click.echo(_release_warning(found, holder), err=as_json)
    if not yes:
        click.confirm("Release it?", abort=True, err=as_json)

    args = [found.workspace_id, found.external_id, operator, reason]
    answered, reply = _await_answer(_send_release(runtime, args), timeout)
    if not answered:
        raise NoAnswer(
            f"the operator worker did not answer within {timeout:g}s: is taskhook's operator "
            f"worker running (celery -A worker worker -Q {OPERATOR_QUEUE})? The request stays "
            "queued and may still run when one starts: check `taskhook task lookup` before "
            "sending it again."
        )
    if not isinstance(reply, dict):
        raise Refused(f"the operator worker answered something unexpected: {reply!r}")
    if not reply.get("released"):
        raise Refused(f"not released: {reply.get('error') or 'no reason given'}")
    parked = [
        d.id for d in found.deliveries_of(holder.id) if d.status == DeliveryStatus.NEEDS_OPERATOR
    ]
    if as_json:
        emit_json(reply | {"workspace": found.workspace, "needs_operator_deliveries": parked})
        return
    click.echo(
        f"Released {reply.get('external_id', found.external_id)!r} from "
        f"{reply.get('identifier', holder.identifier)} (task {reply.get('task_id', holder.id)}); "
        f"audit row {reply.get('audit_id')}, operator {operator}."
    )
    for pk in parked:
        click.echo(f"Parked delivery {pk} can go through again: taskhook deliveries replay {pk}")


def _send_release(runtime: _Runtime, args: list[Any]) -> Any:
    """Send RELEASE_IDENTITY; the pending result, or a refusal when the broker is down."""
    app = load_celery_app()
    try:
        return app.send_task(RELEASE_IDENTITY, args=args, queue=OPERATOR_QUEUE)
    except Exception as error:  # kombu's connection errors have no common base worth naming
        broker = _redacted(runtime.settings.broker_url)
        raise Refused(
            f"cannot reach the broker at {broker}: {_first_line(error)}; nothing was released"
        ) from None


def _await_answer(pending: Any, timeout: float) -> tuple[bool, Any]:
    """(True, the operator task's answer) or (False, None) when none came in time."""
    from celery.exceptions import TimeoutError as CeleryTimeout

    try:
        return True, pending.get(timeout=timeout)
    except CeleryTimeout:
        # Stop waiting now, while the result backend's connection is open: left
        # pending, Celery unsubscribes in AsyncResult.__del__ at interpreter
        # exit and prints a traceback when the connection is already gone.
        backend = getattr(pending, "backend", None)
        if backend is not None:
            backend.remove_pending_result(pending)
            pending.backend = None
        return False, None
    except Exception as error:  # the task itself raised: report it, no traceback
        return True, {"released": False, "error": f"{type(error).__name__}: {_first_line(error)}"}


# --- deliveries -----------------------------------------------------------------------


@cli.group()
def deliveries() -> None:
    """The inbox: every delivery GitHub and Jira sent."""


@deliveries.command("list")
@click.option(
    "--status",
    type=click.Choice([status.value for status in DeliveryStatus]),
    default=None,
    help="Only deliveries in this state.",
)
@click.option("--limit", type=click.IntRange(1, MAX_PAGE), default=50, show_default=True)
@click.option("--before", type=click.IntRange(min=1), default=None, help="Page: ids below this.")
@json_option
@pass_runtime
def deliveries_list(
    runtime: _Runtime, status: str | None, limit: int, before: int | None, as_json: bool
) -> None:
    """Deliveries, newest first."""
    with runtime.session() as session:
        page = list_deliveries(session=session, status=status, limit=limit, before=before)
    if as_json:
        emit_json(page)
        return
    _print_deliveries(page.deliveries, empty="No deliveries.")
    if page.next_before is not None:
        more = f"--status {status} " if status else ""
        click.echo(f"More: taskhook deliveries list {more}--before {page.next_before}")


@deliveries.command("show")
@click.argument("delivery", type=int, metavar="ID")
@json_option
@pass_runtime
def deliveries_show(runtime: _Runtime, delivery: int, as_json: bool) -> None:
    """One delivery: state, outcome, error and headers (never a signature)."""
    with runtime.session() as session:
        detail: DeliveryDetail = show_delivery(session=session, delivery_pk=delivery)
    if as_json:
        emit_json(detail)
        return
    d = detail.summary
    print_fields(
        [
            ("delivery", f"{d.id}  ({d.provider} id {d.delivery_id})"),
            ("source", f"{d.source} → workspace {detail.workspace}"),
            ("event", d.event),
            ("status", d.status),
            ("reason", d.status_reason),
            ("attempts", d.attempts),
            ("outcome", d.outcome),
            ("task", d.task_identifier or d.task_id),
            ("last error", d.last_error),
            ("received", d.received_at),
            ("updated", d.updated_at),
            ("lease until", d.lease_expires_at),
            ("body", f"{detail.body_bytes} bytes, sha256 {detail.body_sha256}"),
            ("content type", detail.content_type),
            ("hook id", detail.hook_id),
            ("mismatches", f"{detail.payload_mismatches} redelivery(ies) with another body"),
        ]
    )
    if detail.headers:
        click.echo("  headers")
        print_fields([(f"  {name}", value) for name, value in detail.headers.items()])


@deliveries.command("replay")
@click.argument("delivery", type=int, metavar="ID")
@json_option
@pass_runtime
def deliveries_replay(runtime: _Runtime, delivery: int, as_json: bool) -> None:
    """Send a needs_operator or dead delivery ID through the worker again."""
    with runtime.session() as session:
        replay(session=session, delivery_pk=delivery)
    # Committed: only now may a worker see the message (store, commit, then enqueue).
    try:
        load_celery_app().send_task(PROCESS_DELIVERY, args=[delivery], queue=DELIVERIES_QUEUE)
        enqueued, problem = True, None
    except Exception as error:  # the row is queued and durable: the sweeper sends it later
        enqueued, problem = False, _first_line(error)
    if as_json:
        emit_json(
            {"delivery": delivery, "status": "queued", "enqueued": enqueued, "error": problem}
        )
        return
    if enqueued:
        click.echo(f"Delivery {delivery} is queued again and sent to the worker.")
        click.echo(f"Follow it: taskhook deliveries show {delivery}")
    else:
        settings = runtime.settings
        within = settings.queued_grace_seconds + settings.sweep_interval_seconds
        click.echo(
            f"Delivery {delivery} is queued again, but the broker did not take the message "
            f"({problem}); the sweeper sends it within about {within:g}s once the broker is back."
        )


# --- stats ----------------------------------------------------------------------------


@cli.command("stats")
@json_option
@pass_runtime
def stats(runtime: _Runtime, as_json: bool) -> None:
    """Deliveries by status and the age of the oldest queued one."""
    with runtime.session() as session:
        found = inbox_stats(session=session)
    if as_json:
        emit_json(found)
        return
    print_table(("STATUS", "DELIVERIES"), found.counts.items(), empty="No deliveries.")
    click.echo()
    if found.oldest_queued_at is None:
        click.echo("Oldest queued: none (nothing waiting).")
    else:
        click.echo(
            f"Oldest queued: received {_age(found.oldest_queued_age_seconds or 0)} ago "
            f"({_when(found.oldest_queued_at)} UTC)."
        )


# --- API tokens -----------------------------------------------------------------------


@cli.group()
def token() -> None:
    """Bearer tokens for the REST API, each scoped to its workspaces."""


@token.command("add")
@click.option(
    "--workspace",
    "workspace_slugs",
    required=True,
    multiple=True,
    help="A workspace the token may see (repeat for several).",
)
@click.option(
    "--role",
    type=click.Choice([role.value for role in Role]),
    default=Role.MEMBER.value,
    show_default=True,
    help="operator tokens may also release external ids.",
)
@click.option("--name", required=True, help="Who holds it; audit rows name it.")
@json_option
@pass_runtime
def token_add(
    runtime: _Runtime, workspace_slugs: tuple[str, ...], role: str, name: str, as_json: bool
) -> None:
    """Make a token and print it once: only its hash is kept."""
    with runtime.session() as session:
        workspace_ids = [get_workspace(session=session, slug=slug).id for slug in workspace_slugs]
        issued = issue_token(session=session, name=name, role=role, workspace_ids=workspace_ids)
        summary = {
            "id": issued.record.id,
            "name": issued.record.name,
            "role": issued.record.role,
            "workspaces": sorted(workspace_slugs),
            "token": issued.token,
        }
    if as_json:
        emit_json(summary)
        return
    click.echo(f"Token {summary['id']} ({role}) for {name} on {', '.join(summary['workspaces'])}:")
    click.echo(f"  {issued.token}")
    click.echo("It is shown once and cannot be recovered; send it as 'Authorization: Bearer …'.")


@token.command("list")
@json_option
@pass_runtime
def token_list(runtime: _Runtime, as_json: bool) -> None:
    """Every token, never the token itself."""
    with runtime.session() as session:
        slugs = {w.id: w.slug for w in list_workspaces(session=session)}
        rows = [
            {
                "id": record.id,
                "name": record.name,
                "role": record.role,
                "prefix": record.token_prefix + "…",
                "workspaces": [slugs.get(w, str(w)) for w in workspace_ids],
                "created_at": record.created_at,
                "revoked_at": record.revoked_at,
            }
            for record, workspace_ids in list_tokens(session=session)
        ]
    if as_json:
        emit_json({"tokens": rows})
        return
    print_table(
        ("ID", "NAME", "ROLE", "TOKEN", "WORKSPACES", "CREATED", "REVOKED"),
        (
            (
                r["id"],
                r["name"],
                r["role"],
                r["prefix"],
                ",".join(r["workspaces"]),
                r["created_at"],
                r["revoked_at"],
            )
            for r in rows
        ),
        empty="No tokens yet: taskhook token add --workspace SLUG --name NAME",
    )


@token.command("revoke")
@click.argument("token_id", type=int)
@json_option
@pass_runtime
def token_revoke(runtime: _Runtime, token_id: int, as_json: bool) -> None:
    """Revoke token TOKEN_ID: it answers 401 from now on."""
    with runtime.session() as session:
        record = revoke_token(session=session, token_id=token_id)
        summary = {"id": record.id, "name": record.name, "revoked_at": record.revoked_at}
    if as_json:
        emit_json(summary)
        return
    click.echo(f"Token {token_id} ({summary['name']}) is revoked.")
