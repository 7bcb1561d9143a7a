"""``taskhook workspace``: where tasks land."""

from __future__ import annotations

from dataclasses import asdict

import click
from sqlalchemy.exc import IntegrityError

from models.reports import StepSummary, get_workspace, list_steps, list_workspaces
from models.workspaces import (
    DEFAULT_STEPS,
    StepSpec,
    checked_name,
    checked_prefix,
    checked_slug,
    create_workspace,
    find_step,
    reserve_deletes,
    set_wip_limit,
)
from worker.cli.output import echo, emit_json, json_option, print_table
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
    echo(f"Workspace {slug} ({summary['name']}) added: tasks will be {prefix}-1, {prefix}-2, …")
    echo(f"Next: taskhook source add github|gitlab|jira --workspace {slug}")


@workspace.command("list")
@json_option
@pass_runtime
def workspace_list(runtime: CommandRuntime, as_json: bool) -> None:
    """Every workspace, with its task and source counts.

    ID is what the REST API's routes take (/api/v1/workspaces/ID/tasks)."""
    with runtime.session() as session:
        found = list_workspaces(session=session)
    if as_json:
        emit_json({"workspaces": [asdict(item) for item in found]})
        return
    print_table(
        ("ID", "SLUG", "NAME", "PREFIX", "TASKS", "SOURCES", "CREATED"),
        ((w.id, w.slug, w.name, w.task_prefix, w.tasks, w.sources, w.created_at) for w in found),
        empty="No workspaces yet: taskhook workspace add SLUG --name NAME --prefix PREFIX",
    )


@workspace.command("wip")
@click.argument("slug")
@click.option(
    "--step",
    "step_name",
    default=None,
    help="The step, by name [the intake step, where new tasks land].",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=None,
    help="Set the step's WIP limit to this many unarchived tasks.",
)
@click.option("--no-limit", is_flag=True, help="Remove the step's WIP limit.")
@json_option
@pass_runtime
def workspace_wip(
    runtime: CommandRuntime,
    slug: str,
    step_name: str | None,
    limit: int | None,
    no_limit: bool,
    as_json: bool,
) -> None:
    """Show the WIP limits of workspace SLUG's steps, or set one.

    Without --limit or --no-limit it only shows each step, its limit and the
    unarchived tasks in it. A full intake step parks new deliveries as
    needs_operator: raise its limit, or archive tasks (taskhook task archive),
    then replay them. Tasks already in a step stay when its limit is lowered.
    """
    if limit is not None and no_limit:
        raise click.UsageError("give --limit N or --no-limit, not both")
    changed = limit is not None or no_limit
    with runtime.session() as session:
        workspace_id = get_workspace(session=session, slug=slug).id
        if changed:
            step = set_wip_limit(
                session=session, workspace_id=workspace_id, step_name=step_name, wip_limit=limit
            )
        elif step_name is not None:
            step = find_step(session=session, workspace_id=workspace_id, step_name=step_name)
        if step_name is not None or changed:
            step_name = step.name
        steps = list_steps(session=session, workspace_id=workspace_id)
    shown = [s for s in steps if step_name is None or s.name == step_name]
    if as_json:
        emit_json(
            {
                "workspace": slug,
                "changed": changed,
                "steps": [asdict(s) | {"full": s.full} for s in shown],
            }
        )
        return
    if changed:
        now = "no WIP limit" if limit is None else f"a WIP limit of {limit}"
        echo(f"Step {step_name!r} of workspace {slug} has {now} now.")
    _print_steps(shown)


@workspace.command("deletes")
@click.argument("slug")
@click.option(
    "--operators-only",
    "to_operators",
    flag_value=True,
    default=None,
    help="Only operator tokens may delete the workspace's tasks; a member's delete is 403.",
)
@click.option(
    "--members-too",
    "to_operators",
    flag_value=False,
    help="Member tokens may delete the workspace's tasks too (the default).",
)
@json_option
@pass_runtime
def workspace_deletes(
    runtime: CommandRuntime, slug: str, to_operators: bool | None, as_json: bool
) -> None:
    """Show who may delete workspace SLUG's tasks, or set it.

    Every delete is audited either way (`taskhook task deletions`); a delete
    frees the task's external id as a release does."""
    with runtime.session() as session:
        found = get_workspace(session=session, slug=slug)
        changed = to_operators is not None and reserve_deletes(
            session=session, workspace=found, to_operators=to_operators
        )
        operators_only = found.deletes_need_operator
    if as_json:
        emit_json({"workspace": slug, "changed": changed, "deletes_need_operator": operators_only})
        return
    who = "operator tokens only" if operators_only else "member and operator tokens"
    echo(f"Tasks of workspace {slug} may be deleted by {who}{' now' if changed else ''}.")


def _print_steps(steps: list[StepSummary]) -> None:
    print_table(
        ("STEP", "WIP LIMIT", "TASKS", "NOTE"),
        (
            (
                s.name,
                "none" if s.wip_limit is None else s.wip_limit,
                s.tasks,
                ", ".join(
                    part
                    for part in ("intake" if s.intake else "", "FULL" if s.full else "")
                    if part
                ),
            )
            for s in steps
        ),
        empty="No workflow steps.",
    )
