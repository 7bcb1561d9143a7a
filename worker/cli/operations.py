"""``taskhook operations``: the history of operators' bulk actions (bulk replays,
windows of downtime marked as handled by hand)."""

from __future__ import annotations

from dataclasses import asdict

import click

from models.operations import MAX_OPERATIONS_PAGE, list_operations
from worker.cli.output import emit_json, json_option, print_table
from worker.cli.runtime import CommandRuntime, pass_runtime


@click.group()
def operations() -> None:
    """The operations history: every bulk replay and every window marked as
    handled by hand (catch-up mark-handled), by whom, on what, and what it did."""


@operations.command("list")
@click.option("--limit", type=click.IntRange(1, MAX_OPERATIONS_PAGE), default=50, show_default=True)
@json_option
@pass_runtime
def operations_list(runtime: CommandRuntime, limit: int, as_json: bool) -> None:
    """Operations, newest first."""
    with runtime.session() as session:
        found = list_operations(session=session, limit=limit)
    if as_json:
        emit_json({"operations": [asdict(operation) for operation in found]})
        return
    print_table(
        (
            "ID",
            "STARTED",
            "FINISHED",
            "KIND",
            "NAME",
            "OPERATOR",
            "EXPECTED",
            "MATCHED",
            "DONE",
            "CRITERIA",
            "ERROR",
        ),
        (
            (
                o.id,
                o.started_at,
                o.finished_at,
                o.kind,
                o.name,
                o.operator,
                o.expected,
                o.matched,
                o.done,
                " ".join(f"{key}={value}" for key, value in o.criteria.items()) or "all",
                o.error,
            )
            for o in found
        ),
        empty="No operations yet: taskhook deliveries replay-matching --dry-run ...",
    )
