"""Tasks and identities: ``taskhook task lookup``, ``task archive``, ``task
deletions``, ``explain`` and ``release``."""

from __future__ import annotations

import functools
import re
import shlex
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from typing import Any

import click
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import idempotency, retry_safe
from models.access import Caller
from models.broker.messages import IDEMPOTENCY_KEY_HEADER, OPERATOR_QUEUE, RELEASE_IDENTITY
from models.inbox import DeliveryStatus
from models.reports import (
    Lineage,
    TaskView,
    get_workspace,
    lineage,
    list_deletions,
    task_named,
    timeline,
)
from models.retry_safe import release_answer
from models.tables import MAX_ROW_ID, Task, WorkflowStep, utcnow
from models.tasks import MAX_RELEASE_REASON_LENGTH, clean_release_text

# The module itself, for the load_celery_app hook: looked up at call time, so
# that replacing ``worker.cli.runtime.load_celery_app`` (as the tests do) takes effect here.
from worker.cli import runtime as cli_runtime
from worker.cli.deliveries import delivery_reason, print_deliveries
from worker.cli.identities import describe_names
from worker.cli.output import echo, emit_json, format_when, json_option, print_fields, print_table
from worker.cli.params import checked_by, idempotency_key_option, operator_or_os_user
from worker.cli.prompts import confirmed
from worker.cli.runtime import CommandRuntime, NoAnswer, Refused, first_line, pass_runtime, redacted

DEFAULT_RELEASE_TIMEOUT_SECONDS = 30.0
#: The CLI is the operator's own: it sees every workspace.
OPERATOR = Caller.trusted("taskhook task")
#: The states a replay takes a delivery out of, once its cause is fixed.
_FIXABLE = (DeliveryStatus.NEEDS_OPERATOR, DeliveryStatus.DEAD)


def _task_json(view: TaskView | None) -> dict[str, Any] | None:
    if view is None:
        return None
    return asdict(view) | {"settled": view.settled, "archived": view.archived, "state": view.state}


def _settlement(view: TaskView) -> str:
    if view.settled:
        return f"settled at {format_when(view.settled_at)} (creation complete)"
    return "NOT SETTLED: its create had not finished when looked at (it may still be running)"


def creator_advice(found: Lineage, holder: TaskView, now: datetime) -> tuple[bool, str]:
    """(may the create still finish on its own?, what the creator is doing and what to do).

    Only the delivery that inserted an unsettled task may finish its create,
    and replaying it does exactly that, so the advice points there first.
    """
    creator = found.creator_of(holder)
    if creator is None:
        if holder.created_by_delivery:
            return False, (
                f"its creating delivery {holder.created_by_delivery} is gone from the inbox: "
                "nothing will finish this create"
            )
        return False, (
            "it was created outside the webhooks (REST API): only its caller could have finished it"
        )
    pk, status, lease = creator.id, creator.status, creator.lease_expires_at
    if status == DeliveryStatus.PROCESSING and lease is not None and lease > now:
        return True, (
            f"delivery {pk} is being processed now (attempt {creator.attempts}, lease until "
            f"{format_when(lease)} UTC): wait for it"
        )
    if status == DeliveryStatus.PROCESSING:
        return True, (
            f"delivery {pk}'s worker stopped (its lease ran out at {format_when(lease)} UTC); the "
            "sweeper sends it again and it finishes its own create: wait a sweep or two"
        )
    if status == DeliveryStatus.QUEUED:
        return True, f"delivery {pk} is queued: when it runs it finishes its own create. Wait."
    if status in (DeliveryStatus.DEAD, DeliveryStatus.NEEDS_OPERATOR):
        return False, (
            f"delivery {pk} is {status}: read `taskhook deliveries show {pk}`, fix the cause, "
            f"then `taskhook deliveries replay {pk}` finishes its own create"
        )
    return False, (
        f"delivery {pk} is {status} but its create never settled: read "
        f"`taskhook deliveries show {pk}` before anything else"
    )


def _task_fields(found: Lineage, view: TaskView) -> list[tuple[str, Any]]:
    fields: list[tuple[str, Any]] = [
        ("task", f"{view.identifier}  {view.title}"),
        ("external id", view.external_id),
        ("names", describe_names(view.names)),
        ("state", _settlement(view)),
    ]
    if not view.settled:
        fields.append(("creator", creator_advice(found, view, utcnow())[1]))
    return [
        *fields,
        ("archived", format_when(view.archived_at) if view.archived else "no"),
        ("created", view.created_at),
        ("created by", f"delivery {view.created_by_delivery}" if view.created_by_delivery else "-"),
        ("source", view.source_url),
    ]


def _lineage(runtime: CommandRuntime, workspace_slug: str, external_id: str) -> Lineage:
    with runtime.session() as session:
        return lineage(session=session, workspace_slug=workspace_slug, external_id=external_id)


#: The shape of a task identifier (``ACME-12``: a workspace's prefix, a dash, a number).
_TASK_IDENTIFIER = re.compile(r"[A-Z][A-Z0-9]*-[0-9]+")
_EXAMPLES = "e.g. 'jira:PROJ-12' or 'gh-issue/OWNER/REPO#12'"


def _lineage_by_either(
    runtime: CommandRuntime, workspace_slug: str, given: str, *, found_it: Callable[[Lineage], bool]
) -> Lineage:
    """The lineage of ``given`` as an external id; when that finds nothing and
    ``given`` is a task's identifier (``ACME-12``), the lineage of the external
    id that task holds. An external id always wins over an identifier."""
    found = _lineage(runtime, workspace_slug, given)
    if found_it(found) or not _TASK_IDENTIFIER.fullmatch(given):
        return found
    with runtime.session() as session:
        named = task_named(session=session, workspace_slug=workspace_slug, identifier=given)
    if named is None:
        raise Refused(
            f"no task in workspace {found.workspace} holds external id {given!r}, and no task "
            f"there is named {given}: pass an external id, {_EXAMPLES}, or a task identifier"
        )
    if named.external_id is None:
        raise Refused(
            f"task {given} holds no external id (it was released, merged into another task, "
            f"or created without one): "
            f"pass the external id itself, {_EXAMPLES}"
        )
    return _lineage(runtime, workspace_slug, named.external_id)


def _nobody_holds(found: Lineage) -> Refused:
    explain_it = f"taskhook explain --workspace {found.workspace} {found.external_id!r}"
    if found.releases:
        released = f" (released {len(found.releases)} time(s): {explain_it})"
    elif found.without_task:
        unmade = len(found.without_task)
        released = f" ({unmade} delivery(ies) named it and made none: {explain_it})"
    else:
        released = ""
    return Refused(
        f"no task in workspace {found.workspace} holds external id {found.external_id!r}{released}"
    )


workspace_option = click.option(
    "--workspace", "workspace_slug", required=True, help="Workspace slug."
)


@click.group()
def task() -> None:
    """Tasks: look one up by the external id that made it, or archive one."""


@task.command("lookup")
@workspace_option
@click.argument("external_id")
@json_option
@pass_runtime
def task_lookup(
    runtime: CommandRuntime, workspace_slug: str, external_id: str, as_json: bool
) -> None:
    """The task holding EXTERNAL_ID (settled or not) and the deliveries that touched it.

    A task EXTERNAL_ID is an alias of (a move's, a merge's) answers too, with
    all its names. EXTERNAL_ID may also be a task identifier (ACME-12) when no task holds it as
    an external id. Put `--` before an EXTERNAL_ID that starts with a dash.
    """
    found = _lineage_by_either(
        runtime, workspace_slug, external_id, found_it=lambda found: found.holder is not None
    )
    if found.holder is None:
        raise _nobody_holds(found)
    touched = found.deliveries_of(found.holder.id)
    if as_json:
        emit_json(
            {
                "workspace": found.workspace,
                "external_id": found.external_id,
                "task": _task_json(found.holder),
                "deliveries": [asdict(d) for d in touched],
            }
        )
        return
    print_fields(_task_fields(found, found.holder))
    echo()
    print_deliveries(touched, empty="No delivery touched it (it was created through the API).")


def _task_of(session: Session, given: str, workspace_slug: str | None) -> Task:
    """The task ``given`` names: its identifier (``ACME-12``; within
    ``workspace_slug`` when given, else the one task anywhere so named) or its
    id. Refuses, in one line, what names no task or more than one."""
    if given.isascii() and given.isdigit():
        task = session.get(Task, int(given)) if int(given) <= MAX_ROW_ID else None
        if task is None:
            raise Refused(f"no task has id {given}")
        if (
            workspace_slug is not None
            and task.workspace_id != get_workspace(session=session, slug=workspace_slug).id
        ):
            raise Refused(f"task {given} is not in workspace {workspace_slug}")
        return task
    if not _TASK_IDENTIFIER.fullmatch(given):
        raise Refused(f"{given!r} is neither a task identifier (ACME-12) nor a task id (42)")
    query = select(Task).where(Task.identifier == given)
    where = ""
    if workspace_slug is not None:
        query = query.where(
            Task.workspace_id == get_workspace(session=session, slug=workspace_slug).id
        )
        where = f" in workspace {workspace_slug}"
    found = list(session.scalars(query))
    if not found:
        raise Refused(f"no task is named {given}{where}")
    if len(found) > 1:
        raise Refused(f"{len(found)} tasks are named {given}: pass --workspace SLUG")
    return found[0]


@task.command("archive")
@click.argument("given", metavar="TASK")
@click.option(
    "--workspace",
    "workspace_slug",
    default=None,
    help="Workspace slug: where to look TASK's identifier up [every workspace].",
)
@idempotency_key_option("A key to retry this archive under: run again with it, it archives once.")
@json_option
@pass_runtime
def task_archive(
    runtime: CommandRuntime,
    given: str,
    workspace_slug: str | None,
    as_json: bool,
    idempotency_key: str | None,
) -> None:
    """Archive TASK, by its identifier (ACME-12) or its id.

    An archived task keeps its external id (a redelivery still finds it) and
    no longer counts against its step's WIP limit: what makes room in a full
    intake step. Archiving an archived task changes nothing.
    """
    with runtime.session() as session:
        found = _task_of(session, given, workspace_slug)
        was_archived = found.archived_at is not None
        archived, _receipt = retry_safe.archive(
            session=session,
            caller=OPERATOR,
            task_id=found.id,
            retry=idempotency.Retry.of(idempotency.cli_actor(OPERATOR.name), idempotency_key),
        )
        step = session.get(WorkflowStep, archived.step_id)
        done = {
            "id": archived.id,
            "identifier": archived.identifier,
            "external_id": archived.external_id,
            "archived_at": archived.archived_at,
            "archived_now": not was_archived,
            "step": step.name if step is not None else None,
        }
    if as_json:
        emit_json(done)
        return
    if was_archived:
        echo(
            f"{done['identifier']} was archived already ({format_when(done['archived_at'])} UTC); "
            "nothing changed."
        )
        return
    keeps = (
        f"it keeps its external id {done['external_id']!r}: a redelivery still finds it"
        if done["external_id"]
        else "it holds no external id"
    )
    echo(
        f"Archived {done['identifier']}; {keeps}. It no longer counts against the WIP limit "
        f"of step {done['step']!r}."
    )


@task.command("deletions")
@click.option("--workspace", "workspace_slug", default=None, help="Workspace slug [every one].")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@json_option
@pass_runtime
def task_deletions(
    runtime: CommandRuntime, workspace_slug: str | None, limit: int, as_json: bool
) -> None:
    """The audit of deleted tasks, newest first: who deleted which task, when,
    and the external id the delete freed (as `explain` shows a release).

    Deletes come through the REST API (DELETE /api/v1/tasks/ID); `taskhook
    workspace deletes SLUG --operators-only` reserves them to operator tokens."""
    with runtime.session() as session:
        found = list_deletions(session=session, workspace_slug=workspace_slug, limit=limit)
    if as_json:
        emit_json({"deletions": [asdict(row) for row in found]})
        return
    print_table(
        ("DELETED (UTC)", "WORKSPACE", "TASK", "EXTERNAL ID", "BY", "ROLE"),
        (
            (
                row.deleted_at,
                row.workspace,
                f"{row.identifier} ({row.task_id})",
                row.external_id or "-",
                row.operator,
                row.role,
            )
            for row in found
        ),
        empty="No task deleted since deletes were audited.",
    )


@click.command("explain")
@workspace_option
@click.argument("external_id")
@json_option
@pass_runtime
def explain(runtime: CommandRuntime, workspace_slug: str, external_id: str, as_json: bool) -> None:
    """The lineage of EXTERNAL_ID, delivery → outcome → task, in time order.

    EXTERNAL_ID may also be a task identifier (ACME-12) when nothing holds or
    held it as an external id.
    """
    found = _lineage_by_either(
        runtime, workspace_slug, external_id, found_it=lambda found: found.known
    )
    if not found.known:
        raise Refused(
            f"nothing in workspace {found.workspace} holds or held external id "
            f"{found.external_id!r}, and no delivery named it"
        )
    events = timeline(found)
    if as_json:
        emit_json(
            {
                "workspace": found.workspace,
                "external_id": found.external_id,
                "holder": _task_json(found.holder),
                "former_holders": [_task_json(view) for view in found.former_holders],
                "deleted_holders": [asdict(gone) for gone in found.deleted_holders],
                "releases": [asdict(release) for release in found.releases],
                "deliveries": [asdict(d) for d in found.deliveries],
                "without_task": [d.id for d in found.without_task],
                "events": [asdict(event) for event in events],
            }
        )
        return
    echo(f"External id {found.external_id!r} in workspace {found.workspace}:")
    echo()
    print_table(
        ("TIME", "EVENT", "DETAIL"),
        ((event.at, event.what, event.detail) for event in events),
        empty="(no events)",
    )
    echo()
    unmade = found.without_task
    if unmade:
        echo("Deliveries that named it and made no task:")
        print_table(
            ("ID", "DELIVERY ID", "RECEIVED", "STATUS", "REASON"),
            ((d.id, d.delivery_id, d.received_at, d.status, delivery_reason(d)) for d in unmade),
            empty="",
        )
        echo()
    for gone in found.deleted_holders:
        touched = ", ".join(str(d.id) for d in found.deliveries_of(gone.id)) or "none"
        echo(
            f"Deleted: task {gone.id} held it until {format_when(gone.deleted_at)}, "
            f"deleted by {gone.by} (deliveries that touched it: {touched})."
        )
    holder = found.holder
    if holder is not None and holder.external_id != found.external_id:
        echo(
            f"Now: an alias of {holder.identifier} (task {holder.id}), which answers to "
            f"{describe_names(holder.names)}; a create under it is Found on that task."
        )
    elif holder is None:
        echo("Now: no task holds it; the next delivery for the item creates a new task.")
        parked = [d.id for d in unmade if d.status in _FIXABLE]
        if parked:
            echo(
                f"Parked: {', '.join(map(str, parked))}. Read `taskhook deliveries show ID` "
                "for why, fix the cause, then `taskhook deliveries replay ID` creates the task."
            )
    elif holder.settled:
        echo(f"Now: held by {holder.identifier}, settled. Nothing to do.")
    else:
        echo(f"Now: held by {holder.identifier}, {_settlement(holder)}.")
        echo(f"Its creator: {creator_advice(found, holder, utcnow())[1]}.")
        echo(
            "Other deliveries for it wait, then park as needs_operator. Read "
            "docs/runbook.md (needs_operator) before any `taskhook release`."
        )


def _release_preview(found: Lineage, holder: TaskView) -> list[tuple[str, Any]]:
    touched = found.deliveries_of(holder.id)
    parked = [d.id for d in touched if d.status == DeliveryStatus.NEEDS_OPERATOR]
    waiting = f"; needs_operator: {', '.join(map(str, parked))}" if parked else ""
    return [
        *_task_fields(found, holder),
        ("deliveries", f"{len(touched)} touched it{waiting}"),
    ]


def _release_warning(found: Lineage, holder: TaskView) -> str:
    if holder.settled:
        return (
            "Its create FINISHED. After a release the task stays, without this identity, and "
            "the next delivery for the item creates a SECOND task."
        )
    may_finish, _ = creator_advice(found, holder, utcnow())
    if may_finish:
        return (
            "WARNING: its create may still finish on its own (see creator above). Releasing "
            "now leaves it without its identity and the next delivery makes a SECOND task."
        )
    return (
        "After a release the task stays, without this identity, and the next delivery for "
        "the item creates a NEW task."
    )


#: The audit row's own rules for its text, applied as the options are read, so
#: that a reason the audit cannot keep is refused before anything is shown.
_reason = functools.partial(
    clean_release_text,
    what="the reason",
    missing="a release must give a reason",
    limit=MAX_RELEASE_REASON_LENGTH,
)


@click.command("release")
@workspace_option
@click.argument("external_id")
@click.option(
    "--reason", required=True, callback=checked_by(_reason), help="Why; kept in the audit row."
)
@click.option(
    "--operator",
    default=None,
    callback=operator_or_os_user,
    help="Who releases [the OS user].",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@idempotency_key_option(
    "The key of an earlier run to finish: its release is answered, not made again "
    "[a new key per run, printed when no answer comes]."
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_RELEASE_TIMEOUT_SECONDS,
    show_default=True,
    help="Seconds the whole release may take, from sending the request to the answer.",
)
@json_option
@pass_runtime
def release(
    runtime: CommandRuntime,
    workspace_slug: str,
    external_id: str,
    reason: str,
    operator: str,
    yes: bool,
    timeout: float,
    as_json: bool,
    idempotency_key: str | None,
) -> None:
    """Free EXTERNAL_ID from its task, through the operator worker, audited.

    The one unsafe command: afterwards the next delivery for the item creates
    a new task. Read docs/runbook.md first. Only the task shown is released: if
    another task holds EXTERNAL_ID by the time the request runs, nothing is.
    Each run sends a key of its own; a run that got no answer prints it, and
    running again with --idempotency-key KEY answers what that run did.
    """
    found = _lineage(runtime, workspace_slug, external_id)
    if idempotency_key is not None and _answered_before(
        runtime, found, operator, reason, idempotency_key, as_json
    ):
        return
    key = idempotency_key or uuid.uuid4().hex
    holder = found.holder
    if holder is None:
        raise _nobody_holds(found)
    if holder.external_id is None:
        raise Refused(
            f"{found.external_id!r} is an alias of {holder.identifier}, which holds no "
            "external id: there is no identity to release"
        )
    if holder.external_id != found.external_id:
        raise Refused(
            f"{found.external_id!r} is an alias of {holder.identifier}, which holds "
            f"{holder.external_id!r}: release that (its aliases are freed with it)"
        )
    # With --json the preview and the question go to stderr; stdout stays one document.
    echo(
        f"Release external id {found.external_id!r} in workspace {found.workspace} from:",
        err=as_json,
    )
    print_fields(_release_preview(found, holder), err=as_json)
    echo(_release_warning(found, holder), err=as_json)
    if not yes:
        confirmed("Release it?", err=as_json, action="release")

    # The holder shown travels with the request: the operator worker releases
    # it only if it still holds the identity (docs/contract.md, "Release").
    args = [found.workspace_id, found.external_id, operator, reason, holder.id]
    deadline = time.monotonic() + timeout
    pending = _send_release(runtime, args, within=timeout, key=key)
    answered, reply = _await_answer(pending, max(deadline - time.monotonic(), 0.001))
    if not answered:
        raise NoAnswer(
            f"the operator worker did not answer within {timeout:g}s: is taskhook's operator "
            f"worker running (celery -A worker worker -Q {OPERATOR_QUEUE})? The request stays "
            "queued and may still run when one starts: run the same command again with "
            f"--idempotency-key {key}, which answers what it did and never releases twice."
        )
    if not isinstance(reply, dict):
        raise Refused(f"the operator worker answered something unexpected: {reply!r}")
    if reply.get("holder_changed"):
        raise Refused(
            f"not released: {reply.get('error')}. Look again before anything else: "
            f"taskhook task lookup --workspace {found.workspace} {shlex.quote(found.external_id)}"
        )
    if not reply.get("released"):
        raise Refused(f"not released: {reply.get('error') or 'no reason given'}")
    parked = [
        d.id for d in found.deliveries_of(holder.id) if d.status == DeliveryStatus.NEEDS_OPERATOR
    ]
    if as_json:
        emit_json(reply | {"workspace": found.workspace, "needs_operator_deliveries": parked})
        return
    echo(
        f"Released {reply.get('external_id', found.external_id)!r} from "
        f"{reply.get('identifier', holder.identifier)} (task {reply.get('task_id', holder.id)}); "
        f"audit row {reply.get('audit_id')}, operator {operator}."
    )
    for pk in parked:
        echo(f"Parked delivery {pk} can go through again: taskhook deliveries replay {pk}")


def _answered_before(
    runtime: CommandRuntime, found: Lineage, operator: str, reason: str, key: str, as_json: bool
) -> bool:
    """When ``key`` already released this identity (an earlier run whose
    answer was lost), say what that release did and return True. Refused when
    the key was another request's: another operator, identity or reason."""
    retry = idempotency.Retry.of(idempotency.cli_actor(operator), key)
    with runtime.session() as session:
        receipt = retry_safe.released_under_key(
            session, retry, found.workspace_id, found.external_id, reason
        )
        if receipt is None:
            return False
        reply = release_answer(session, receipt)
    if as_json:
        emit_json(reply | {"workspace": found.workspace})
        return True
    echo(
        f"Released already under this key: {reply.get('external_id', found.external_id)!r} "
        f"from {reply.get('identifier')} (task {reply.get('task_id')}); audit row "
        f"{reply.get('audit_id')}, operator {reply.get('operator', operator)}. Nothing was sent."
    )
    return True


def _send_release(runtime: CommandRuntime, args: list[Any], *, within: float, key: str) -> Any:
    """Send RELEASE_IDENTITY; the pending result, or a refusal when the broker
    is down or does not take the message within ``within`` seconds.

    The send runs on a thread the command stops waiting for: kombu's and the
    result backend's own retries add up to far more than any timeout an
    operator passes (about 20 s on Redis), whatever the broker. A send still
    trying when the command exits has published nothing, and dies with it.
    """
    app = cli_runtime.load_celery_app()
    sent: dict[str, Any] = {}

    def send() -> None:
        try:
            # The key in a header: a 0.1.0 worker passes over it (docs/deploy.md).
            sent["pending"] = app.send_task(
                RELEASE_IDENTITY,
                args=args,
                queue=OPERATOR_QUEUE,
                headers={IDEMPOTENCY_KEY_HEADER: key},
            )
        except Exception as error:  # kombu's connection errors have no common base worth naming
            sent["error"] = error

    sender = threading.Thread(target=send, name="send-release", daemon=True)
    sender.start()
    sender.join(within)
    if "pending" in sent:
        return sent["pending"]
    why = first_line(sent["error"]) if "error" in sent else f"no answer within {within:g}s"
    raise Refused(
        f"cannot reach the broker at {redacted(runtime.settings.broker_url)}: {why}; "
        "nothing was released"
    )


def _await_answer(pending: Any, timeout: float) -> tuple[bool, Any]:
    """(True, the operator task's answer) or (False, None) when none came in time."""
    from celery.exceptions import TimeoutError as CeleryTimeout

    try:
        return True, pending.get(timeout=timeout)
    except CeleryTimeout:
        # Stop waiting now, while the result backend's connection is open: left
        # pending, Celery unsubscribes in AsyncResult.__del__ at interpreter
        # exit and prints a traceback when the connection is already gone.
        backend = getattr(pending, "backend", None)
        if backend is not None:
            backend.remove_pending_result(pending)
            pending.backend = None
        return False, None
    except Exception as error:  # the task itself raised: report it, no traceback
        return True, {"released": False, "error": f"{type(error).__name__}: {first_line(error)}"}
