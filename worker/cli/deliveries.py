"""The inbox: ``taskhook deliveries list|show|replay|replay-matching|prune`` and
``taskhook stats``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime

import click

from models import idempotency
from models.broker.lanes import Sender, keys_per_message, lane_of
from models.broker.messages import PROCESS_DELIVERY, message_groups, task_for
from models.credentials import PLAIN, credential_counts
from models.inbox import DeliveryStatus, replay
from models.operations import (
    DeliveryFilter,
    bulk_replay,
    checked_name,
    count_replayable,
    started_under_key,
)
from models.replay_plan import ReplayPlan, plan_replay
from models.reports import (
    LISTED_BACKLOGS,
    MAX_PAGE,
    Backlogs,
    DeliveryDetail,
    DeliverySummary,
    Gaps,
    InboxDiskUse,
    gaps,
    inbox_disk_use,
    inbox_stats,
    list_deliveries,
    show_delivery,
    workspace_backlogs,
)
from models.retention import Policy, plan, prune
from models.tables import utcnow

# The module itself, for the load_celery_app hook: looked up at call time, so
# that replacing ``worker.cli.runtime.load_celery_app`` (as the tests do) takes effect here.
from worker.cli import runtime as cli_runtime
from worker.cli.output import (
    echo,
    emit_json,
    format_age,
    format_when,
    json_option,
    print_fields,
    print_table,
)
from worker.cli.params import DATABASE_ID, checked_by, idempotency_key_option, operator_or_os_user
from worker.cli.prompts import confirmed, someone_can_answer
from worker.cli.runtime import CommandRuntime, Refused, first_line, pass_runtime


def delivery_reason(delivery: DeliverySummary) -> str | None:
    """Why the delivery is in its state; for a dead one, also the error it died of."""
    if delivery.status != DeliveryStatus.DEAD:
        return delivery.status_reason
    return "; ".join(part for part in (delivery.status_reason, delivery.last_error) if part) or None


def print_deliveries(deliveries: Sequence[DeliverySummary], *, empty: str) -> None:
    print_table(
        (
            "ID",
            "RECEIVED",
            "SOURCE",
            "EVENT",
            "STATUS",
            "TRIES",
            "OUTCOME",
            "TASK",
            "EXTERNAL ID",
            "REASON",
        ),
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
                d.external_id,
                delivery_reason(d),
            )
            for d in deliveries
        ),
        empty=empty,
    )


@click.group()
def deliveries() -> None:
    """The inbox: every delivery GitHub, GitLab and Jira sent."""


@deliveries.command("list")
@click.option(
    "--status",
    type=click.Choice([status.value for status in DeliveryStatus]),
    default=None,
    help="Only deliveries in this state.",
)
@click.option("--limit", type=click.IntRange(1, MAX_PAGE), default=50, show_default=True)
@click.option("--before", type=DATABASE_ID, default=None, help="Page: ids below this.")
@json_option
@pass_runtime
def deliveries_list(
    runtime: CommandRuntime, status: str | None, limit: int, before: int | None, as_json: bool
) -> None:
    """Deliveries, newest first."""
    with runtime.session() as session:
        page = list_deliveries(session=session, status=status, limit=limit, before=before)
    if as_json:
        emit_json(page)
        return
    print_deliveries(page.deliveries, empty="No deliveries.")
    if page.next_before is not None:
        more = f"--status {status} " if status else ""
        echo(f"More: taskhook deliveries list {more}--before {page.next_before}")


@deliveries.command("show")
@click.argument("delivery", type=DATABASE_ID, metavar="ID")
@json_option
@pass_runtime
def deliveries_show(runtime: CommandRuntime, delivery: int, as_json: bool) -> None:
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
            ("external id", d.external_id),
            ("task", d.task_identifier or d.task_id),
            ("last error", d.last_error),
            ("received", d.received_at),
            ("updated", d.updated_at),
            ("lease until", d.lease_expires_at),
            ("body", _body(detail)),
            ("content type", detail.content_type),
            ("hook id", detail.hook_id),
            ("mismatches", f"{detail.payload_mismatches} redelivery(ies) with another body"),
        ]
    )
    if detail.headers:
        echo("  headers")
        print_fields([(f"  {name}", value) for name, value in detail.headers.items()])


def _print_plan(plan: ReplayPlan, *, err: bool) -> None:
    echo(
        f"Replay delivery {plan.delivery} ({plan.provider} id {plan.delivery_id}, {plan.event}, "
        f"workspace {plan.workspace}):",
        err=err,
    )
    print_fields(
        [
            ("status", plan.status),
            ("reason", plan.reason),
            ("external id", plan.external_id),
            ("replaying", plan.will),
        ],
        err=err,
    )
    if plan.warning is not None:
        echo(f"WARNING: {plan.warning}.", err=err)


@deliveries.command("replay")
@click.argument("delivery", type=DATABASE_ID, metavar="ID")
@click.option("--dry-run", is_flag=True, help="Show what replaying would do; change nothing.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--operator", default=None, callback=operator_or_os_user, help="Who replays [the OS user]."
)
@idempotency_key_option(
    "A key to retry this replay under: run again with it, it replays once and says so."
)
@json_option
@pass_runtime
def deliveries_replay(
    runtime: CommandRuntime,
    delivery: int,
    dry_run: bool,
    yes: bool,
    operator: str,
    idempotency_key: str | None,
    as_json: bool,
) -> None:
    """Send a needs_operator, dead, replay or mismatch delivery ID through the
    worker again.

    Shows first what replaying will do (the delivery, its status and reason,
    and whether the worker finds its task, finishes its create or creates a
    new task), then asks "Replay it?" at a terminal. A replay that creates
    again a task someone deleted, or runs a resent body (replay, mismatch),
    asks even from a script, and is refused there without --yes; any other
    replay from a script (stdin not a terminal) goes ahead without asking,
    as it always did. --yes answers yes; --dry-run shows the plan and
    changes nothing; with --json the plan and the question go to stderr.
    """
    retry = idempotency.Retry.of(idempotency.cli_actor(operator), idempotency_key)
    request = {"action": idempotency.Action.REPLAY, "target": f"delivery {delivery}", "body": {}}
    with runtime.session() as session:
        # A run again under the key of a replay that committed: said, not refused
        # (the delivery is queued or settled now, which no replay takes).
        if not dry_run and idempotency.answered_before(session, retry, **request) is not None:
            _say_replayed_before(delivery, as_json)
            return
        shown = plan_replay(session=session, delivery_pk=delivery)
    if dry_run:
        if as_json:
            emit_json({"dry_run": True, "plan": _plan_json(shown)})
            return
        _print_plan(shown, err=False)
        echo(f"Dry run: nothing changed. To replay it: taskhook deliveries replay {delivery}")
        return
    _print_plan(shown, err=as_json)
    if not yes and (shown.needs_consent or someone_can_answer()):
        confirmed("Replay it?", err=as_json, action="replay")
    with runtime.session() as session:
        # What was shown is what is done: a delivery whose task changed
        # meanwhile (found, deleted, replayed by someone else) is looked at again.
        if plan_replay(session=session, delivery_pk=delivery) != shown:
            raise Refused(
                f"delivery {delivery} changed since its plan was shown; nothing was replayed: "
                f"look again (taskhook deliveries replay {delivery} --dry-run)"
            )
        _answer, replayed = idempotency.answered_once(
            session,
            retry,
            **request,
            work=lambda: {"delivery": replay(session=session, delivery_pk=delivery).id},
        )
    if replayed:  # another run under the key replayed it meanwhile, and sent it
        _say_replayed_before(delivery, as_json)
        return
    # Committed: only now may a worker see the message (store, commit, then enqueue).
    try:
        cli_runtime.load_celery_app().send_task(
            PROCESS_DELIVERY, args=[delivery], queue=lane_of(Sender.OPERATOR_REPLAY)
        )
        enqueued, problem = True, None
    except Exception as error:  # the row is queued and durable: the sweeper sends it later
        enqueued, problem = False, first_line(error)
    if as_json:
        emit_json(
            {
                "dry_run": False,
                "delivery": delivery,
                "replayed": False,
                "status": "queued",
                "enqueued": enqueued,
                "error": problem,
                "plan": _plan_json(shown),
            }
        )
        return
    if enqueued:
        echo(f"Delivery {delivery} is queued again and sent to the worker.")
        echo(f"Follow it: taskhook deliveries show {delivery}")
    else:
        settings = runtime.settings
        within = settings.queued_grace_seconds + settings.sweep_interval_seconds
        echo(
            f"Delivery {delivery} is queued again, but the broker did not take the message "
            f"({problem}); the sweeper sends it within about {within:g}s once the broker is back."
        )


def _say_replayed_before(delivery: int, as_json: bool) -> None:
    if as_json:
        emit_json({"dry_run": False, "delivery": delivery, "replayed": True})
        return
    echo(
        f"Delivery {delivery} was replayed already under this key; nothing changed. "
        f"Follow it: taskhook deliveries show {delivery}"
    )


def _plan_json(plan: ReplayPlan) -> dict[str, object]:
    return asdict(plan) | {"needs_consent": plan.needs_consent}


class UtcTime(click.ParamType):
    """An ISO 8601 date or time (``2026-12-01``, ``2026-12-01T08:00``,
    ``2026-12-01T09:00+01:00``); UTC when it names no offset."""

    name = "time"

    def convert(self, value, param, ctx) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            self.fail(f"{value!r} is not an ISO 8601 date or time", param, ctx)
        return when if when.tzinfo else when.replace(tzinfo=UTC)


@deliveries.command("replay-matching")
@click.option(
    "--status",
    type=click.Choice([status.value for status in DeliveryStatus]),
    default=None,
    help="Only deliveries in this state [needs_operator and dead].",
)
@click.option("--source", default=None, help="Only deliveries of this source.")
@click.option("--event", default=None, help="Only deliveries of this event (issues.opened).")
@click.option(
    "--since", type=UtcTime(), default=None, help="Received then or later (ISO 8601, UTC)."
)
@click.option("--until", type=UtcTime(), default=None, help="Received before then (ISO 8601, UTC).")
@click.option(
    "--search", default=None, help="A delivery id, an external id, or an inbox id to match."
)
@click.option(
    "--recreate",
    "named",
    type=DATABASE_ID,
    multiple=True,
    metavar="ID",
    help=(
        "Replay delivery ID too, although its task was deleted before its creation settled: "
        "its task is created again. Left out otherwise; the dry run lists them. Repeatable."
    ),
)
@click.option("--dry-run", is_flag=True, help="Count what would be replayed; change nothing.")
@click.option(
    "--name",
    default=None,
    callback=checked_by(checked_name),
    help="What the run is for, as the operations history lists it (required to run).",
)
@click.option(
    "--expect",
    type=click.IntRange(min=0),
    default=None,
    help="The count the dry run showed, kept with the run in the history.",
)
@click.option(
    "--operator",
    default=None,
    callback=operator_or_os_user,
    help="Who replays, as the history names them [the OS user].",
)
@idempotency_key_option(
    "A key to retry this run under: run again with it, it starts once and answers that run."
)
@json_option
@pass_runtime
def deliveries_replay_matching(
    runtime: CommandRuntime,
    status: str | None,
    source: str | None,
    event: str | None,
    since: datetime | None,
    until: datetime | None,
    search: str | None,
    named: tuple[int, ...],
    dry_run: bool,
    name: str | None,
    expect: int | None,
    operator: str,
    as_json: bool,
    idempotency_key: str | None,
) -> None:
    """Send every needs_operator and dead delivery that matches through the
    worker again, as `replay` does one: after fixing a cause many deliveries
    failed of. Run it with --dry-run first; the run is kept in the operations
    history (taskhook operations list) under its --name.

    A delivery whose task was deleted before its creation settled is left
    out: replaying it creates that task again, which is a decision about the
    one item. The dry run counts and lists them apart; name each one that
    should exist again with --recreate ID (or replay it on its own)."""
    if name is None and not dry_run:
        raise click.UsageError(
            "--name is required to run a bulk replay (the operations history lists it by "
            "its name); --dry-run only counts"
        )
    if since is not None and until is not None and since >= until:
        raise click.UsageError("--since must be before --until")
    found = DeliveryFilter(
        status=status,
        source=source,
        event=event,
        received_from=since,
        received_until=until,
        search=search,
    )
    recreate = frozenset(named)
    if dry_run:
        with runtime.session() as session:
            count = count_replayable(session=session, filter=found, named=recreate)
        if as_json:
            emit_json(
                {
                    "dry_run": True,
                    "criteria": found.criteria(),
                    "recreate": sorted(recreate),
                    **asdict(count),
                }
            )
            return
        echo(f"Dry run: {count.replayable} deliveries would be queued again.")
        if recreate:
            echo(
                f"Among them, {len(recreate)} named with --recreate: their task, deleted before "
                "its creation settled, is created again."
            )
        if count.bodies_dropped:
            echo(
                f"{count.bodies_dropped} more match, but their bodies were dropped by the "
                "retention policy: they cannot be replayed."
            )
        if count.task_deleted:
            echo(
                f"{count.task_deleted} parked because their task was deleted before its creation "
                "settled: left out; name them to replay (--recreate ID each; replaying creates "
                "the task again): " + _listed(count.task_deleted_ids, count.task_deleted)
            )
        if count.replayable:
            again = "".join(f" --recreate {pk}" for pk in sorted(recreate))
            echo(
                f"To run it: the same options{again}, without --dry-run, with --name NAME "
                f"--expect {count.replayable}."
            )
        return

    retry = idempotency.Retry.of(idempotency.cli_actor(operator), idempotency_key)
    with runtime.session() as session:
        before = started_under_key(
            session=session, retry=retry, filter=found, name=name, expected=expect, named=recreate
        )
    if before is not None:
        if as_json:
            emit_json({"dry_run": False, "replayed": True, "operation": asdict(before)})
            return
        echo(
            f"Started already under this key: operation {before.id} ({before.name}), "
            f"{before.done} of {before.matched} queued again"
            + (", finished." if before.finished else ", not finished.")
            + " Nothing was sent. History: taskhook operations list"
        )
        return
    unsent: list[int] = []
    lane = lane_of(Sender.BULK_REPLAY)
    per_message = keys_per_message(runtime.settings, lane)

    def send(keys: list[int]) -> None:
        # Called after each batch's commit. A key the broker does not take is
        # still queued: the sweeper sends it.
        for group in message_groups(keys, per_message):
            task, args = task_for(group)
            try:
                cli_runtime.load_celery_app().send_task(task, args=args, queue=lane)
            except Exception as error:
                if not unsent:
                    echo(f"The broker did not take a message ({first_line(error)}).", err=True)
                unsent.extend(group)

    done = bulk_replay(
        sessions=runtime.sessions,
        filter=found,
        name=name,
        operator=operator,
        expected=expect,
        send=send,
        named=recreate,
        retry=retry,
    )
    # What it left out is still parked, and still matches: counted afresh.
    with runtime.session() as session:
        left = count_replayable(session=session, filter=found)
    if as_json:
        emit_json(
            {
                "dry_run": False,
                "replayed": False,
                "operation": asdict(done),
                "not_sent": len(unsent),
                "task_deleted": left.task_deleted,
                "task_deleted_ids": left.task_deleted_ids,
            }
        )
        return
    echo(
        f"Operation {done.id} ({done.name}): {done.done} deliveries queued again and sent "
        "to the worker."
    )
    if left.task_deleted:
        echo(
            f"Left out: {left.task_deleted} parked because their task was deleted before its "
            "creation settled; name one to replay it (--recreate ID): "
            + _listed(left.task_deleted_ids, left.task_deleted)
        )
    if unsent:
        settings = runtime.settings
        within = settings.queued_grace_seconds + settings.sweep_interval_seconds
        echo(
            f"{len(unsent)} of them are queued but not sent: the sweeper sends them within "
            f"about {within:g}s once the broker is back."
        )
    echo("History: taskhook operations list")


def _listed(ids: Sequence[int], total: int) -> str:
    """``41, 57`` -- and how many more, when the dry run listed fewer than there are."""
    more = f" and {total - len(ids)} more" if total > len(ids) else ""
    return ", ".join(map(str, ids)) + more + "."


def _body(detail: DeliveryDetail) -> str:
    if detail.body_dropped is not None:
        when = format_when(detail.summary.body_dropped_at)
        return f"{detail.body_dropped} (on {when} UTC); it had sha256 {detail.body_sha256}"
    return f"{detail.body_bytes} bytes, sha256 {detail.body_sha256}"


def format_bytes(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


@deliveries.command("prune")
@click.option("--dry-run", is_flag=True, help="Say what would go; change nothing.")
@json_option
@pass_runtime
def deliveries_prune(runtime: CommandRuntime, dry_run: bool, as_json: bool) -> None:
    """Apply the retention policy now: drop the bodies of old done and ignored
    deliveries, delete old finished rows (TASKHOOK_BODY_RETENTION_DAYS,
    TASKHOOK_INBOX_RETENTION_DAYS). Says what goes first, then does it, in
    small batches; needs_operator, dead, queued and processing rows are never
    touched. Safe to stop and run again."""
    policy = Policy.of(runtime.settings)
    now = utcnow()
    with runtime.session() as session:
        planned = plan(session=session, policy=policy, now=now)
        pruned = None if dry_run or not planned else prune(session=session, policy=policy, now=now)
    if as_json:
        emit_json(
            {
                "policy": {
                    "body_retention_days": policy.body_days,
                    "inbox_retention_days": policy.row_days,
                },
                "dry_run": dry_run,
                "plan": [asdict(line) for line in planned],
                "pruned": None if pruned is None else asdict(pruned),
            }
        )
        return
    echo(f"Retention: {policy.describe()}.")
    print_table(
        ("ACTION", "STATUS", "EVENT", "ROWS", "BODIES"),
        (
            (line.action, line.status, line.event, line.rows, format_bytes(line.body_bytes))
            for line in planned
        ),
        empty="Nothing to prune.",
    )
    if not planned:
        return
    rows = sum(line.rows for line in planned)
    if pruned is None:
        echo(f"Dry run: nothing changed ({rows} rows would be pruned).")
        return
    deleted, dropped = sum(pruned.deleted.values()), sum(pruned.dropped.values())
    echo(
        f"Deleted {deleted} rows and dropped {dropped} bodies ({format_bytes(pruned.body_bytes)}) "
        f"in {pruned.batches} batches of at most {policy.batch}, {pruned.seconds:g} s."
    )


# --- stats ----------------------------------------------------------------------------


@click.command("stats")
@json_option
@pass_runtime
def stats(runtime: CommandRuntime, as_json: bool) -> None:
    """Deliveries by status, the age of the oldest queued one, the backed-up
    workspaces (the 10 largest backlogs), how many were ignored as events
    their provider does not know, each source's last catch-up, the windows
    marked as handled by hand, and the windows no ingress was up that no
    catch-up has covered, each with the command that covers it."""
    with runtime.session() as session:
        now = utcnow()
        found = inbox_stats(session=session, now=now)
        backlogs = workspace_backlogs(session=session, top=LISTED_BACKLOGS, now=now)
        missed = gaps(session=session, heartbeat_seconds=runtime.settings.ingress_heartbeat_seconds)
        disk = inbox_disk_use(session=session)
        credentials = dict(credential_counts(session))
    if as_json:
        emit_json(
            asdict(found)
            | asdict(missed)
            | {"disk": asdict(disk), "backlogs": asdict(backlogs), "credentials": credentials}
        )
        return
    print_table(("STATUS", "DELIVERIES"), found.counts.items(), empty="No deliveries.")
    echo()
    # Counted within "ignored" above: stored and answered like any ignored event.
    echo(
        f"Unknown events: {found.unknown_events} ignored (an event their provider does not "
        "know; their reason starts with “unknown event”)."
    )
    if found.oldest_queued_at is None:
        echo("Oldest queued: none (nothing waiting).")
    else:
        echo(
            f"Oldest queued: received {format_age(found.oldest_queued_age_seconds or 0)} ago "
            f"({format_when(found.oldest_queued_at)} UTC)."
        )
    _print_backlogs(backlogs)
    _print_credentials(credentials)
    _print_disk(disk, Policy.of(runtime.settings))
    _print_gaps(missed)


def _print_credentials(credentials: dict[str, int]) -> None:
    """Stored credentials by the key that seals them (``taskhook secrets status``)."""
    sealed = ", ".join(
        f"{count} by key {key_id}"
        for key_id, count in sorted(credentials.items())
        if key_id != PLAIN
    )
    plain = credentials.get(PLAIN, 0)
    echo()
    echo(
        f"Credentials sealed: {sealed or 'none'}; plain text: {plain}"
        + (" (`taskhook secrets rotate` seals them)." if plain else ".")
    )


def _print_backlogs(backlogs: Backlogs) -> None:
    """The backed-up workspaces: each one's deliveries queued or processing,
    and how long its oldest queued one has waited, largest backlog first."""
    echo()
    if backlogs.largest:
        echo("Backed-up workspaces (BACKLOG: deliveries queued or processing):")
    print_table(
        ("WORKSPACE", "BACKLOG", "OLDEST QUEUED"),
        (
            (
                workspace.slug,
                workspace.backlog,
                "none queued"
                if workspace.oldest_queued_age_seconds is None
                else format_age(workspace.oldest_queued_age_seconds),
            )
            for workspace in backlogs.largest
        ),
        empty="No workspace is backed up.",
    )
    if backlogs.rest_workspaces:
        waiting = backlogs.rest_oldest_queued_age_seconds
        echo(
            f"And {backlogs.rest_workspaces} more workspace"
            + ("s" if backlogs.rest_workspaces != 1 else "")
            + f": {backlogs.rest_backlog} deliveries"
            + ("" if waiting is None else f", the oldest queued waiting {format_age(waiting)}")
            + "."
        )
    echo()


def _print_disk(disk: InboxDiskUse, policy: Policy) -> None:
    free = f", {format_bytes(disk.free_bytes)} of it free for reuse" if disk.free_bytes else ""
    echo(
        f"Disk: {format_bytes(disk.body_bytes or 0)} of bodies in {disk.rows} rows "
        f"({disk.bodies_dropped} bodies dropped); {format_bytes(disk.storage_bytes)} in "
        f"{disk.storage}{free}."
    )
    echo(f"Retention: {policy.describe()} (taskhook deliveries prune).")


def _print_gaps(missed: Gaps) -> None:
    for run in missed.last_catch_ups:
        if run.error is not None:
            outcome = f"stopped: {run.error}"
        elif run.covered_until is None:
            outcome = f"a dry run, still running or a partial scan; {run.missed} missed"
        else:
            outcome = f"{run.missed} missed, {run.recovered} recovered"
        echo(
            f"Last catch-up of {run.source} ({_RUN_KINDS.get(run.kind, run.kind)}): "
            f"{format_when(run.started_at)} UTC, {outcome}."
        )
        if run.recovered_items:
            more = run.recovered - len(run.recovered_items)
            echo(
                "  Recovered: "
                + ", ".join(run.recovered_items)
                + (f" and {more} more" if more > 0 else "")
            )
    for mark in missed.handled_by_hand:
        echo(
            f"Handled by hand: {mark.source} from {format_when(mark.since)} to "
            f"{format_when(mark.until)} UTC, marked by {mark.operator} on "
            f"{format_when(mark.marked_at)} UTC: {mark.reason}"
        )
    for source, windows in missed.uncovered.items():
        for window in windows:
            what = (
                "an ingress answered deliveries 503 (its database unavailable)"
                if window.refused
                else "no ingress was up"
            )
            echo(
                f"Not caught up: {source} -- {what} from {format_when(window.start)} "
                f"to {format_when(window.end)} UTC ({format_age(window.seconds)}); "
                f"{missed.command(source, window)}"
            )
            echo(f"  Handled it by hand? {missed.mark_command(source, window)}")


_RUN_KINDS = {
    "log": "delivery log",
    "scan": "scan",
    "search": "Jira search",
    "gitlab": "GitLab hook events and scan",
}
