"""``taskhook source``: which provider's webhook feeds which workspace."""

from __future__ import annotations

import hashlib
import secrets
import sys
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlsplit

import click
from sqlalchemy.exc import IntegrityError

from models import idempotency
from models.broker.lanes import Sender, SourceLane, lane_of
from models.broker.messages import PROCESS_DELIVERY
from models.catchup import (
    GITHUB_API,
    GITLAB_URL,
    catch_up_command,
    checked_api_url,
    checked_app_id,
    checked_email,
    checked_gitlab_owner,
    checked_hook_id,
    checked_jql,
    checked_private_key,
    checked_target,
    set_app_access,
    set_gitlab_access,
    set_jira_access,
    set_log_access,
)
from models.providers import PROVIDERS as REGISTRY
from models.reports import get_workspace, list_source_summaries
from models.sources import (
    PROVIDERS,
    add_secret,
    add_source,
    checked_secret,
    checked_slug,
    pause_source,
    resume_source,
    retire_older_secrets,
    set_source_enabled,
    set_source_lane,
)
from worker.cli import runtime as cli_runtime
from worker.cli.output import echo, emit_json, json_option, print_table
from worker.cli.params import checked_by, idempotency_key_option, os_user_actor
from worker.cli.runtime import CommandRuntime, Refused, first_line, pass_runtime
from worker.sweeper import send_backlog


@click.group()
def source() -> None:
    """Webhook sources: which provider's webhook feeds which workspace."""


def _events_for(provider: str, given: str | None) -> list[str]:
    handled = REGISTRY[provider].handled_events
    if given is None:
        return sorted(REGISTRY[provider].default_create_events)
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
    echo(f"Secret:      {secret}")
    echo(
        f"             Paste it into {REGISTRY[provider].secret_help} now: "
        "it will not be shown again."
    )


@source.command("add")
@click.argument("provider", type=click.Choice(PROVIDERS))
@click.option("--workspace", "workspace_slug", required=True, help="Workspace slug.")
@click.option(
    "--name",
    default=None,
    callback=checked_by(checked_slug),
    help="Source name, the URL's last part [WORKSPACE-PROVIDER].",
)
@click.option(
    "--secret",
    default=None,
    callback=checked_by(checked_secret),
    help="Signing secret; generated when omitted.",
)
@click.option(
    "--events",
    default=None,
    help="Comma-separated events that create tasks [the provider's defaults].",
)
@click.option(
    "--site",
    default=None,
    help=f"{', '.join(p.label for p in REGISTRY.values() if p.takes_site)} only: "
    "the site links point at.",
)
@json_option
@pass_runtime
def source_add(
    runtime: CommandRuntime,
    provider: str,
    workspace_slug: str,
    name: str | None,
    secret: str | None,
    events: str | None,
    site: str | None,
    as_json: bool,
) -> None:
    """Connect a PROVIDER's webhook to a workspace; print its URL."""
    create_events = _events_for(provider, events)
    if site is not None:
        if not REGISTRY[provider].takes_site:
            with_site = " and ".join(p.label for p in REGISTRY.values() if p.takes_site)
            raise click.BadParameter(f"only {with_site} sources have a site", param_hint="--site")
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
    url = runtime.settings.webhook_url(provider, slug)
    # Printed only now, after the commit: a secret for a source that was never
    # stored would be pasted into the provider for nothing.
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
    echo(f"Source {slug} added: {provider} → workspace {workspace_slug}.")
    echo(f"Webhook URL: {url}")
    echo(f"Events:      {', '.join(create_events)} create tasks; other events are stored")
    if generated:
        _print_secret_once(secret, provider)
    else:
        echo("Secret:      the one you gave (never printed)")
    for line in REGISTRY[provider].setup_help:
        echo(line)


@source.command("list")
@json_option
@pass_runtime
def source_list(runtime: CommandRuntime, as_json: bool) -> None:
    """Every source and its webhook URL. Secrets are counted, never shown."""
    with runtime.session() as session:
        found = list_source_summaries(session=session)
    urls = [runtime.settings.webhook_url(s.provider, s.slug) for s in found]
    if as_json:
        emit_json(
            {"sources": [asdict(s) | {"url": url} for s, url in zip(found, urls, strict=True)]}
        )
        return
    print_table(
        ("NAME", "PROVIDER", "WORKSPACE", "ENABLED", "LANE", "SECRETS", "EVENTS", "URL"),
        (
            (
                s.slug,
                s.provider,
                s.workspace,
                s.enabled,
                "paused" if s.paused_at else s.lane,
                s.active_secrets,
                ",".join(s.create_events),
                url,
            )
            for s, url in zip(found, urls, strict=True)
        ),
        empty=f"No sources yet: taskhook source add {'|'.join(PROVIDERS)} --workspace SLUG",
    )


def _set_enabled(runtime: CommandRuntime, name: str, enabled: bool, as_json: bool) -> None:
    with runtime.session() as session:
        set_source_enabled(session=session, slug=name, enabled=enabled)
    if as_json:
        emit_json({"source": name, "enabled": enabled})
    elif enabled:
        echo(f"Source {name} enabled: its deliveries are accepted again.")
    else:
        echo(
            f"Source {name} disabled: its deliveries are now answered 404 and not stored; "
            f"`taskhook source enable {name}` undoes it."
        )


@source.command("disable")
@click.argument("name")
@json_option
@pass_runtime
def source_disable(runtime: CommandRuntime, name: str, as_json: bool) -> None:
    """Stop accepting deliveries from source NAME."""
    _set_enabled(runtime, name, False, as_json)


@source.command("enable")
@click.argument("name")
@json_option
@pass_runtime
def source_enable(runtime: CommandRuntime, name: str, as_json: bool) -> None:
    """Accept deliveries from source NAME again."""
    _set_enabled(runtime, name, True, as_json)


@source.command("pause")
@click.argument("name")
@json_option
@pass_runtime
def source_pause(runtime: CommandRuntime, name: str, as_json: bool) -> None:
    """Hold source NAME's deliveries: still stored and answered, none processed
    until `taskhook source resume NAME`. For a storm that must wait."""
    with runtime.session() as session:
        pause_source(session=session, slug=name)
    if as_json:
        emit_json({"source": name, "paused": True})
    else:
        echo(
            f"Source {name} paused: its deliveries are stored and answered as before, and "
            "wait in the inbox, queued, until `taskhook source resume "
            f"{name}` (the ingress sees the pause within "
            f"{runtime.settings.source_cache_seconds:g} s)."
        )


@source.command("resume")
@click.argument("name")
@json_option
@pass_runtime
def source_resume(runtime: CommandRuntime, name: str, as_json: bool) -> None:
    """Process source NAME's deliveries again, and send what waited meanwhile
    (on the background lane, behind everyone's live deliveries)."""
    with runtime.session() as session:
        source_id = resume_source(session=session, slug=name).id
    lane = lane_of(Sender.RESUME)
    unsent: list[int] = []

    def send(pk: int) -> None:
        if unsent:  # the broker refused one already: the sweeper sends the rest
            unsent.append(pk)
            return
        try:
            cli_runtime.load_celery_app().send_task(PROCESS_DELIVERY, args=[pk], queue=lane)
        except Exception as error:
            echo(f"The broker did not take a message ({first_line(error)}).", err=True)
            unsent.append(pk)

    # Committed: only now may a worker take them (store, commit, enqueue).
    with runtime.session() as session:
        sent = send_backlog(session=session, source_id=source_id, send=send)
    if as_json:
        emit_json({"source": name, "paused": False, "sent": len(sent) - len(unsent)})
        return
    echo(
        f"Source {name} resumed: {len(sent) - len(unsent)} waiting deliveries sent "
        "on the background lane."
    )
    if unsent:
        echo(
            f"{len(unsent)} were not sent: the sweeper sends them within "
            f"{runtime.settings.queued_grace_seconds:g} s of the broker's return.",
            err=True,
        )


@source.command("lane")
@click.argument("name")
@click.argument("lane", type=click.Choice([lane.value for lane in SourceLane]))
@json_option
@pass_runtime
def source_lane(runtime: CommandRuntime, name: str, lane: str, as_json: bool) -> None:
    """Choose source NAME's lane: auto (live, unless it floods) or background
    (always behind everyone's live deliveries: a storm's lower share)."""
    with runtime.session() as session:
        set_source_lane(session=session, slug=name, lane=SourceLane(lane))
    if as_json:
        emit_json({"source": name, "lane": lane})
    elif lane == SourceLane.BACKGROUND:
        echo(
            f"Source {name} now takes the background lane: its deliveries wait behind "
            f"everyone's live ones. `taskhook source lane {name} auto` undoes it."
        )
    else:
        echo(f"Source {name} takes the live lane again, unless it floods.")


@source.command("rotate-secret")
@click.argument("name")
@click.option(
    "--secret",
    default=None,
    callback=checked_by(checked_secret),
    help="The new secret; generated when omitted.",
)
@click.option("--finish", is_flag=True, help="Retire every secret but the newest.")
@idempotency_key_option(
    "A key to retry this step under: run again with it, it adds (or retires) once and "
    "never shows a secret twice."
)
@json_option
@pass_runtime
def source_rotate_secret(
    runtime: CommandRuntime,
    name: str,
    secret: str | None,
    finish: bool,
    idempotency_key: str | None,
    as_json: bool,
) -> None:
    """Rotate source NAME's signing secret without rejecting a delivery.

    Without --finish: add a new secret; old ones keep verifying until you have
    pasted the new one into the provider. Then run again with --finish.
    """
    retry = idempotency.Retry.of(os_user_actor(), idempotency_key)
    if finish:
        if secret is not None:
            raise click.UsageError("--finish retires old secrets; it takes no --secret")
        with runtime.session() as session:
            answer, replayed = idempotency.answered_once(
                session,
                retry,
                action=idempotency.Action.FINISH_ROTATION,
                target=f"source {name}",
                body={},
                work=lambda: {"retired": retire_older_secrets(session=session, slug=name)},
            )
        retired = answer["retired"]
        if as_json:
            emit_json({"source": name, "retired": retired, "replayed": replayed})
        elif replayed:
            echo(f"Finished already under this key: {retired} older secret(s) of {name} retired.")
        else:
            echo(f"Retired {retired} older secret(s) of {name}: only the newest verifies now.")
        return

    generated = secret is None
    secret = secrets.token_urlsafe(32) if secret is None else secret
    with runtime.session() as session:

        def add() -> dict[str, str]:
            return {"provider": add_secret(session=session, slug=name, new_secret=secret).provider}

        # A generated secret is not part of the request: a run again under the
        # key (which generates another) adds nothing and shows nothing. One
        # given is, by its digest (the fingerprint keeps no secret).
        given = {} if generated else {"secret": hashlib.sha256(secret.encode()).hexdigest()}
        answer, replayed = idempotency.answered_once(
            session,
            retry,
            action=idempotency.Action.ROTATE_SECRET,
            target=f"source {name}",
            body=given,
            work=add,
        )
        provider = answer["provider"]
    if replayed:
        if as_json:
            emit_json({"source": name, "replayed": True})
            return
        echo(
            f"A secret was added to {name} under this key already and shown then; nothing "
            "changed. Run without the key for another."
        )
        return
    if as_json:
        emit_json({"source": name} | ({"secret": secret} if generated else {}))
        return
    echo(f"New secret added to {name}; the old ones keep verifying until --finish.")
    if generated:
        _print_secret_once(secret, provider)
    echo(f"Then: taskhook source rotate-secret {name} --finish")


def _private_key_of(path: str) -> str:
    """The PEM in file ``path``, checked; a refusal names the file, never its text."""
    try:
        pem = Path(path).read_bytes().decode("ascii")
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or 'unreadable'}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a PEM file") from None
    return checked_private_key(pem)


@source.command("catch-up")
@click.argument("name")
@click.option(
    "--repo",
    "repo",
    default=None,
    callback=checked_by(lambda repo: checked_target(f"repos/{repo}")),
    help="The hook is this repository's: OWNER/REPO.",
)
@click.option(
    "--org",
    "org",
    default=None,
    callback=checked_by(lambda org: checked_target(f"orgs/{org}")),
    help="The hook is this organization's: ORG.",
)
@click.option(
    "--hook-id",
    default=None,
    callback=checked_by(checked_hook_id),
    help="The hook's id; by default, once a catch-up confirms it, the one the deliveries name "
    "(X-GitHub-Hook-ID) whose own log lists one of them; "
    "or GitLab's hook whose URL ends with the source's name.",
)
@click.option(
    "--api-url",
    default=GITHUB_API,
    show_default=True,
    callback=checked_by(checked_api_url),
    help="GitHub's API; https://HOST/api/v3 for GitHub Enterprise Server.",
)
@click.option(
    "--token-stdin",
    is_flag=True,
    help="Read the token from standard input instead of prompting for it.",
)
@click.option(
    "--app-id",
    default=None,
    callback=checked_by(checked_app_id),
    help="The hook is this GitHub App's own webhook: the App's id (no token asked).",
)
@click.option(
    "--private-key-file",
    "private_key",
    default=None,
    metavar="PATH",
    callback=checked_by(_private_key_of),
    help="With --app-id: the App's private key (PEM), which signs its JWTs.",
)
@click.option(
    "--email",
    default=None,
    callback=checked_by(checked_email),
    help="A Jira Cloud source: the account's email; its API token is asked for next.",
)
@click.option(
    "--pat",
    is_flag=True,
    help="A Jira Data Center source: read with a personal access token (asked for next).",
)
@click.option(
    "--site",
    default=None,
    callback=checked_by(checked_api_url),
    help="A Jira source: the site's URL; by default the one the source names. "
    f"A GitLab source: the instance's URL [{GITLAB_URL}].",
)
@click.option(
    "--project",
    default=None,
    callback=checked_by(lambda project: checked_gitlab_owner(f"projects/{project}")),
    help="A GitLab source: its hook's project, by id or full path (group/project).",
)
@click.option(
    "--group",
    default=None,
    callback=checked_by(lambda group: checked_gitlab_owner(f"groups/{group}")),
    help="A GitLab source: its hook's group, by id or full path.",
)
@click.option(
    "--jql",
    default=None,
    callback=checked_by(checked_jql),
    help="A Jira source: the JQL filter its webhook uses, which narrows the search.",
)
@json_option
@pass_runtime
def source_catch_up(
    runtime: CommandRuntime,
    name: str,
    repo: str | None,
    org: str | None,
    hook_id: str | None,
    api_url: str,
    token_stdin: bool,
    app_id: str | None,
    private_key: str | None,
    email: str | None,
    pat: bool,
    site: str | None,
    jql: str | None,
    project: str | None,
    group: str | None,
    as_json: bool,
) -> None:
    """Let source NAME be caught up: a GitHub source from its hook's delivery
    log (and by a scan of its issues), a Jira source by a search of its site,
    a GitLab source from its hook's events and a scan of its issues and merge
    requests.

    A repository's or organization's hook (--repo, --org) is read with a token
    (fine-grained, with read access to its webhooks and issues), asked for
    without echo or read from stdin. A GitHub App's own hook (--app-id,
    --private-key-file) is read with JWTs the App's private key signs. A Jira
    site is read with an account's email and API token (--email, Jira Cloud)
    or a personal access token (--pat, Data Center). A GitLab project or
    group (--project, --group; --site for a self-managed instance) is read
    with an access token with the read_api scope (Maintainer, or Owner of a
    group, to read its hook's events); --hook-id names the hook, by default
    the one whose URL ends with the source's name. No credential is ever
    shown again. Then: taskhook catch-up github|jira|gitlab --source NAME.
    """
    if project is not None or group is not None:
        if project is not None and group is not None:
            raise click.UsageError(
                "a GitLab hook is a project's (--project) or a group's (--group)"
            )
        if repo or org or app_id or private_key or email or pat or jql:
            raise click.UsageError(
                "--project and --group are for a GitLab source: they take no --repo, --org, "
                "--app-id, --email, --pat or --jql"
            )
        _gitlab_access(runtime, name, project or group, hook_id, site, token_stdin, as_json)
        return
    if email is not None or pat or site is not None or jql is not None:
        if (email is None) == (not pat):
            raise click.UsageError(
                "a Jira source is read with --email EMAIL (Jira Cloud, an API token) "
                "or --pat (Data Center, a personal access token): one of them"
            )
        if repo or org or hook_id or app_id or private_key:
            raise click.UsageError(
                "--email, --pat, --site and --jql are for a Jira source: "
                "they take no --repo, --org, --hook-id or --app-id"
            )
        token = _token(token_stdin, "API token" if email else "Personal access token")
        with runtime.session() as session:
            access = set_jira_access(
                session=session, slug=name, token=token, email=email, site_url=site, jql=jql
            )
            site = access.api_base_url
        if as_json:
            emit_json({"source": name, "site": site, "email": email, "jql": jql})
            return
        echo(f"{name} can be caught up by a search of {site}.")
        echo(f"Then: {catch_up_command('jira', name)} --dry-run")
        return
    if app_id is not None or private_key is not None:
        _check_app_options(app_id, private_key, repo or org, hook_id, token_stdin)
        with runtime.session() as session:
            set_app_access(
                session=session,
                slug=name,
                app_id=app_id,
                private_key=private_key,
                api_base_url=api_url,
            )
        _report_access(name, "app", None, api_url, as_json, app_id=app_id)
        return
    if (repo is None) == (org is None):
        raise click.UsageError(
            "name the hook's owner: --repo OWNER/REPO, --org ORG, "
            "or --app-id ID --private-key-file PATH"
        )
    target = repo or org  # as checked: repos/OWNER/REPO or orgs/ORG
    token = _token(token_stdin, "Token")
    with runtime.session() as session:
        set_log_access(
            session=session,
            slug=name,
            target=target,
            token=token,
            hook_id=hook_id,
            api_base_url=api_url,
        )
    _report_access(name, target, hook_id, api_url, as_json)


def _token(from_stdin: bool, prompt: str) -> str:
    return sys.stdin.readline() if from_stdin else click.prompt(prompt, hide_input=True)


def _check_app_options(
    app_id: str | None,
    private_key: str | None,
    owner: str | None,
    hook_id: str | None,
    token_stdin: bool,
) -> None:
    if app_id is None or private_key is None:
        raise click.UsageError("a GitHub App takes both --app-id ID and --private-key-file PATH")
    if owner is not None or hook_id is not None or token_stdin:
        # The App's one hook is app/hook, read with its JWT: no owner, id or token.
        raise click.UsageError(
            "--app-id reads the App's own hook: it takes no --repo, --org, --hook-id "
            "or --token-stdin"
        )


def _report_access(
    name: str,
    target: str,
    hook_id: str | None,
    api_url: str,
    as_json: bool,
    *,
    app_id: str | None = None,
) -> None:
    if as_json:
        document = {"source": name, "target": target, "hook_id": hook_id, "api_url": api_url}
        emit_json(document | ({"app_id": app_id} if app_id is not None else {}))
        return
    whose = f"GitHub App {app_id}'s own hook" if app_id is not None else f"{target}'s hook"
    echo(f"{name} can be caught up from the log of {whose} at {api_url}.")
    echo(f"Then: {catch_up_command('github', name)} --dry-run")


def _gitlab_access(
    runtime: CommandRuntime,
    name: str,
    owner: str,
    hook_id: str | None,
    site: str | None,
    token_stdin: bool,
    as_json: bool,
) -> None:
    token = _token(token_stdin, "Access token")
    with runtime.session() as session:
        access = set_gitlab_access(
            session=session,
            slug=name,
            owner=owner,
            token=token,
            hook_id=hook_id,
            site_url=site or GITLAB_URL,
        )
        api_url = access.api_base_url
    if as_json:
        emit_json({"source": name, "target": owner, "hook_id": hook_id, "api_url": api_url})
        return
    hook = f"hook {hook_id}" if hook_id else "the hook whose URL ends with its name"
    echo(f"{name} can be caught up from {owner} ({hook}) at {api_url}.")
    echo(f"Then: {catch_up_command('gitlab', name)} --dry-run")
