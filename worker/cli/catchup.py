"""``taskhook catch-up``: recover the deliveries a sender failed to get through."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import click

from models.messages import DELIVERIES_QUEUE, PROCESS_DELIVERY
from models.tables import utcnow
from worker.cli.output import emit_json, json_option, print_fields
from worker.cli.runtime import CommandRuntime, Refused, first_line, pass_runtime

_DURATION = re.compile(r"([1-9][0-9]{0,5})([mhd])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


class Since(click.ParamType):
    """How far back to read: a duration (``90m``, ``6h``, ``3d``) or a UTC
    date or time (``2026-11-30``, ``2026-11-30T08:00``)."""

    name = "since"

    def convert(self, value, param, ctx) -> datetime:
        if isinstance(value, datetime):
            return value
        duration = _DURATION.fullmatch(value.strip())
        if duration:
            amount, unit = duration.groups()
            return utcnow() - timedelta(**{_UNITS[unit]: int(amount)})
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            self.fail(f"{value!r} is neither a duration (90m, 6h, 3d) nor a date", param, ctx)
        return when if when.tzinfo else when.replace(tzinfo=UTC)


@click.group("catch-up")
def catch_up() -> None:
    """Recover deliveries the sender failed to get through (GitHub's delivery log)."""


@catch_up.command("github")
@click.option("--source", "slug", required=True, help="The GitHub source to catch up.")
@click.option(
    "--since",
    type=Since(),
    default=None,
    help="Read from then (90m, 6h, 3d, or a date); by default from the last run's end.",
)
@click.option("--dry-run", is_flag=True, help="Say what is missing; store nothing.")
@click.option(
    "--redeliver",
    is_flag=True,
    help="Ask GitHub to send each missing delivery again, instead of fetching it.",
)
@json_option
@pass_runtime
def catch_up_github_command(
    runtime: CommandRuntime,
    slug: str,
    since: datetime | None,
    dry_run: bool,
    redeliver: bool,
    as_json: bool,
) -> None:
    """List the hook's deliveries since the last run and store every create
    delivery the inbox does not hold, as if it had arrived: the worker then
    creates its task, once. Safe to run again and again."""
    from worker.catchup.github_log import CatchUpError
    from worker.catchup.service import catch_up_github

    unsent: list[int] = []

    def send(pk: int) -> None:
        # A row the broker does not take is still queued: the sweeper sends it.
        try:
            _load_celery_app().send_task(PROCESS_DELIVERY, args=[pk], queue=DELIVERIES_QUEUE)
        except Exception as error:
            unsent.append(pk)
            if len(unsent) == 1:
                click.echo(f"The broker did not take a message ({first_line(error)}).", err=True)

    try:
        report = catch_up_github(
            sessions=runtime.sessions,
            slug=slug,
            send=send,
            since=since,
            dry_run=dry_run,
            redeliver=redeliver,
        )
    except CatchUpError as error:
        raise Refused(f"catch-up of {slug} stopped: {error}") from None
    if as_json:
        emit_json(
            {
                "run": report.run_id,
                "source": slug,
                "since": report.since,
                "covered_until": report.covered_until,
                "dry_run": dry_run,
                "attempts_listed": report.attempts_listed,
                "deliveries_listed": report.deliveries_listed,
                "missed": report.missed,
                "recovered": report.recovered,
                "refused": report.refused,
                "not_sent": unsent,
            }
        )
        return
    verb = "would recover" if dry_run else ("asked GitHub to redeliver" if redeliver else "stored")
    print_fields(
        (
            ("Source", slug),
            ("Read since", report.since),
            ("Attempts listed", report.attempts_listed),
            ("Deliveries listed", report.deliveries_listed),
            ("Missed creates", len(report.missed)),
            (verb.capitalize(), len(report.missed) if dry_run else len(report.recovered)),
        )
    )
    for guid, why in report.refused.items():
        click.echo(f"Not stored: {guid}: {why}")
    if unsent:
        click.echo(
            f"{len(unsent)} stored but not sent: the sweeper sends them once the broker is back."
        )


def _load_celery_app():
    from worker import cli as cli_package

    return cli_package.load_celery_app()
