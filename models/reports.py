"""Read-only answers for operators: what is in the inbox, and what happened to an identity.

The ``taskhook`` CLI prints these, and the runbook (``docs/runbook.md``) is
written in their terms. Nothing here writes: every function takes a
keyword-only ``session`` and only selects, so a report never changes what it
reports on. Results are frozen dataclasses of plain values (no ORM objects),
ready for a table or for JSON.

No report ever carries a signing secret or a signature header: sources report
how many active secrets they have, and a delivery's stored headers (already an
allowlist at the ingress) are filtered again here before they are shown.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import Integer, case, cast, func, or_, select, text
from sqlalchemy.orm import Session

from models.catchup import BY_HAND, catch_up_command, mark_handled_command
from models.errors import (
    DeliveryNotFound,
    InvalidExternalId,
    InvalidFilter,
    WorkspaceNotAccessible,
)
from models.events import EventType
from models.external_id import normalize_external_id
from models.identities import NameView, names_shown, task_called
from models.inbox import (
    KEY_ORDER_SLACK,
    WEBHOOK_ORIGIN,
    DeliveryStatus,
    body_dropped_note,
    counts_by_status,
    first_received_since,
    of_workspaces,
    oldest_queued_at,
)
from models.names import Name
from models.operations import DeliveryFilter
from models.providers import UNKNOWN_EVENT
from models.tables import (
    CatchUpRun,
    Delivery,
    IdentityRelease,
    SourceSecret,
    Task,
    TaskDeletion,
    TaskEvent,
    TaskSource,
    WebhookSource,
    WorkflowStep,
    Workspace,
    utcnow,
)
from models.uptime import LOOK_BACK, Window, downtime, uncovered

#: Header names never shown, whatever the ingress's allowlist let through:
#: a signature is an oracle for the secret, the others are credentials.
_HIDDEN_HEADER_WORDS = ("signature", "authorization", "cookie", "token", "secret")

#: The most deliveries one page may hold.
MAX_PAGE = 500


# --- workspaces and sources ------------------------------------------------------------


@dataclass(frozen=True)
class WorkspaceSummary:
    id: int
    slug: str
    name: str
    task_prefix: str
    tasks: int
    sources: int
    created_at: datetime


def get_workspace(*, session: Session, slug: str) -> Workspace:
    """The workspace with this slug; :class:`WorkspaceNotAccessible` when none has it."""
    workspace = session.scalar(select(Workspace).where(Workspace.slug == slug))
    if workspace is None:
        raise WorkspaceNotAccessible(repr(slug))
    return workspace


def list_workspaces(*, session: Session) -> list[WorkspaceSummary]:
    tasks = (
        select(Task.workspace_id, func.count().label("n")).group_by(Task.workspace_id).subquery()
    )
    sources = (
        select(WebhookSource.workspace_id, func.count().label("n"))
        .group_by(WebhookSource.workspace_id)
        .subquery()
    )
    rows = session.execute(
        select(Workspace, func.coalesce(tasks.c.n, 0), func.coalesce(sources.c.n, 0))
        .outerjoin(tasks, tasks.c.workspace_id == Workspace.id)
        .outerjoin(sources, sources.c.workspace_id == Workspace.id)
        .order_by(Workspace.slug)
    ).all()
    return [
        WorkspaceSummary(
            id=workspace.id,
            slug=workspace.slug,
            name=workspace.name,
            task_prefix=workspace.task_prefix,
            tasks=task_count,
            sources=source_count,
            created_at=workspace.created_at,
        )
        for workspace, task_count, source_count in rows
    ]


@dataclass(frozen=True)
class StepSummary:
    """A workflow step, its WIP limit and the tasks in it that count against it."""

    name: str
    position: int
    #: The step new tasks land in: the one with the lowest position.
    intake: bool
    wip_limit: int | None
    #: Tasks in the step that are not archived: what the WIP limit counts.
    tasks: int

    @property
    def full(self) -> bool:
        return self.wip_limit is not None and self.tasks >= self.wip_limit


def list_steps(*, session: Session, workspace_id: int) -> list[StepSummary]:
    """The workspace's steps in order, each with its WIP limit and the
    unarchived tasks in it (as the create's WIP admission counts them)."""
    counted = (
        select(Task.step_id, func.count().label("n"))
        .where(Task.workspace_id == workspace_id, Task.archived_at.is_(None))
        .group_by(Task.step_id)
        .subquery()
    )
    rows = session.execute(
        select(WorkflowStep, func.coalesce(counted.c.n, 0))
        .outerjoin(counted, counted.c.step_id == WorkflowStep.id)
        .where(WorkflowStep.workspace_id == workspace_id)
        .order_by(WorkflowStep.position)
    ).all()
    return [
        StepSummary(
            name=step.name,
            position=step.position,
            intake=index == 0,
            wip_limit=step.wip_limit,
            tasks=count,
        )
        for index, (step, count) in enumerate(rows)
    ]


@dataclass(frozen=True)
class SourceSummary:
    """A source as operators see it. Its secrets are counted, never shown."""

    id: int
    slug: str
    provider: str
    workspace: str
    create_events: tuple[str, ...]
    site_url: str | None
    enabled: bool
    active_secrets: int
    created_at: datetime
    #: When its newest webhook delivery was received; None: it has none. A
    #: catch-up's rows do not count: they say the webhook did not get through.
    last_delivery_at: datetime | None = None
    #: Its lane (``models.broker.lanes.SourceLane``), and since when an
    #: operator paused it (None: not paused).
    lane: str = "auto"
    paused_at: datetime | None = None

    @property
    def rotating(self) -> bool:
        """A secret rotation is under way: more than one secret verifies."""
        return self.active_secrets > 1


class LastDeliveries:
    """Each source's last webhook delivery received, by source id, kept across
    reads: a read takes in only the rows stored since the one before the last
    (by key, the primary key's range), never the whole inbox -- but the first
    read, which reads it once. Reading from one read further back than needed
    takes in the rows of transactions that took their key before the last
    read and committed after it.

    Keep one per process and pass it on every read (the metrics' scrape, the
    console's sources page): that is what makes a read cheap."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[int, datetime] = {}
        #: The highest key the read before the last one saw, and the last one.
        self._scan_after = 0
        self._seen = 0

    def read(self, session: Session) -> dict[int, datetime]:
        with self._lock:
            newest = self._seen
            for source_id, received_at, key in session.execute(
                select(Delivery.source_id, func.max(Delivery.received_at), func.max(Delivery.id))
                .where(Delivery.id > self._scan_after, Delivery.origin == WEBHOOK_ORIGIN)
                .group_by(Delivery.source_id)
            ):
                known = self._last.get(source_id)
                if known is None or received_at > known:
                    self._last[source_id] = received_at
                newest = max(newest, key)
            self._scan_after, self._seen = self._seen, newest
            return dict(self._last)


def list_source_summaries(
    *,
    session: Session,
    workspace_ids: frozenset[int] | None = None,
    last_deliveries: LastDeliveries | None = None,
) -> list[SourceSummary]:
    """The sources of ``workspace_ids`` (None: every workspace), by slug.

    Their last deliveries come from ``last_deliveries``, which reads only the
    rows stored since its last read; without one, a new one reads the inbox
    once (fine for a command run now and then, not for a page shown often)."""
    active = (
        select(SourceSecret.source_id, func.count().label("n"))
        .where(SourceSecret.retired_at.is_(None))
        .group_by(SourceSecret.source_id)
        .subquery()
    )
    query = (
        select(WebhookSource, Workspace.slug, func.coalesce(active.c.n, 0))
        .join(Workspace, Workspace.id == WebhookSource.workspace_id)
        .outerjoin(active, active.c.source_id == WebhookSource.id)
        .order_by(WebhookSource.slug)
    )
    if workspace_ids is not None:
        query = query.where(WebhookSource.workspace_id.in_(sorted(workspace_ids)))
    rows = session.execute(query).all()
    last = (last_deliveries or LastDeliveries()).read(session)
    return [
        SourceSummary(
            id=source.id,
            slug=source.slug,
            provider=source.provider,
            workspace=workspace_slug,
            create_events=tuple(sorted(source.create_events)),
            site_url=source.site_url,
            enabled=source.enabled,
            active_secrets=secret_count,
            created_at=source.created_at,
            last_delivery_at=last.get(source.id),
            lane=source.lane,
            paused_at=source.paused_at,
        )
        for source, workspace_slug, secret_count in rows
    ]


# --- deliveries -------------------------------------------------------------------------


@dataclass(frozen=True)
class DeliverySummary:
    """One inbox row without its body or headers."""

    id: int
    source: str
    provider: str
    delivery_id: str
    event: str
    status: str
    attempts: int
    outcome: str | None
    task_id: int | None
    #: The identifier (``ACME-12``) of ``task_id``, while that task exists.
    task_identifier: str | None
    received_at: datetime
    updated_at: datetime
    status_reason: str | None
    last_error: str | None
    #: While processing: when the worker's lease runs out (then the sweeper re-sends it).
    lease_expires_at: datetime | None
    #: The task an attempt of this delivery inserted, even one deleted since.
    created_task_id: int | None = None
    #: The external id the delivery names, as the ingress read it; else the one
    #: its task holds now (rows stored before the ingress kept it).
    external_id: str | None = None
    #: When the retention policy dropped its body (models.retention); None: kept.
    body_dropped_at: datetime | None = None

    @property
    def body_dropped(self) -> str | None:
        """What stands in for a dropped body ("body dropped after 31 days by
        the retention policy (...)"); None while the body is kept."""
        if self.body_dropped_at is None:
            return None
        return body_dropped_note(received_at=self.received_at, dropped_at=self.body_dropped_at)


@dataclass(frozen=True)
class DeliveryPage:
    deliveries: list[DeliverySummary]
    #: Pass as ``before`` for the next (older) page; None on the last page.
    next_before: int | None


@dataclass(frozen=True)
class DeliveryDetail:
    summary: DeliverySummary
    hook_id: str | None
    content_type: str | None
    action: str | None
    body_bytes: int
    body_sha256: str
    #: The stored allowlist, minus anything that could be a signature or a credential.
    headers: dict[str, str]
    payload_mismatches: int
    workspace: str
    #: What stands in for a dropped body (see DeliverySummary.body_dropped);
    #: ``body_bytes`` is then 0, and ``body_sha256`` the dropped body's.
    body_dropped: str | None = None


def _summary_query():
    return (
        select(
            Delivery, WebhookSource.slug, WebhookSource.provider, Task.identifier, Task.external_id
        )
        .join(WebhookSource, WebhookSource.id == Delivery.source_id)
        .outerjoin(Task, Task.id == Delivery.task_id)
    )


def _summary(
    delivery: Delivery, source: str, provider: str, identifier: str | None, held: str | None
) -> DeliverySummary:
    return DeliverySummary(
        id=delivery.id,
        source=source,
        provider=provider,
        delivery_id=delivery.delivery_id,
        event=delivery.event,
        status=delivery.status,
        attempts=delivery.attempts,
        outcome=delivery.outcome,
        task_id=delivery.task_id,
        task_identifier=identifier,
        received_at=delivery.received_at,
        updated_at=delivery.updated_at,
        status_reason=delivery.status_reason,
        last_error=delivery.last_error,
        lease_expires_at=delivery.lease_expires_at,
        created_task_id=delivery.created_task_id,
        external_id=delivery.external_id or held,
        body_dropped_at=delivery.body_dropped_at,
    )


def list_deliveries(
    *,
    session: Session,
    status: DeliveryStatus | str | None = None,
    limit: int = 50,
    before: int | None = None,
    filter: DeliveryFilter | None = None,
) -> DeliveryPage:
    """Deliveries newest first, those ``filter`` matches (or, without one, of
    ``status``), one page at a time.

    Paging is by key (``before`` = the smallest id already seen), so a page
    stays correct while new deliveries arrive at the top. Raises
    :class:`InvalidFilter` for an unknown ``status``.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}")
    if filter is None:
        filter = DeliveryFilter(status=status)
    elif status is not None:
        raise ValueError("give the status in the filter")
    query = _summary_query().where(*filter.conditions(session=session))
    if before is not None:
        query = query.where(Delivery.id < before)
    # One extra row says whether another page exists without a COUNT.
    rows = session.execute(query.order_by(Delivery.id.desc()).limit(limit + 1)).all()
    page = [_summary(*row) for row in rows[:limit]]
    return DeliveryPage(page, page[-1].id if len(rows) > limit else None)


def show_delivery(*, session: Session, delivery_pk: int) -> DeliveryDetail:
    row = session.execute(
        _summary_query()
        .add_columns(Workspace.slug)
        .join(Workspace, Workspace.id == WebhookSource.workspace_id)
        .where(Delivery.id == delivery_pk)
    ).one_or_none()
    if row is None:
        raise DeliveryNotFound(delivery_pk)
    *summarized, workspace = row
    delivery = summarized[0]
    summary = _summary(*summarized)
    return DeliveryDetail(
        summary=summary,
        hook_id=delivery.hook_id,
        content_type=delivery.content_type,
        action=delivery.action,
        body_bytes=len(delivery.body),
        body_sha256=delivery.body_sha256,
        headers=shown_headers(delivery.headers or {}),
        payload_mismatches=delivery.payload_mismatches,
        workspace=workspace,
        body_dropped=summary.body_dropped,
    )


def shown_headers(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` without any that could carry a signature or a credential."""
    return {name: value for name, value in sorted(headers.items()) if not _hidden(name)}


def redacted_headers(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with the value of any that could carry a signature or a
    credential replaced by ``redacted``: the console shows that one was sent."""
    return {name: REDACTED if _hidden(name) else value for name, value in sorted(headers.items())}


REDACTED = "redacted"


def _hidden(name: str) -> bool:
    return any(word in name.lower() for word in _HIDDEN_HEADER_WORDS)


# --- an identity's lineage -----------------------------------------------------------


@dataclass(frozen=True)
class TaskView:
    id: int
    identifier: str
    title: str
    #: The identity the task holds now; None once it was released.
    external_id: str | None
    #: When its create settled. For a former holder, as its events tell: a
    #: release clears the row's stamp, not what happened.
    settled_at: datetime | None
    archived_at: datetime | None
    created_at: datetime
    created_by_delivery: int | None
    source_url: str | None
    #: Every name the identity ledger knows the task by, its own first, then
    #: its aliases (docs/contract.md §15, items 9 and 10).
    names: tuple[NameView, ...] = ()
    #: When an operator released the identity from it; None for a holder.
    released_at: datetime | None = None

    @property
    def settled(self) -> bool:
        return self.settled_at is not None

    @property
    def state(self) -> str:
        """Its history in a few words: ``settled``, ``not settled, then
        released``, ``settled, then released, archived``."""
        parts = ["settled" if self.settled else "not settled"]
        if self.released_at is not None:
            parts[0] += ", then released"
        if self.archived:
            parts.append("archived")
        return ", ".join(parts)

    @property
    def archived(self) -> bool:
        return self.archived_at is not None


@dataclass(frozen=True)
class ReleaseView:
    id: int
    task_id: int
    operator: str
    reason: str
    released_at: datetime


@dataclass(frozen=True)
class DeletedTaskView:
    """A task that held the identity and was deleted: its events remain, and
    the delete's audit row (none for a delete made before it was kept)."""

    id: int
    created_at: datetime | None
    deleted_at: datetime
    #: Who deleted it (the token's name) and the token's role; None for a
    #: delete older than its audit (migration 0023).
    deleted_by: str | None = None
    role: str | None = None

    @property
    def by(self) -> str:
        """``alice (member)``, or ``unknown`` for a delete without an audit row."""
        return "unknown" if self.deleted_by is None else f"{self.deleted_by} ({self.role})"


@dataclass(frozen=True)
class DeletionView:
    """One delete's audit row (``task_deletions``)."""

    id: int
    workspace: str
    task_id: int
    identifier: str
    external_id: str | None
    operator: str
    role: str
    deleted_at: datetime


@dataclass(frozen=True)
class Lineage:
    """Everything the store knows about one external id in one workspace."""

    workspace_id: int
    workspace: str
    external_id: str
    #: The task answering to the identity now -- holding it, or as an alias
    #: in the identity ledger -- settled or not, archived or not.
    holder: TaskView | None
    #: Tasks that held it before an operator released it (oldest first).
    former_holders: list[TaskView]
    releases: list[ReleaseView]
    #: Every delivery that named the identity or touched one of these tasks
    #: (oldest first).
    deliveries: list[DeliverySummary]
    #: Tasks that held it and were deleted, as their events tell (oldest first).
    deleted_holders: list[DeletedTaskView] = field(default_factory=list)

    @property
    def known(self) -> bool:
        return (
            self.holder is not None
            or bool(self.releases)
            or bool(self.deleted_holders)
            or bool(self.deliveries)
        )

    @property
    def without_task(self) -> list[DeliverySummary]:
        """The deliveries that named the identity and touched no task: parked,
        dead, ignored or still waiting before any task held it."""
        creators = {
            task.created_by_delivery
            for task in [self.holder, *self.former_holders]
            if task is not None
        }
        return [
            d
            for d in self.deliveries
            if d.task_id is None and d.created_task_id is None and d.id not in creators
        ]

    def identifier_of(self, task_id: int) -> str:
        """The identifier (``ACME-12``) of one of its tasks; ``task N`` for a
        task whose row is gone."""
        for task in [self.holder, *self.former_holders]:
            if task is not None and task.id == task_id:
                return task.identifier
        return f"task {task_id}"

    def creator_of(self, task: TaskView) -> DeliverySummary | None:
        """The delivery whose create inserted ``task``: the only one that may finish
        that create. None for a task created otherwise (through the REST API)."""
        return next((d for d in self.deliveries if d.id == task.created_by_delivery), None)

    def deliveries_of(self, task_id: int) -> list[DeliverySummary]:
        creators = {
            task.created_by_delivery
            for task in [self.holder, *self.former_holders]
            if task is not None and task.id == task_id
        }
        return [
            d
            for d in self.deliveries
            if task_id in (d.task_id, d.created_task_id) or d.id in creators
        ]


@dataclass(frozen=True)
class LineageEvent:
    at: datetime
    what: str
    detail: str


def lineage(*, session: Session, workspace_slug: str, external_id: object) -> Lineage:
    """The task answering to ``external_id`` in the workspace (holding it, or
    the task it is an alias of: ``models.identities.task_called``), the tasks that held it
    before a release, the releases, and every delivery that named the
    identity or touched those tasks.

    A delivery named the identity when the ingress read it from its body
    (``deliveries.external_id``): one parked before any task held it is in
    the lineage too. It touched a task when its recorded outcome names the task
    (``deliveries.task_id``) or when it is the delivery whose create inserted
    the task (``tasks.created_by_delivery``) -- the second catches a create that
    died between its insert and recording its outcome, which is exactly the
    case an operator is asked about. Raises :class:`WorkspaceNotAccessible`
    and :class:`InvalidExternalId` (with its reason).
    """
    workspace = get_workspace(session=session, slug=workspace_slug)
    normalized = normalize_external_id(external_id)
    if normalized is None:
        raise InvalidExternalId("external_id is required")

    # The task answering to it: its holder, or the task it is an alias of.
    holder_id = task_called(session, workspace.id, Name.external(normalized))
    holder = session.get(Task, holder_id) if holder_id is not None else None
    releases = [
        ReleaseView(r.id, r.task_id, r.operator, r.reason, r.released_at)
        for r in session.scalars(
            select(IdentityRelease)
            .where(
                IdentityRelease.workspace_id == workspace.id,
                IdentityRelease.external_id == normalized,
            )
            .order_by(IdentityRelease.released_at, IdentityRelease.id)
        )
    ]
    former_ids = [r.task_id for r in releases if holder is None or r.task_id != holder.id]
    deleted = _deleted_holders(session, workspace.id, normalized)
    former = (
        list(
            session.scalars(
                select(Task).where(Task.id.in_(former_ids)).order_by(Task.created_at, Task.id)
            )
        )
        if former_ids
        else []
    )
    tasks = ([holder] if holder is not None else []) + former
    links = _source_urls(session, [task.id for task in tasks])
    names = names_shown(session, [task.id for task in tasks])
    settled = _settled_before_release(session, workspace.id, former)
    released = {r.task_id: r.released_at for r in releases}
    views = {
        task.id: _task_view(
            task,
            links.get(task.id),
            names[task.id],
            settled_at=settled.get(task.id) if task is not holder else None,
            released_at=released.get(task.id) if task is not holder else None,
        )
        for task in tasks
    }

    touched_ids = list({*views, *former_ids, *(task.id for task in deleted)})
    creators = [task.created_by_delivery for task in tasks if task.created_by_delivery]
    # Unindexed like created_task_id (the ingress's insert would pay for an
    # index on every delivery): the one scan finds both.
    touched = Delivery.external_id == normalized
    if touched_ids:
        touched = or_(
            touched,
            Delivery.task_id.in_(touched_ids),
            Delivery.created_task_id.in_(touched_ids),
        )
    if creators:
        touched = or_(touched, Delivery.id.in_(creators))
    deliveries = [
        _summary(*row)
        for row in session.execute(
            _summary_query()
            .where(touched, WebhookSource.workspace_id == workspace.id)
            .order_by(Delivery.received_at, Delivery.id)
        )
    ]
    return Lineage(
        workspace_id=workspace.id,
        workspace=workspace.slug,
        external_id=normalized,
        holder=views[holder.id] if holder is not None else None,
        former_holders=[views[task.id] for task in former],
        releases=releases,
        deliveries=deliveries,
        deleted_holders=deleted,
    )


def _deleted_holders(
    session: Session, workspace_id: int, external_id: str
) -> list[DeletedTaskView]:
    """The tasks whose ``task.deleted`` event names the identity. Every task
    has its ``task.created`` before any later event (docs/contract.md, "Task
    events"), so a deleted task's creation time is in the stream too."""
    rows = session.execute(
        select(TaskEvent.task_id, TaskEvent.type, TaskEvent.occurred_at, TaskEvent.position)
        .where(
            TaskEvent.workspace_id == workspace_id,
            TaskEvent.task_id.in_(
                select(TaskEvent.task_id).where(
                    TaskEvent.workspace_id == workspace_id,
                    TaskEvent.type == EventType.DELETED.value,
                    TaskEvent.external_id == external_id,
                )
            ),
        )
        .order_by(TaskEvent.position)
    ).all()
    created: dict[int, tuple[datetime, int]] = {}
    deleted: dict[int, tuple[datetime, int]] = {}
    for task_id, kind, at, position in rows:
        if kind == EventType.CREATED.value:
            created.setdefault(task_id, (at, position))
        elif kind == EventType.DELETED.value:
            deleted[task_id] = (at, position)
    audits = (
        {
            row.task_id: row
            for row in session.scalars(
                select(TaskDeletion).where(
                    TaskDeletion.workspace_id == workspace_id,
                    TaskDeletion.task_id.in_(list(deleted)),
                )
            )
        }
        if deleted
        else {}
    )
    return [
        DeletedTaskView(
            id=task_id,
            created_at=created.get(task_id, (None, 0))[0],
            deleted_at=at,
            deleted_by=audits[task_id].operator if task_id in audits else None,
            role=audits[task_id].role if task_id in audits else None,
        )
        for task_id, (at, _) in sorted(deleted.items(), key=lambda item: item[1][1])
    ]


def list_deletions(
    *, session: Session, workspace_slug: str | None = None, limit: int = 100
) -> list[DeletionView]:
    """The deletes' audit rows, newest first: of one workspace, or of all.
    Raises :class:`WorkspaceNotAccessible` for an unknown slug."""
    query = (
        select(TaskDeletion, Workspace.slug)
        .join(Workspace, Workspace.id == TaskDeletion.workspace_id)
        .order_by(TaskDeletion.deleted_at.desc(), TaskDeletion.id.desc())
        .limit(limit)
    )
    if workspace_slug is not None:
        query = query.where(
            TaskDeletion.workspace_id == get_workspace(session=session, slug=workspace_slug).id
        )
    return [
        DeletionView(
            row.id,
            slug,
            row.task_id,
            row.identifier,
            row.external_id,
            row.operator,
            row.role,
            row.deleted_at,
        )
        for row, slug in session.execute(query)
    ]


def _settled_before_release(
    session: Session, workspace_id: int, released: Sequence[Task]
) -> dict[int, datetime]:
    """When each released task's create settled, as its events tell; a task
    released before its create settled is left out.

    A settled create appends ``task.created`` with its settlement, stamped with
    that moment. A release of an unsettled task appends it late, in the
    release's own transaction -- so at the position just before its
    ``task.identity_released`` -- stamped with the task's creation
    (``models.events.append_created_if_missing``): that one says nothing was
    settled."""
    if not released:
        return {}
    rows = session.execute(
        select(TaskEvent.task_id, TaskEvent.type, TaskEvent.position, TaskEvent.occurred_at)
        .where(
            TaskEvent.workspace_id == workspace_id,
            TaskEvent.task_id.in_([task.id for task in released]),
            TaskEvent.type.in_([EventType.CREATED.value, EventType.IDENTITY_RELEASED.value]),
        )
        .order_by(TaskEvent.position)
    ).all()
    created: dict[int, tuple[int, datetime]] = {}
    released_at: dict[int, int] = {}
    for task_id, kind, position, at in rows:
        if kind == EventType.CREATED.value:
            created.setdefault(task_id, (position, at))
        else:
            released_at.setdefault(task_id, position)
    settled = {}
    for task in released:
        if task.id not in created:
            continue
        position, at = created[task.id]
        appended_by_release = released_at.get(task.id) == position + 1 and at == task.created_at
        if not appended_by_release:
            settled[task.id] = at
    return settled


def _source_urls(session: Session, task_ids: Sequence[int]) -> dict[int, str]:
    if not task_ids:
        return {}
    return dict(
        session.execute(
            select(TaskSource.task_id, TaskSource.url).where(TaskSource.task_id.in_(task_ids))
        ).all()
    )


def _task_view(
    task: Task,
    source_url: str | None,
    names: list[NameView],
    *,
    settled_at: datetime | None = None,
    released_at: datetime | None = None,
) -> TaskView:
    """The task as a lineage shows it; a former holder's ``settled_at`` and
    ``released_at`` come from its history (its row's stamp is gone)."""
    return TaskView(
        id=task.id,
        identifier=task.identifier,
        title=task.title,
        external_id=task.external_id,
        settled_at=task.external_id_settled_at or settled_at,
        archived_at=task.archived_at,
        created_at=task.created_at,
        created_by_delivery=task.created_by_delivery,
        source_url=source_url,
        names=tuple(names),
        released_at=released_at,
    )


def task_named(*, session: Session, workspace_slug: str, identifier: str) -> TaskView | None:
    """The task whose identifier (``ACME-12``) is ``identifier`` in the workspace,
    or None; for an operator who has an identifier where an external id is asked.
    Raises :class:`WorkspaceNotAccessible`."""
    workspace = get_workspace(session=session, slug=workspace_slug)
    task = session.scalar(
        select(Task).where(Task.workspace_id == workspace.id, Task.identifier == identifier)
    )
    if task is None:
        return None
    link = _source_urls(session, [task.id]).get(task.id)
    return _task_view(task, link, names_shown(session, [task.id])[task.id])


def timeline(found: Lineage) -> list[LineageEvent]:
    """The lineage as delivery -> outcome -> task events, oldest first.

    A delivery's outcome is stamped with the row's last update, the closest
    time the inbox keeps for it.
    """
    events: list[tuple[datetime, int, LineageEvent]] = []

    def add(at: datetime | None, order: int, what: str, detail: str) -> None:
        if at is not None:
            events.append((at, order, LineageEvent(at, what, detail)))

    tasks = [t for t in [found.holder, *found.former_holders] if t is not None]
    names = {task.id: task.identifier for task in tasks}
    for d in found.deliveries:
        add(
            d.received_at, 0, f"delivery {d.id} received", f"{d.provider} {d.delivery_id} {d.event}"
        )
        task = (
            names.get(d.task_id) or d.task_identifier or (f"task {d.task_id}" if d.task_id else "")
        )
        detail = ", ".join(
            part
            for part in (
                d.outcome,
                task,
                d.status_reason,
                d.last_error and f"error: {d.last_error}",
            )
            if part
        )
        add(d.updated_at, 2, f"delivery {d.id} {d.status}", detail or "-")
        if d.body_dropped is not None:
            add(d.body_dropped_at, 3, f"delivery {d.id} body dropped", d.body_dropped)
    for task in tasks:
        creator = f"by delivery {task.created_by_delivery}" if task.created_by_delivery else ""
        add(task.created_at, 1, f"task {task.identifier} created", creator or "-")
        add(task.settled_at, 1, f"task {task.identifier} settled", "creation complete")
        add(task.archived_at, 3, f"task {task.identifier} archived", "keeps its identity")
    for gone in found.deleted_holders:
        add(gone.created_at, 1, f"task {gone.id} created", "deleted since; its row is gone")
        add(
            gone.deleted_at,
            3,
            f"task {gone.id} deleted",
            f"by {gone.by}; the identity was free again",
        )
    for release in found.releases:
        who = found.identifier_of(release.task_id)
        add(
            release.released_at,
            3,
            f"identity released from {who}",
            f"by {release.operator}: {release.reason}",
        )
    return [event for _, _, event in sorted(events, key=lambda e: (e[0], e[1]))]


# --- the inbox as a whole -----------------------------------------------------------------


@dataclass(frozen=True)
class InboxStats:
    counts: dict[str, int]
    oldest_queued_at: datetime | None
    oldest_queued_age_seconds: float | None
    #: Of the ignored deliveries, those of an event their provider does not
    #: know (``models.providers.UNKNOWN_EVENT``): a new event, or a webhook
    #: sending more than it should.
    unknown_events: int = 0


def inbox_stats(
    *,
    session: Session,
    now: datetime | None = None,
    workspace_ids: frozenset[int] | None = None,
) -> InboxStats:
    """Deliveries by status, how long the oldest queued one has waited since it
    was received (the number that falls back to zero after a lost broker), and
    how many were ignored as unknown events: of the sources of
    ``workspace_ids`` (None: every workspace)."""
    oldest = oldest_queued_at(session=session, workspace_ids=workspace_ids)
    now = now or utcnow()
    age = max(0.0, (now - oldest).total_seconds()) if oldest is not None else None
    # The ingress starts such a delivery's reason with UNKNOWN_EVENT; no column
    # of its own, since it is ignored like any other event and only counted apart.
    unknown = session.scalar(
        select(func.count()).where(
            Delivery.status == DeliveryStatus.IGNORED.value,
            Delivery.status_reason.startswith(UNKNOWN_EVENT, autoescape=True),
            of_workspaces(workspace_ids),
        )
    )
    counts = counts_by_status(session=session, workspace_ids=workspace_ids)
    return InboxStats(counts, oldest, age, unknown or 0)


#: The statuses of a delivery received and not finished: a workspace's backlog.
UNFINISHED = (DeliveryStatus.QUEUED.value, DeliveryStatus.PROCESSING.value)
#: How many backed-up workspaces the console's overview and ``taskhook stats``
#: list, largest backlog first; the others are summed in one line under them.
LISTED_BACKLOGS = 10


@dataclass(frozen=True)
class WorkspaceBacklog:
    """One workspace's deliveries received and not finished."""

    workspace_id: int
    slug: str
    #: Its deliveries ``queued`` or ``processing``.
    backlog: int
    #: When its oldest ``queued`` delivery was received, and how long ago
    #: that is; None when none is queued (only ``processing`` ones).
    oldest_queued_at: datetime | None
    oldest_queued_age_seconds: float | None


@dataclass(frozen=True)
class Backlogs:
    """The workspaces that are backed up (:func:`workspace_backlogs`)."""

    #: The ``top`` workspaces with the largest backlogs, largest first.
    largest: list[WorkspaceBacklog]
    #: The other workspaces with a backlog, folded into one: how many, their
    #: backlogs summed, and their oldest queued delivery (the longest wait).
    rest_workspaces: int = 0
    rest_backlog: int = 0
    rest_oldest_queued_at: datetime | None = None
    rest_oldest_queued_age_seconds: float | None = None


def workspace_backlogs(
    *,
    session: Session,
    top: int,
    now: datetime | None = None,
    workspace_ids: frozenset[int] | None = None,
) -> Backlogs:
    """Which workspaces of ``workspace_ids`` (None: every one) are backed up:
    each one's deliveries ``queued`` or ``processing``, and the age of its
    oldest queued one -- the ``top`` with the largest backlogs, largest first
    (then the longest wait, then the slug), the rest folded into one line.
    The console's overview, ``taskhook stats`` and ``/metrics`` all read this.

    One query over the unfinished rows only: ``ix_deliveries_status_updated_at``
    finds them by status, however many finished rows the inbox holds, and the
    sources (a few per workspace) give each its workspace. When a storm makes
    them a large part of the inbox, PostgreSQL reads the table instead, as it
    does for the inbox gauges' count by status (docs/performance.md, §17).
    """
    if top < 0:
        raise ValueError(f"top must be >= 0, not {top}")
    now = now or utcnow()
    queued_at = case(
        (Delivery.status == DeliveryStatus.QUEUED.value, Delivery.received_at),
        else_=None,
    )
    query = (
        select(
            Workspace.id,
            Workspace.slug,
            func.count().label("backlog"),
            func.min(queued_at).label("oldest"),
        )
        .select_from(Delivery)
        .join(WebhookSource, WebhookSource.id == Delivery.source_id)
        .join(Workspace, Workspace.id == WebhookSource.workspace_id)
        .where(Delivery.status.in_(UNFINISHED))
        .group_by(Workspace.id, Workspace.slug)
    )
    if workspace_ids is not None:
        query = query.where(Workspace.id.in_(sorted(workspace_ids)))

    def age(since: datetime | None) -> float | None:
        return None if since is None else max(0.0, (now - since).total_seconds())

    # Python's sort, not ORDER BY: SQLite and PostgreSQL order NULLs apart,
    # and the rows are one per workspace with a backlog.
    every = sorted(
        (
            WorkspaceBacklog(workspace_id, slug, backlog, oldest, age(oldest))
            for workspace_id, slug, backlog, oldest in session.execute(query)
        ),
        key=lambda w: (-w.backlog, w.oldest_queued_at or now, w.slug),
    )
    largest, rest = every[:top], every[top:]
    waiting = [w.oldest_queued_at for w in rest if w.oldest_queued_at is not None]
    oldest_rest = min(waiting, default=None)
    return Backlogs(
        largest=largest,
        rest_workspaces=len(rest),
        rest_backlog=sum(w.backlog for w in rest),
        rest_oldest_queued_at=oldest_rest,
        rest_oldest_queued_age_seconds=age(oldest_rest),
    )


#: The longest stretch :func:`deliveries_per_minute` charts, minute by minute.
MAX_RATE_MINUTES = 7 * 24 * 60


@dataclass(frozen=True)
class DeliveryRate:
    """Deliveries received per minute, by status, for a chart."""

    #: Every minute of the stretch, oldest first (each its start, in UTC).
    minutes: list[datetime]
    #: For each status that occurs, one count per minute of ``minutes``.
    counts: dict[str, list[int]]


def deliveries_per_minute(
    *,
    session: Session,
    since: datetime,
    now: datetime | None = None,
    workspace_ids: frozenset[int] | None = None,
) -> DeliveryRate:
    """Deliveries of ``workspace_ids``'s sources (None: every workspace)
    received each minute, from the minute ``since`` falls in to the one ``now``
    falls in, by their status now. Minutes without any count 0.

    ``received_at`` has no index (the ingress's insert would pay for it on
    every delivery): the stretch's first key is found by a binary search over
    the primary key (``models.inbox.first_received_since``), then that range
    of keys is counted in one query, grouped by minute.
    """
    now = now or utcnow()
    if since.tzinfo is None or now.tzinfo is None:
        raise InvalidFilter("since and now must say their time zone")
    start = since.astimezone(UTC).replace(second=0, microsecond=0)
    end = now.astimezone(UTC).replace(second=0, microsecond=0)
    if start > end:
        raise InvalidFilter("since must not be after now")
    span = int((end - start).total_seconds()) // 60 + 1
    if span > MAX_RATE_MINUTES:
        raise InvalidFilter(f"a chart by minute covers at most {MAX_RATE_MINUTES // 1440} days")
    minutes = [start + timedelta(minutes=n) for n in range(span)]
    counts: dict[str, list[int]] = {}
    first = first_received_since(session=session, since=start - KEY_ORDER_SLACK)
    if first is None:
        return DeliveryRate(minutes, counts)
    bucket = _minute_of(session, Delivery.received_at).label("minute")
    rows = session.execute(
        select(bucket, Delivery.status, func.count())
        .where(
            Delivery.id >= first,
            Delivery.received_at >= start,
            Delivery.received_at <= now,
            of_workspaces(workspace_ids),
        )
        .group_by(bucket, Delivery.status)
    ).all()
    first_minute = int(start.timestamp()) // 60
    for minute, status, count in rows:
        index = int(minute) - first_minute
        if 0 <= index < span:
            counts.setdefault(status, [0] * span)[index] += count
    return DeliveryRate(minutes, dict(sorted(counts.items())))


def _minute_of(session: Session, column):
    """The minute ``column`` falls in, as whole minutes since the epoch (UTC).

    Numbers, not truncated timestamps: PostgreSQL's ``date_trunc`` on a
    ``timestamptz`` truncates in the session's time zone. SQLite stores a
    UTCDateTime as UTC text (``2026-12-02 10:15:30.123456``, models.tables),
    which ``strftime('%s', ...)`` reads as UTC.
    """
    if session.get_bind().dialect.name == "postgresql":
        return cast(func.floor(func.extract("epoch", column) / 60), Integer)
    return cast(func.strftime("%s", column), Integer) // 60


#: How many of the newest deliveries :func:`known_events` reads.
KNOWN_EVENTS_WINDOW = 10_000


def known_events(*, session: Session, workspace_ids: frozenset[int] | None = None) -> list[str]:
    """The events of the newest deliveries (by key) of ``workspace_ids``'s
    sources, sorted: what a filter's event menu offers. Read from the newest
    :data:`KNOWN_EVENTS_WINDOW` only, so the menu costs the same whatever the
    inbox holds."""
    newest = (
        select(Delivery.event)
        .where(of_workspaces(workspace_ids))
        .order_by(Delivery.id.desc())
        .limit(KNOWN_EVENTS_WINDOW)
        .subquery()
    )
    return sorted(session.scalars(select(newest.c.event).distinct()))


@dataclass(frozen=True)
class InboxDiskUse:
    """What the inbox holds on disk (``taskhook stats``; docs/runbook.md, "Retention")."""

    #: The bodies' bytes, uncompressed, the rows holding them and those whose
    #: body the retention policy dropped (models.retention); None when not
    #: counted (``count_bodies=False``: counting reads every row).
    body_bytes: int | None
    rows: int | None
    bodies_dropped: int | None
    #: On PostgreSQL ``pg_total_relation_size('deliveries')``: the table, its
    #: TOAST (where large bodies go, compressed) and its indexes. On SQLite the
    #: whole database file (page_count * page_size), every table.
    storage_bytes: int
    #: What ``storage_bytes`` measures, in words.
    storage: str
    #: SQLite: pages free for reuse in the file (freelist_count * page_size),
    #: which only VACUUM gives back; None on PostgreSQL.
    free_bytes: int | None = None


def inbox_disk_use(*, session: Session, count_bodies: bool = True) -> InboxDiskUse:
    """How much disk the inbox takes: its rows, their bodies' bytes and how
    many bodies the retention policy dropped (one read of every row; skip it
    with ``count_bodies=False``, e.g. for a frequent scrape), and the storage
    as the database measures it (cheap on both)."""
    rows = body_bytes = dropped = None
    if count_bodies:
        rows, body_bytes, dropped = session.execute(
            select(
                func.count(),
                func.coalesce(func.sum(func.length(Delivery.body)), 0),
                func.count().filter(Delivery.body_dropped_at.is_not(None)),
            ).select_from(Delivery)
        ).one()
    if session.get_bind().dialect.name == "postgresql":
        size = session.scalar(text("SELECT pg_total_relation_size('deliveries')"))
        return InboxDiskUse(
            body_bytes=None if body_bytes is None else int(body_bytes),
            rows=rows,
            bodies_dropped=dropped,
            storage_bytes=int(size or 0),
            storage="the deliveries table, its TOAST and its indexes",
        )
    page_size = session.scalar(text("PRAGMA page_size")) or 0
    pages = session.scalar(text("PRAGMA page_count")) or 0
    free = session.scalar(text("PRAGMA freelist_count")) or 0
    return InboxDiskUse(
        body_bytes=None if body_bytes is None else int(body_bytes),
        rows=rows,
        bodies_dropped=dropped,
        storage_bytes=pages * page_size,
        storage="the SQLite database file (every table)",
        free_bytes=free * page_size,
    )


# --- catch-up and downtime ------------------------------------------------------------------


#: How many of a run's recovered deliveries ``stats`` names.
RECOVERED_SHOWN = 10


@dataclass(frozen=True)
class LastCatchUp:
    source: str
    provider: str
    #: ``log``, ``scan`` or ``search`` (``models.tables.CatchUpRun.kind``).
    kind: str
    started_at: datetime
    #: None while it runs, or when it stopped (``error`` says why) or was a dry run.
    covered_until: datetime | None
    missed: int
    recovered: int
    error: str | None
    #: What it recovered: the external ids (or, for a body that names none,
    #: the delivery ids) of the first :data:`RECOVERED_SHOWN` rows it stored.
    recovered_items: list[str]


@dataclass(frozen=True)
class HandledByHand:
    """A window an operator marked as handled by hand (``models.catchup.mark_handled``)."""

    source: str
    since: datetime
    until: datetime
    operator: str
    reason: str
    marked_at: datetime


@dataclass(frozen=True)
class Gaps:
    """When no ingress was up, and which of those windows each source has
    not caught up yet (``models.uptime``)."""

    downtime: list[Window]
    uncovered: dict[str, list[Window]]
    #: Each source's last catch-up (a window handled by hand is none).
    last_catch_ups: list[LastCatchUp]
    #: Each source's provider, by slug: which catch-up command covers it.
    providers: dict[str, str]
    #: The windows marked as handled by hand within the last 7 days, newest first.
    handled_by_hand: list[HandledByHand]

    def command(self, source: str, window: Window) -> str:
        """What covers ``window`` of ``source``: its provider's catch-up from
        where the window must be read (``models.catchup.catch_up_command``)."""
        return catch_up_command(self.providers.get(source, ""), source, since=window.since)

    def mark_command(self, source: str, window: Window) -> str:
        """The manual mark of ``window``, for when no catch-up can read it."""
        return mark_handled_command(source, since=window.since, until=window.end)


def gaps(*, session: Session, heartbeat_seconds: float, now: datetime | None = None) -> Gaps:
    windows = downtime(session=session, heartbeat_seconds=heartbeat_seconds, now=now)
    newest = (
        select(CatchUpRun.source_id, func.max(CatchUpRun.id).label("id"))
        .where(CatchUpRun.kind != BY_HAND)
        .group_by(CatchUpRun.source_id)
        .subquery()
    )
    now = now or utcnow()
    marks = session.execute(
        select(WebhookSource.slug, CatchUpRun)
        .join(WebhookSource, WebhookSource.id == CatchUpRun.source_id)
        .where(CatchUpRun.kind == BY_HAND, CatchUpRun.covered_until > now - LOOK_BACK)
        .order_by(CatchUpRun.id.desc())
    ).all()
    last = session.execute(
        select(WebhookSource.slug, WebhookSource.provider, CatchUpRun)
        .join(newest, newest.c.id == CatchUpRun.id)
        .join(WebhookSource, WebhookSource.id == CatchUpRun.source_id)
        .order_by(WebhookSource.slug)
    ).all()
    missing = uncovered(session=session, windows=windows)
    return Gaps(
        downtime=windows,
        uncovered=missing,
        last_catch_ups=[
            LastCatchUp(
                source=slug,
                provider=provider,
                kind=run.kind,
                started_at=run.started_at,
                covered_until=run.covered_until,
                missed=run.missed,
                recovered=run.recovered,
                error=run.error,
                recovered_items=_recovered_items(session, run.id),
            )
            for slug, provider, run in last
        ],
        providers=dict(
            session.execute(
                select(WebhookSource.slug, WebhookSource.provider).where(
                    WebhookSource.slug.in_(list(missing))
                )
            ).all()
        ),
        handled_by_hand=[
            HandledByHand(
                source=slug,
                since=run.since,
                until=run.covered_until,
                operator=run.operator or "",
                reason=run.reason or "",
                marked_at=run.started_at,
            )
            for slug, run in marks
        ],
    )


def _recovered_items(session: Session, run_id: int) -> list[str]:
    rows = session.execute(
        select(Delivery.external_id, Delivery.delivery_id)
        .where(Delivery.catchup_run_id == run_id)
        .order_by(Delivery.id)
        .limit(RECOVERED_SHOWN)
    )
    return [external_id or delivery_id for external_id, delivery_id in rows]
