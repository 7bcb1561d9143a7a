"""``taskhook workspace``: where tasks land."""

from __future__ import annotations

from dataclasses import asdict

import click
from sqlalchemy.exc import IntegrityError

from models.reports import list_workspaces
from models.workspaces import (
    DEFAULT_STEPS,
    StepSpec,
    checked_name,
    checked_prefix,
    checked_slug,
    create_workspace,
)
from worker.cli.output import emit_json, json_option, print_table
from worker.cli.params import checked_by
from worker.cli.runtime import CommandRuntime, Refused, pass_runtime


@click.group()
def workspace() -> None:
    """Workspaces: where tasks land."""


@workspace.command("add")
@click.argument("slug", callback=checked_by(checked_slug))
@click.option(
    "--name", required=True, callback=checked_by(checked_name), help="Human-readable name."
)
@click.option(
    "--prefix",
    required=True,
    callback=checked_by(checked_prefix),
    help="Task identifier prefix, e.g. ACME for ACME-12.",
)
@click.option(
    "--wip-limit",
    type=click.IntRange(min=0),
    default=None,
    help="Work-in-progress limit of the intake step (none by default).",
)
@json_option
@pass_runtime
def workspace_add(
    runtime: CommandRuntime, slug: str, name: str, prefix: str, wip_limit: int | None, as_json: bool
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
def workspace_list(runtime: CommandRuntime, as_json: bool) -> None:
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
