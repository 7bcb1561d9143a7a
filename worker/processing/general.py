"""The general path: any delivery, from a committed lease, through
``models.tasks.create_task``, step by step.

It reads the stored body afresh with its source's provider, checks
everything the create will write, creates (its insert fenced by the lease:
docs/contract.md, "Fencing the create"), and records how the create ended.
It also finishes a create an earlier attempt of the same delivery began, and
one the fast path's settlement could not (docs/architecture.md, "A
delivery's run").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from models import logs
from models.access import Caller
from models.db import transaction
from models.errors import InvalidExternalId, InvalidTask, LeaseTakenOver, TaskNotFound
from models.external_id import normalize_external_id
from models.identities import Entrance, learn_move
from models.inbox import DeliveryStatus, Lease, body_dropped_note, fence_create
from models.providers import PROVIDERS
from models.providers.drafts import TaskDraft, UnsupportedContentType, UnsupportedPayload
from models.tables import Delivery, Task, WebhookSource
from models.tasks import (
    CreateOutcome,
    NewTask,
    SourceLink,
    complete_creation,
    create_task,
    validated_new_task,
)
from worker.processing.attempt import CREATE_REFUSALS, Attempt, Processed

log = logging.getLogger("worker.processing")


@dataclass(frozen=True)
class ClaimedDelivery:
    """A claimed delivery and its source, as plain values: the task store rolls
    its session back on some paths, which would expire ORM instances."""

    delivery_pk: int
    event: str
    body: bytes
    content_type: str | None
    source_slug: str
    provider: str
    workspace_id: int
    create_events: frozenset[str]
    site_url: str | None
    #: The task an earlier attempt of this delivery inserted, if one did.
    created_task_id: int | None
    #: How it came in, as the identity ledger weighs it.
    entrance: Entrance
    #: What stands in for a body the retention policy dropped (only a done or
    #: ignored row loses it, and nothing claims those: a row put back in the
    #: queue by hand); None while the body is kept.
    body_dropped: str | None = None


@dataclass
class LookupMisses:
    """Counts the create's lookup misses.

    A Found outcome after a miss means the lookup did not see the holder and
    the insert's unique index (or the re-read after a pre-insert failure) did:
    the TOCTOU backstop (docs/contract.md, "The create sequence", step 5). The
    reliability suite counts how often real concurrency takes it.
    """

    count: int = 0

    def missed(self) -> None:
        self.count += 1


def draft_of(
    *, provider: str, event: str, content_type: str | None, body: bytes, site_url: str | None
) -> TaskDraft:
    """The TaskDraft a stored delivery describes, parsed by its provider's adapter.

    Raises :class:`UnsupportedPayload` or :class:`UnsupportedContentType`.
    """
    known = PROVIDERS.get(provider)
    if known is None:
        raise UnsupportedPayload(f"no provider {provider!r}")
    return known.to_draft(event, known.decode_body(content_type, body), site=site_url)


def read_claimed(session: Session, lease: Lease) -> ClaimedDelivery:
    delivery, source = session.execute(
        select(Delivery, WebhookSource)
        .join(WebhookSource, WebhookSource.id == Delivery.source_id)
        .where(Delivery.id == lease.delivery_pk)
    ).one()
    return ClaimedDelivery(
        delivery_pk=delivery.id,
        event=delivery.event,
        body=delivery.body,
        content_type=delivery.content_type,
        source_slug=source.slug,
        provider=source.provider,
        workspace_id=source.workspace_id,
        create_events=frozenset(source.create_events),
        site_url=source.site_url,
        created_task_id=delivery.created_task_id,
        entrance=Entrance(
            origin=delivery.origin,
            source_id=delivery.source_id,
            delivery_id=delivery.delivery_id,
            body_sha256=delivery.body_sha256,
            received_at=delivery.replayed_at or delivery.received_at,
            replayed=delivery.replayed_at is not None,
        ),
        body_dropped=None
        if delivery.body_dropped_at is None
        else body_dropped_note(
            received_at=delivery.received_at, dropped_at=delivery.body_dropped_at
        ),
    )


def create_on_the_general_path(attempt: Attempt, misses: LookupMisses) -> Processed:
    """The general path, from a committed lease: read the body, create, record."""
    session, lease = attempt.session, attempt.lease
    work = read_claimed(session, lease)
    logs.bind(source=work.source_slug, workspace=work.workspace_id)
    # Checked here as well as at the ingress: the source's events may have
    # changed since the delivery was stored.
    if work.event not in work.create_events:
        if work.event in PROVIDERS[work.provider].move_events and work.body_dropped is None:
            return _learn_moves(attempt, work)
        reason = f"{work.event} does not create tasks for source {work.source_slug}"
        return attempt.finish(DeliveryStatus.IGNORED, reason=reason)
    if work.body_dropped is not None:
        # Nothing to read a task from: a person's call (docs/runbook.md, "Retention").
        return attempt.finish(
            DeliveryStatus.DEAD, reason=f"nothing to process: {work.body_dropped}"
        )

    try:
        draft = draft_of(
            provider=work.provider,
            event=work.event,
            content_type=work.content_type,
            body=work.body,
            site_url=work.site_url,
        )
    except (UnsupportedPayload, UnsupportedContentType) as error:
        return attempt.finish(DeliveryStatus.DEAD, reason=f"unsupported payload: {error}")
    if _names_no_identity(draft):
        # The task store treats a blank external id as none at all
        # (docs/contract.md, "Validation and normalization"), and a task
        # without one would be made again by every redelivery.
        reason = f"cannot become a task: the payload names no external id ({draft.external_id!r})"
        return attempt.finish(DeliveryStatus.DEAD, reason=reason)
    try:
        # Everything the create will write, checked before its insert by the
        # task store's own rules (docs/contract.md, "Validation and
        # normalization"): a value no database stores must end the delivery
        # here, not fail the source link's write after the task committed.
        new = validated_new_task(
            replace(draft.new_task(), created_by_delivery=work.delivery_pk, entrance=work.entrance)
        )
    except InvalidTask as error:
        return attempt.finish(DeliveryStatus.DEAD, reason=f"unsupported payload: {error}")
    logs.bind(external_id=new.external_id)

    if work.created_task_id is not None:
        return _finish_earlier_attempts_create(attempt, work.created_task_id, new)
    try:
        result = create_task(
            session=session,
            caller=Caller.trusted(f"delivery {work.delivery_pk}"),
            workspace_id=work.workspace_id,
            new=new,
            hooks=attempt.seams.create_hooks(after_lookup_missed=misses.missed),
            fence=fence_create(lease),
        )
    except LeaseTakenOver:
        return attempt.taken_over()  # nothing was inserted: the insert rolled back
    except tuple(CREATE_REFUSALS) as error:
        return attempt.refused(error, workspace_id=work.workspace_id, external_id=draft.external_id)

    holder = result.task
    backstop = result.outcome.deduplicated and misses.count > 0
    if backstop:
        log.info(
            "delivery %s: the lookup missed %r, the insert backstop found task %s (%s)",
            work.delivery_pk,
            draft.external_id,
            holder.id,
            result.outcome.value,
        )
    if result.outcome is CreateOutcome.FOUND_UNSETTLED:
        if holder.created_by_delivery == work.delivery_pk:
            attempt.seams.before_settle(lease.delivery_pk)
            reason = "finished the create an earlier attempt of this delivery left unsettled"
            return finish_own_create(attempt, holder, new.source, reason=reason)
        return attempt.wait_or_park(
            _held_by(holder), outcome=result.outcome.value, task_id=holder.id
        )

    outcome = result.outcome
    reason = None
    if outcome is CreateOutcome.FOUND_SETTLED and holder.created_by_delivery == work.delivery_pk:
        # An earlier attempt of this very delivery created and settled the task,
        # then died before recording it: the outcome is that attempt's.
        outcome = CreateOutcome.CREATED
        reason = "an earlier attempt of this delivery created the task"
    elif outcome is CreateOutcome.CREATED_IDENTITY_LOST:
        reason = f"created {holder.identifier}, but {draft.external_id!r} was released meanwhile"
    elif backstop:
        reason = "the lookup missed; the insert's unique index found the task (the backstop)"
    if not outcome.deduplicated:
        attempt.seams.after_settle(lease.delivery_pk)
    return attempt.finish(
        DeliveryStatus.DONE, outcome=outcome.value, task_id=holder.id, reason=reason
    )


def _learn_moves(attempt: Attempt, work: ClaimedDelivery) -> Processed:
    """A delivery that announces moves and creates nothing: the identity
    ledger learns each move (docs/contract.md §15, "Identities that move").
    Learning a move twice changes nothing, so a crash before the record
    costs nothing but the same work again."""
    provider = PROVIDERS[work.provider]
    try:
        payload = provider.decode_body(work.content_type, work.body)
        moves = provider.moves(work.event, payload, work.site_url)
    except (UnsupportedPayload, UnsupportedContentType) as error:
        return attempt.finish(DeliveryStatus.DEAD, reason=f"unsupported payload: {error}")
    with transaction(attempt.session, "the moves a delivery announces"):
        learned = [
            learn_move(attempt.session, workspace_id=work.workspace_id, move=move) for move in moves
        ]
    reason = "announces a move: " + ("; ".join(learned) or "none it could read")
    return attempt.finish(DeliveryStatus.IGNORED, reason=reason)


def _finish_earlier_attempts_create(attempt: Attempt, task_id: int, new: NewTask) -> Processed:
    """An earlier attempt of this delivery inserted ``task_id``: finish that
    create rather than make another, or park the delivery when the task is
    gone -- deleted before its creation settled, and recreating it would undo
    someone's delete (docs/contract.md, "Fencing the create")."""
    external_id = normalize_external_id(new.external_id)
    stored = attempt.session.get(Task, task_id, populate_existing=True)
    if stored is None:
        return attempt.deleted_while_creating(external_id)
    reason = "finished the create an earlier attempt of this delivery began"
    if stored.external_id_settled_at is not None:
        reason = "an earlier attempt of this delivery created the task"
    # The task as it was inserted, with the identity it was created with: if
    # an operator released it since, the settlement must see that and report
    # the identity lost.
    inserted = Task(
        id=stored.id,
        workspace_id=stored.workspace_id,
        identifier=stored.identifier,
        external_id=external_id,
        created_by_delivery=attempt.delivery_pk,
    )
    attempt.seams.before_settle(attempt.delivery_pk)
    return finish_own_create(attempt, inserted, new.source, reason=reason)


def _names_no_identity(draft: TaskDraft) -> bool:
    try:
        return normalize_external_id(draft.external_id) is None
    except InvalidExternalId:
        return False  # invalid, not absent: create_task says why


def finish_own_create(
    attempt: Attempt, task: Task, source: SourceLink | None, *, reason: str | None
) -> Processed:
    """Steps 6-8 for a task this delivery inserted: an earlier attempt's, or
    this attempt's when the fast path's settlement matched no row (the task
    deleted, its identity released, or the settlement done by a concurrent
    completion of the same create); the re-read tells which. ``task``
    carries the identity it was inserted with."""
    task_id, identifier, external_id = task.id, task.identifier, task.external_id
    try:
        completed = complete_creation(session=attempt.session, task=task, source=source)
    except TaskNotFound:
        return attempt.deleted_while_creating(external_id)
    attempt.seams.after_settle(attempt.delivery_pk)
    if completed.outcome is CreateOutcome.CREATED_IDENTITY_LOST:
        reason = f"created {identifier}, but {external_id!r} was released meanwhile"
    return attempt.finish(
        DeliveryStatus.DONE, outcome=completed.outcome.value, task_id=task_id, reason=reason
    )


def _held_by(holder: Task) -> str:
    creator = (
        f"delivery {holder.created_by_delivery}"
        if holder.created_by_delivery is not None
        else "a caller outside the webhook inbox"
    )
    return (
        f"{holder.external_id!r} is held by unsettled task {holder.identifier} "
        f"(id {holder.id}), whose create by {creator} has not finished"
    )
