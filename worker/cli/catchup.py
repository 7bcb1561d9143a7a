"""``taskhook catch-up``: recover the deliveries a sender failed to get through."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import click

from models.broker.lanes import Sender, keys_per_message, lane_of
from models.broker.messages import message_groups, task_for
from models.catchup import checked_repo, mark_handled
from models.tables import utcnow
from worker.cli import runtime as cli_runtime
from worker.cli.output import echo, emit_json, json_option, print_fields, printable
from worker.cli.params import checked_by, operator_or_os_user
from worker.cli.runtime import CommandRuntime, Refused, first_line, pass_runtime

if TYPE_CHECKING:
    from worker.catchup.service import CatchUpReport

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
    """Recover deliveries the sender failed to get through: GitHub's delivery
    log or a scan of its issues, Jira's search, GitLab's hook events and a scan
    of its issues and merge requests; or mark a window as handled by hand."""


_since_option = click.option(
    "--since",
    type=Since(),
    default=None,
    help="Read from then (90m, 6h, 3d, or a UTC date); by default from the last run's end.",
)
_dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Say what is missing; store nothing."
)


@catch_up.command("github")
@click.option("--source", "slug", required=True, help="The GitHub source to catch up.")
@_since_option
@_dry_run_option
@click.option(
    "--redeliver",
    is_flag=True,
    help="Ask GitHub to send each missing delivery again, instead of fetching it.",
)
@click.option(
    "--scan",
    is_flag=True,
    help="List the issues and pull requests created since, instead of the delivery log "
    "(for what is older than the log's 3 days).",
)
@click.option(
    "--repo",
    default=None,
    callback=checked_by(checked_repo),
    help="With --scan: the repository to list (OWNER/REPO); by default the source's hook's.",
)
@json_option
@pass_runtime
def catch_up_github_command(
    runtime: CommandRuntime,
    slug: str,
    since: datetime | None,
    dry_run: bool,
    redeliver: bool,
    scan: bool,
    repo: str | None,
    as_json: bool,
) -> None:
    """List the hook's deliveries since the last run and store every create
    delivery the inbox does not hold, as if it had arrived: the worker then
    creates its task, once. With --scan, list the repository's issues and pull
    requests instead, and store a create for each one the workspace never had.
    Safe to run again and again."""
    from worker.catchup.service import catch_up_github, scan_github

    if scan and redeliver:
        raise click.UsageError("--redeliver asks GitHub's log; a --scan reads no log")
    if repo is not None and not scan:
        raise click.UsageError("--repo names the repository a --scan lists")
    if scan:
        run = functools.partial(scan_github, repo=repo)
    else:
        run = functools.partial(catch_up_github, redeliver=redeliver)
    _run_and_report(runtime, run, slug, since, dry_run, as_json, redeliver=redeliver)


@catch_up.command("jira")
@click.option("--source", "slug", required=True, help="The Jira source to catch up.")
@_since_option
@_dry_run_option
@json_option
@pass_runtime
def catch_up_jira_command(
    runtime: CommandRuntime, slug: str, since: datetime | None, dry_run: bool, as_json: bool
) -> None:
    """Search the source's Jira site for the issues created since the last run
    (narrowed by the source's JQL filter) and store a jira:issue_created for
    each one the workspace never had: the worker then creates its task, once.
    Safe to run again and again."""
    from worker.catchup.service import catch_up_jira

    _run_and_report(runtime, catch_up_jira, slug, since, dry_run, as_json)


@catch_up.command("gitlab")
@click.option("--source", "slug", required=True, help="The GitLab source to catch up.")
@_since_option
@_dry_run_option
@json_option
@pass_runtime
def catch_up_gitlab_command(
    runtime: CommandRuntime, slug: str, since: datetime | None, dry_run: bool, as_json: bool
) -> None:
    """Read the source's hook's recorded events (GitLab 17.3 and later keep 7
    days of them) and store each create delivery the inbox does not hold; then
    list the project's or group's issues and merge requests created since the
    last run and store an open for each one the workspace never had: the
    worker then creates its task, once. Safe to run again and again."""
    from worker.catchup.service import catch_up_gitlab

    _run_and_report(runtime, catch_up_gitlab, slug, since, dry_run, as_json)


@catch_up.command("mark-handled")
@click.option("--source", "slug", required=True, help="The source whose window was handled.")
@click.option(
    "--since",
    type=Since(),
    required=True,
    metavar="TIME",
    help="The window's start: a UTC date or time, or how long ago (6h).",
)
@click.option(
    "--until",
    type=Since(),
    required=True,
    metavar="TIME",
    help="The window's end: a UTC date or time, or how long ago (90m).",
)
@click.option("--reason", required=True, help="How it was handled: kept in the history.")
@click.option(
    "--operator", default=None, callback=operator_or_os_user, help="Who handled it [the OS user]."
)
@json_option
@pass_runtime
def mark_handled_command(
    runtime: CommandRuntime,
    slug: str,
    since: datetime,
    until: datetime,
    reason: str,
    operator: str,
    as_json: bool,
) -> None:
    """Record that the source's deliveries from --since to --until were handled
    by hand (for a sender taskhook cannot read, or an API that will not
    answer): stats, the console and /metrics no longer report a window of
    downtime within it. Recorded with who and why, in stats and in
    taskhook operations list; it reads nothing and stores nothing."""
    with runtime.session() as session:
        run = mark_handled(
            session=session,
            slug=slug,
            since=since,
            until=until,
            operator=operator,
            reason=reason,
        )
        run_id = run.id
    if as_json:
        emit_json(
            {
                "run": run_id,
                "source": slug,
                "since": since,
                "until": until,
                "operator": operator,
                "reason": reason,
            }
        )
        return
    echo(
        f"Marked {slug} from {since:%Y-%m-%d %H:%M:%S} to {until:%Y-%m-%d %H:%M:%S} UTC "
        f"as handled by hand (operator {operator}). History: taskhook operations list"
    )


def _run_and_report(
    runtime: CommandRuntime,
    run: Callable[..., CatchUpReport],
    slug: str,
    since: datetime | None,
    dry_run: bool,
    as_json: bool,
    *,
    redeliver: bool = False,
) -> None:
    from worker.catchup.api import CatchUpError

    unsent: list[int] = []
    lane = lane_of(Sender.CATCH_UP)
    per_message = keys_per_message(runtime.settings, lane)

    def send(pks: list[int]) -> None:
        # A row the broker does not take is still queued: the sweeper sends it.
        for keys in message_groups(pks, per_message):
            name, args = task_for(keys)
            try:
                _load_celery_app().send_task(name, args=args, queue=lane)
            except Exception as error:
                if not unsent:
                    said = first_line(error)
                    echo(f"The broker did not take a message ({said}).", err=True)
                unsent.extend(keys)

    try:
        report = run(sessions=runtime.sessions, slug=slug, send=send, since=since, dry_run=dry_run)
    except CatchUpError as error:
        raise Refused(f"catch-up of {slug} stopped: {error}") from None
    if as_json:
        emit_json(
            {
                "run": report.run_id,
                "source": slug,
                "kind": report.kind,
                "since": report.since,
                "covered_until": report.covered_until,
                "dry_run": dry_run,
                "attempts_listed": report.attempts_listed,
                "deliveries_listed": report.deliveries_listed,
                "missed": report.missed,
                "recovered": report.recovered,
                "refused": report.refused,
                "not_sent": unsent,
                **(
                    {"hook_id": report.hook_id, "hook_note": report.hook_note}
                    if report.kind == "gitlab"
                    else {}
                ),
            }
        )
        return
    verb = "would recover" if dry_run else ("asked GitHub to redeliver" if redeliver else "stored")
    if report.kind == "log":
        listed = (
            ("Attempts listed", report.attempts_listed),
            ("Deliveries listed", report.deliveries_listed),
        )
    elif report.kind == "gitlab":
        if report.hook_note is not None:
            events = f"none read: {report.hook_note}; scanned only"
        elif report.hook_id is not None:
            events = f"{report.attempts_listed} (hook {report.hook_id})"
        else:
            events = (
                "none read: no hook id set, and no hook of the project or group posts to "
                "this source (taskhook source catch-up NAME ... --hook-id ID)"
            )
        listed = (("Hook events listed", events), ("Items created since", report.items_listed))
    else:
        listed = (("Items created since", report.deliveries_listed),)
    print_fields(
        (
            ("Source", slug),
            ("Read", _READ[report.kind]),
            ("Read since", report.since),
            *listed,
            ("Missed creates", len(report.missed)),
            (verb.capitalize(), len(report.missed) if dry_run else len(report.recovered)),
        )
    )
    for delivery_id, why in report.refused.items():
        echo(f"Not stored: {printable(delivery_id)}: {printable(why)}")
    if report.kind == "scan" and report.covered_until is None and not dry_run:
        echo("This scan read one repository of the hook's: the source is not covered by it.")
    if unsent:
        echo(f"{len(unsent)} stored but not sent: the sweeper sends them once the broker is back.")


_READ = {
    "log": "GitHub's delivery log",
    "scan": "GitHub's issues and pull requests",
    "search": "Jira's issue search",
    "gitlab": "GitLab's hook events, then its issues and merge requests",
}


def _load_celery_app():
    # Looked up at call time, so that the tests' replacement takes effect here.
    return cli_runtime.load_celery_app()
