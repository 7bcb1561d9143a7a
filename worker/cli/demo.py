"""``taskhook demo``: a workspace to try taskhook with, and signed sample
deliveries to send it. ``scripts/run`` calls ``demo setup``; a person then
runs ``taskhook demo send github`` and watches a task appear."""

from __future__ import annotations

import json
import secrets
import shlex
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import click
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from models.intake import read_delivery
from models.providers import PROVIDERS
from models.reports import list_source_summaries, list_workspaces
from models.sources import add_source, verifying_source
from models.tables import Delivery, Workspace
from models.workspaces import create_workspace
from worker.cli.output import echo, emit_json, json_option
from worker.cli.runtime import CommandRuntime, Refused, pass_runtime

#: Real payloads, copies of test fixtures shipped with taskhook, so that an
#: installed taskhook sends them too (demo_samples/SOURCES.md).
SAMPLES_FOLDER = Path(__file__).resolve().parent / "demo_samples"
#: The providers the demo sends samples of (every provider taskhook has): the
#: event each sample (``SAMPLES_FOLDER / "<provider>.json"``) is a delivery of.
SAMPLES = {
    "github": "issues.opened",
    "gitlab": "Issue Hook.open",
    "jira": "jira:issue_created",
}
DEMO_SOURCES = {"github": "demo-github", "gitlab": "demo-gitlab", "jira": "demo-jira"}
#: Where a sample body says when its item was last updated: set to the time of
#: each send, so that two sends are two bodies (a Jira body says when it was
#: sent instead: ``Provider.with_sent_at``).
UPDATED_AT = {"github": ("issue", "updated_at"), "gitlab": ("object_attributes", "updated_at")}


@click.group()
def demo() -> None:
    """A demo workspace, and sample deliveries to send it."""


@demo.command("setup")
@click.option(
    "--embedded-only",
    is_flag=True,
    help="Only on the embedded SQLite database (what scripts/run passes): a production "
    "database gets no demo unless asked for by name.",
)
@json_option
@pass_runtime
def demo_setup(runtime: CommandRuntime, embedded_only: bool, as_json: bool) -> None:
    """Create workspace demo with a GitHub, a GitLab and a Jira source, unless
    any workspace exists."""
    if embedded_only and make_url(runtime.settings.database_url).get_backend_name() != "sqlite":
        if as_json:
            emit_json({"created": False, "sources": []})
            return
        echo(
            f"==> no demo workspace on {runtime.database_url_for_people}: "
            "ask for one with `taskhook demo setup`"
        )
        return
    with runtime.session() as session:
        created = not list_workspaces(session=session)
        if created:
            workspace = create_workspace(
                session=session, slug="demo", name="Demo", task_prefix="DEMO"
            )
            add_source(
                session=session,
                provider="github",
                workspace_id=workspace.id,
                slug=DEMO_SOURCES["github"],
                secret=secrets.token_urlsafe(32),
                create_events=["issues.opened", "pull_request.opened"],
            )
            add_source(
                session=session,
                provider="gitlab",
                workspace_id=workspace.id,
                slug=DEMO_SOURCES["gitlab"],
                secret=secrets.token_urlsafe(32),
                create_events=["Issue Hook.open", "Merge Request Hook.open"],
            )
            add_source(
                session=session,
                provider="jira",
                workspace_id=workspace.id,
                slug=DEMO_SOURCES["jira"],
                secret=secrets.token_urlsafe(32),
                create_events=["jira:issue_created"],
                site_url="https://demo.atlassian.net",
            )
        sources = [
            (found.slug, found.provider, runtime.settings.webhook_url(found.provider, found.slug))
            for found in list_source_summaries(session=session)
        ]
    if as_json:
        emit_json(
            {
                "created": created,
                "sources": [
                    dict(zip(("source", "provider", "url"), s, strict=True)) for s in sources
                ],
            }
        )
        return
    echo("==> demo workspace created" if created else "==> existing workspaces kept")
    for slug, provider, url in sources:
        echo(f"    {provider:6} {slug:20} {url}")
    echo(
        "==> send a signed sample delivery: .venv/bin/taskhook demo send "
        + "|".join(sorted(SAMPLES))
    )


@demo.command("send")
@click.argument("provider", type=click.Choice(sorted(SAMPLES)))
@click.option("--source", "slug", default=None, help="Source name [demo-PROVIDER].")
@click.option(
    "--redeliver",
    is_flag=True,
    help="Send the source's last delivery again, as the provider's own redelivery does: "
    "the same delivery id and the same bytes, answered `duplicate`.",
)
@json_option
@pass_runtime
def demo_send(
    runtime: CommandRuntime, provider: str, slug: str | None, redeliver: bool, as_json: bool
) -> None:
    """Sign a real PROVIDER sample (github, gitlab, jira) with the source's
    secret and POST it to the ingress.

    Each send is a new delivery of the same issue, with a delivery id and a
    body of its own (the issue as it is now), as the provider sends one: the
    first makes a task, the next ones find it (found_settled, no new task).
    With --redeliver, the last delivery goes again unchanged, as GitHub's
    "Redeliver" sends it: the ingress answers `duplicate`.
    """
    slug = slug or DEMO_SOURCES[provider]
    with runtime.session() as session:
        source = verifying_source(session=session, provider=provider, slug=slug)
        workspace = source and session.get(Workspace, source.workspace_id).slug
        last = source and redeliver and _last_delivery(session, source.id)
    if source is None:
        raise Refused(f"no enabled {provider} source named {slug!r} (taskhook source list)")
    if redeliver and not last:
        raise Refused(f"source {slug!r} has no delivery to send again: send one first")
    if last:
        body, headers = (
            last.body,
            PROVIDERS[provider].sample_headers(
                last.body, source.secrets[-1], event=last.event, delivery_id=last.delivery_id
            ),
        )
    else:
        body, headers = _sample_delivery(provider, source.secrets[-1])
    url = runtime.settings.webhook_url(provider, slug)
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, answer = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, answer = error.code, error.read().decode()
    except urllib.error.URLError as error:
        raise Refused(
            f"cannot reach the ingress at {url}: {error.reason} (is `web` running?)"
        ) from None
    if as_json:
        emit_json({"url": url, "status": status, "answer": json.loads(answer or "null")})
        return
    echo(f"POST {url} → {status} {answer}")
    if status == 202:
        echo("Then: .venv/bin/taskhook deliveries list")
        echo(
            f"  or: .venv/bin/taskhook task lookup --workspace {workspace} "
            f"{shlex.quote(_external_id_of(provider, headers, body))}"
        )


def _sample_delivery(provider: str, secret: str) -> tuple[bytes, dict[str, str]]:
    """The real sample body, as its provider would send it now (a Jira body says
    when it was sent, and the ingress refuses old ones; a GitHub or GitLab body
    says when the item was last updated), in the headers that provider sends,
    signed with ``secret`` (GitLab: carrying it): two sends are two deliveries,
    never the same bytes twice, which the ingress would answer as a ``replay``."""
    event = SAMPLES[provider]
    sample = SAMPLES_FOLDER / f"{provider}.json"
    sender = PROVIDERS[provider]
    now = time.time()
    body = sender.with_sent_at(sample.read_bytes(), now)
    if provider in UPDATED_AT:
        item, field = UPDATED_AT[provider]
        payload = json.loads(body)
        updated = datetime.fromtimestamp(now, UTC).isoformat(timespec="microseconds")
        payload[item][field] = updated.replace("+00:00", "Z")
        body = json.dumps(payload, indent=2).encode()
    return body, sender.sample_headers(body, secret, event=event)


def _last_delivery(session: Session, source_id: int) -> Delivery | None:
    """The source's latest delivery still in the inbox with its body."""
    return session.scalars(
        select(Delivery)
        .where(Delivery.source_id == source_id, Delivery.body != b"")
        .order_by(Delivery.id.desc())
        .limit(1)
    ).first()


def _external_id_of(provider: str, headers: dict[str, str], body: bytes) -> str:
    """The external id the sample names, read as the ingress reads it."""
    reader = PROVIDERS[provider]
    payload = json.loads(body)
    reading = read_delivery(reader, reader.event_of(headers, payload) or "", payload, None)
    return reading.external_id or "?"
