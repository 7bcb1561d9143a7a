"""What replaying one delivery will do, said before it is done.

A replay sends a finished delivery through the worker again; what the worker
then does depends on what became of the task the delivery was about. Most
replays find that task or finish their own create, and make nothing new; two
kinds undo someone's decision, and a person says yes to those first:

- the delivery's own create inserted a task that was deleted before the
  create settled (the worker parked it: docs/contract.md, "14. Fencing the
  create"), or the task for its identity was deleted: the replay creates a
  new task for an item someone removed;
- the delivery is a ``replay`` or a ``mismatch``: a body someone resent.

:func:`plan_replay` reads it all without writing; the CLI shows the plan and
asks, the console shows it beside its button. Bulk replays leave the first
kind out unless named (``models.operations.selected_for_replay``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from models.display import format_when
from models.errors import DeliveryNotFound, InvalidExternalId, NotReplayable
from models.inbox import DeliveryStatus, replay_refusal
from models.reports import Lineage, lineage, show_delivery
from models.tables import Delivery, Task

#: What a resent body is, by the status the ingress stored it in.
_RESENT = {
    DeliveryStatus.REPLAY.value: "the very body of an earlier delivery, resent under another id",
    DeliveryStatus.MISMATCH.value: "another body sent under a stored delivery's id",
}


@dataclass(frozen=True)
class ReplayPlan:
    """One delivery, as it stands, and what replaying it will do."""

    delivery: int
    provider: str
    delivery_id: str
    event: str
    workspace: str
    status: str
    reason: str | None
    external_id: str | None
    #: What the replay will do, in one sentence.
    will: str
    #: Why a person must say yes first (the replay creates again a task
    #: someone deleted, or runs a resent body); None when nothing does.
    warning: str | None = None

    @property
    def needs_consent(self) -> bool:
        return self.warning is not None


def plan_replay(*, session: Session, delivery_pk: int) -> ReplayPlan:
    """What replaying ``delivery_pk`` will do. Raises :class:`DeliveryNotFound`,
    and :class:`NotReplayable` (as the replay itself would) when its status
    cannot be replayed or its body was dropped. Reads only."""
    delivery = session.get(Delivery, delivery_pk)
    if delivery is None:
        raise DeliveryNotFound(delivery_pk)
    if (refusal := replay_refusal(delivery)) is not None:
        raise NotReplayable(refusal)
    detail = show_delivery(session=session, delivery_pk=delivery_pk)
    summary = detail.summary
    found = _lineage(session, detail.workspace, summary.external_id)
    will, warnings = _what_it_does(session, delivery, found)
    if summary.status in _RESENT:
        warnings.append(
            f"it is {_RESENT[summary.status]} (status {summary.status}): replay it only if you "
            "know its sender is genuine"
        )
    return ReplayPlan(
        delivery=summary.id,
        provider=summary.provider,
        delivery_id=summary.delivery_id,
        event=summary.event,
        workspace=detail.workspace,
        status=summary.status,
        reason=summary.status_reason,
        external_id=summary.external_id,
        will=will,
        warning="; ".join(warnings) or None,
    )


def _lineage(session: Session, workspace: str, external_id: str | None) -> Lineage | None:
    if external_id is None:
        return None
    try:
        return lineage(session=session, workspace_slug=workspace, external_id=external_id)
    except InvalidExternalId:  # the worker says why when it reads the body
        return None


def _what_it_does(
    session: Session, delivery: Delivery, found: Lineage | None
) -> tuple[str, list[str]]:
    """The sentence of :attr:`ReplayPlan.will`, and the warnings that go with it."""
    named = f" for {found.external_id!r}" if found is not None else ""
    if delivery.created_task_id is not None:
        task = session.get(Task, delivery.created_task_id)
        if task is None and found is not None and found.holder is not None:
            # The replay clears the mark, and its lookup finds the new holder.
            return (
                f"its task (id {delivery.created_task_id}) was deleted before its creation "
                f"settled, and {found.external_id!r} is held by {found.holder.identifier} "
                "now: replaying finds it, no new task",
                [],
            )
        if task is None:
            deleted = _deleted_on(found, delivery.created_task_id)
            return (
                f"its task (id {delivery.created_task_id}) was deleted{deleted} before its "
                f"creation settled: replaying creates a new task{named}",
                ["someone deleted that task: replay only if the task should exist"],
            )
        if found is not None and task.external_id != found.external_id:
            return (
                f"it finishes its own create of {task.identifier}, whose identity was released "
                "meanwhile: no new task (the outcome is created_identity_lost)",
                [],
            )
        if task.external_id_settled_at is not None:
            return f"its own create made {task.identifier}: replaying finds it, no new task", []
        return f"it finishes its own create of {task.identifier} and settles it: no new task", []
    if found is None:
        return (
            "the worker reads its body afresh: it creates the task the body describes, or finds "
            "the one holding its identity",
            [],
        )
    holder = found.holder
    if holder is not None and holder.settled:
        return (
            f"{found.external_id!r} is held by {holder.identifier}: replaying finds it, "
            "no new task",
            [],
        )
    if holder is not None:
        return (
            f"{found.external_id!r} is held by {holder.identifier}, whose create has not "
            "settled: replaying waits for it, and parks again if it never does",
            [],
        )
    deleted = found.deleted_holders[-1] if found.deleted_holders else None
    released = found.releases[-1] if found.releases else None
    if deleted is not None and (released is None or released.released_at <= deleted.deleted_at):
        return (
            f"no task holds {found.external_id!r}: its task (id {deleted.id}) was deleted on "
            f"{format_when(deleted.deleted_at)} UTC; replaying creates a new task",
            ["someone deleted the task for this item: replay only if it should exist again"],
        )
    if released is not None:
        return (
            f"no task holds {found.external_id!r} since its release from task {released.task_id} "
            f"on {format_when(released.released_at)} UTC: replaying creates a new task",
            [],
        )
    return f"no task holds {found.external_id!r}: replaying creates one", []


def _deleted_on(found: Lineage | None, task_id: int) -> str:
    """`` on <when> UTC``, as the task's ``task.deleted`` event says; empty if none does."""
    gone = (
        next((task for task in found.deleted_holders if task.id == task_id), None)
        if found
        else None
    )
    return "" if gone is None else f" on {format_when(gone.deleted_at)} UTC"
