"""``taskhook operations``: the history of operators' bulk actions (bulk replays,
windows of downtime marked as handled by hand) and of console sign-ins."""

from __future__ import annotations

from dataclasses import asdict

import click

from models.catchup import MARK_HANDLED
from models.console_sessions import CONSOLE_SIGN_IN
from models.operations import BULK_REPLAY, MAX_OPERATIONS_PAGE, list_operations
from worker.cli.output import emit_json, json_option, print_table
from worker.cli.runtime import CommandRuntime, pass_runtime

#: The kinds of operation the history holds.
OPERATION_KINDS = (BULK_REPLAY, MARK_HANDLED, CONSOLE_SIGN_IN)


@click.group()
def operations() -> None:
    """The operations history: every bulk replay, every window marked as
    handled by hand (catch-up mark-handled) and every console sign-in, by
    whom, on what, and what it did."""


@operations.command("list")
@click.option("--limit", type=click.IntRange(1, MAX_OPERATIONS_PAGE), default=50, show_default=True)
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice(OPERATION_KINDS),
    help="Only operations of this kind (repeatable): console-sign-in lists who signed in "
    "to the console, when, and from where.",
)
@json_option
@pass_runtime
def operations_list(
    runtime: CommandRuntime, limit: int, kinds: tuple[str, ...], as_json: bool
) -> None:
    """Operations, newest first."""
    with runtime.session() as session:
        found = list_operations(session=session, limit=limit, kinds=kinds or None)
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
