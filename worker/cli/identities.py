"""The identity ledger's names, and operator merges: ``taskhook identities``
``list``, ``merges``, ``merge`` and ``unmerge`` (docs/contract.md §15, items 9
and 10; docs/runbook.md, "Two tasks for one item: merge")."""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import asdict
from typing import Any

import click
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import idempotency, retry_safe
from models.access import Caller
from models.identities import NameView, list_names
from models.merges import (
    MergePlan,
    MergeSide,
    MergeView,
    list_merges,
    plan_merge,
)
from models.reports import get_workspace
from models.tables import Task
from models.tasks import MAX_RELEASE_REASON_LENGTH, clean_release_text
from worker.cli.output import echo, emit_json, json_option, print_fields, print_table, printable
from worker.cli.params import DATABASE_ID, checked_by, idempotency_key_option, operator_or_os_user
from worker.cli.runtime import CommandRuntime, Refused, pass_runtime

#: The CLI is the operator's own: it sees every workspace, as ``release`` does.
OPERATOR = Caller.trusted("taskhook identities")

_reason = functools.partial(
    clean_release_text,
    what="the reason",
    missing="a merge must give a reason",
    limit=MAX_RELEASE_REASON_LENGTH,
)
_TASK_IDENTIFIER = re.compile(r"[A-Z][A-Z0-9]*-[0-9]+")
DEFAULT_LIMIT = 200


def describe_names(names: tuple[NameView, ...] | list[NameView]) -> str:
    """A task's names on one line: ``jira:A-1 (held), jira:B-7 (held, alias)``."""
    if not names:
        return "-"
    return ", ".join(
        f"{n.name} ({n.state}{', alias' if n.alias else ''}"
        f"{', stable key' if n.kind == 'stable' else ''})"
        for n in names
    )


def _task_id(session: Session, given: str, option: str) -> int:
    """``given`` as a task id: a number, or a task identifier (``ACME-12``)."""
    if given.isdigit():
        return int(given)
    if not _TASK_IDENTIFIER.fullmatch(given):
        raise click.BadParameter(
            f"{given!r} is neither a task id (42) nor a task identifier (ACME-12)",
            param_hint=option,
        )
    found = session.scalars(select(Task.id).where(Task.identifier == given)).all()
    if len(found) != 1:
        why = "no task is" if not found else f"{len(found)} tasks are"
        raise Refused(f"{why} named {given}: pass the task id ({option} 42)")
    return found[0]


def _merge_json(view: MergeView) -> dict[str, Any]:
    return asdict(view) | {"undone": view.undone}


def _side_fields(side: MergeSide) -> str:
    archived = ", archived" if side.archived else ""
    return f"{side.identifier} (id {side.id}{archived})  {side.title}"


def _plan_fields(plan: MergePlan) -> list[tuple[str, Any]]:
    return [
        ("into", _side_fields(plan.into)),
        ("  its names", describe_names(plan.into.names)),
        ("from", _side_fields(plan.from_)),
        ("  its names", describe_names(plan.from_.names)),
        ("moving", f"{describe_names(plan.moving)} become aliases of {plan.into.identifier}"),
        (
            "then",
            f"{plan.from_.identifier} gives up its external id"
            + (" and is archived" if plan.archives_from else " (archived already)")
            + "; it is not deleted",
        ),
    ]


@click.group()
def identities() -> None:
    """The names tasks answer to, and operator merges of two tasks for one item."""


@identities.command("list")
@click.option("--workspace", "workspace_slug", default=None, help="Workspace slug.")
@click.option("--task", "task_id", type=DATABASE_ID, default=None, help="Only this task's names.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=DEFAULT_LIMIT, show_default=True)
@json_option
@pass_runtime
def identities_list(
    runtime: CommandRuntime,
    workspace_slug: str | None,
    task_id: int | None,
    limit: int,
    as_json: bool,
) -> None:
    """The identity ledger's names of a workspace or of a task, and their merges."""
    if workspace_slug is None and task_id is None:
        raise click.UsageError("name a workspace (--workspace SLUG) or a task (--task ID)")
    with runtime.session() as session:
        workspace_id = (
            get_workspace(session=session, slug=workspace_slug).id if workspace_slug else None
        )
        rows = list_names(session, workspace_id=workspace_id, task_id=task_id, limit=limit)
        merges = list_merges(
            session=session, caller=OPERATOR, workspace_id=workspace_id, task_id=task_id
        )
    if as_json:
        emit_json(
            {"names": [asdict(row) for row in rows], "merges": [_merge_json(m) for m in merges]}
        )
        return
    print_table(
        ("TASK", "KIND", "NAME", "STATE", "ALIAS", "MERGE", "CHANGED (UTC)"),
        (
            (row.task_id, row.kind, row.name, row.state, row.alias, row.merge_id, row.changed_at)
            for row in rows
        ),
        empty="No names.",
    )
    if merges:
        echo()
        _print_merges(merges)


def _print_merges(merges: list[MergeView]) -> None:
    print_table(
        ("MERGE", "INTO", "FROM", "NAMES", "OPERATOR", "MERGED (UTC)", "UNDONE", "REASON"),
        (
            (
                m.id,
                m.into_task_id,
                m.from_task_id,
                ", ".join(n.name for n in m.names),
                m.operator,
                m.merged_at,
                f"{m.undone_at:%Y-%m-%d %H:%M} by {m.undone_by}" if m.undone_at else "no",
                m.reason,
            )
            for m in merges
        ),
        empty="No merges.",
    )


@identities.command("merges")
@click.option("--workspace", "workspace_slug", default=None, help="Workspace slug.")
@click.option("--task", "task_id", type=DATABASE_ID, default=None, help="Merges into or from it.")
@json_option
@pass_runtime
def identities_merges(
    runtime: CommandRuntime, workspace_slug: str | None, task_id: int | None, as_json: bool
) -> None:
    """The merges' audit, newest first."""
    with runtime.session() as session:
        workspace_id = (
            get_workspace(session=session, slug=workspace_slug).id if workspace_slug else None
        )
        merges = list_merges(
            session=session, caller=OPERATOR, workspace_id=workspace_id, task_id=task_id
        )
    if as_json:
        emit_json({"merges": [_merge_json(m) for m in merges]})
        return
    _print_merges(merges)


def _confirmed(question: str, *, err: bool) -> None:
    """Ask ``question``; a no aborts. Without a terminal, the end of input
    means the caller forgot ``--yes``, and the error says so."""
    try:
        answer = click.confirm(printable(question), err=err)
    except click.Abort:
        if sys.stdin.isatty():
            raise
        raise click.UsageError(
            f"{question!r} got no answer (stdin is not a terminal): pass --yes to merge "
            "without asking"
        ) from None
    if not answer:
        raise click.Abort()


@identities.command("merge")
@click.option(
    "--into", "into", required=True, help="The task that keeps its names (id or ACME-12)."
)
@click.option("--from", "from_", required=True, help="The task whose names move (id or ACME-12).")
@click.option(
    "--operator", default=None, callback=operator_or_os_user, help="Who merges [the OS user]."
)
@click.option(
    "--reason", required=True, callback=checked_by(_reason), help="Why; kept in the audit row."
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@idempotency_key_option(
    "A key to retry this merge under: run again with it, it merges once and answers that merge."
)
@json_option
@pass_runtime
def identities_merge(
    runtime: CommandRuntime,
    into: str,
    from_: str,
    operator: str,
    reason: str,
    yes: bool,
    as_json: bool,
    idempotency_key: str | None,
) -> None:
    """Merge task FROM's names into task INTO: one real item, two tasks.

    FROM's names become INTO's aliases, FROM gives up its external id and is
    archived (never deleted). Audited; undo with `taskhook identities unmerge`.
    """
    retry = idempotency.Retry.of(idempotency.cli_actor(operator), idempotency_key)
    with runtime.session() as session:
        into_id, from_id = _task_id(session, into, "--into"), _task_id(session, from_, "--from")
        # A run again under the key of a merge that committed: its answer, not a refusal
        # (the task merged from answers to no name any more).
        merged_before = retry_safe.merged_under_key(
            session, OPERATOR, retry, into_task_id=into_id, from_task_id=from_id, reason=reason
        )
    if merged_before is not None:
        if as_json:
            emit_json(_merge_json(merged_before))
            return
        echo(f"Merged already under this key: merge {merged_before.id}. Nothing changed.")
        return
    with runtime.session() as session:
        plan = plan_merge(
            session=session, caller=OPERATOR, into_task_id=into_id, from_task_id=from_id
        )
    # With --json the preview and the question go to stderr; stdout stays one document.
    echo("Merge, as one real item:", err=as_json)
    print_fields(_plan_fields(plan), err=as_json)
    if not yes:
        _confirmed("Merge them?", err=as_json)
    with runtime.session() as session:
        done, _receipt = retry_safe.merge(
            session=session,
            caller=OPERATOR,
            into_task_id=into_id,
            from_task_id=from_id,
            operator=operator,
            reason=reason,
            retry=retry,
        )
    if as_json:
        emit_json(_merge_json(done))
        return
    echo(
        f"Merged {plan.from_.identifier} into {plan.into.identifier}: merge {done.id}, "
        f"operator {done.operator}. Undo: taskhook identities unmerge {done.id} --reason TEXT"
    )


@identities.command("unmerge")
@click.argument("merge_id", type=DATABASE_ID)
@click.option(
    "--operator", default=None, callback=operator_or_os_user, help="Who undoes it [the OS user]."
)
@click.option(
    "--reason", required=True, callback=checked_by(_reason), help="Why; kept in the audit row."
)
@idempotency_key_option(
    "A key to retry this undo under: run again with it, it undoes once and answers that undo."
)
@json_option
@pass_runtime
def identities_unmerge(
    runtime: CommandRuntime,
    merge_id: int,
    operator: str,
    reason: str,
    as_json: bool,
    idempotency_key: str | None,
) -> None:
    """Undo merge MERGE_ID: its names go back to the task merged from, which
    gets its external id back and is un-archived if the merge archived it."""
    with runtime.session() as session:
        undone, replayed = retry_safe.unmerge(
            session=session,
            caller=OPERATOR,
            merge_id=merge_id,
            operator=operator,
            reason=reason,
            retry=idempotency.Retry.of(idempotency.cli_actor(operator), idempotency_key),
        )
        back = session.get(Task, undone.from_task_id)
        owner = back.identifier if back is not None else f"task {undone.from_task_id}"
    if as_json:
        emit_json(_merge_json(undone) | {"replayed": replayed})
        return
    if replayed:
        echo(f"Undone already under this key: merge {undone.id}. Nothing changed.")
        return
    echo(
        f"Undid merge {undone.id}: {printable(', '.join(n.name for n in undone.names))} are "
        f"{owner}'s again; operator {operator}."
    )
