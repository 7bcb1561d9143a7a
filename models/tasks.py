"""The task service: create-if-absent by external id, lookup, archive, delete, release.

``create_task`` follows the create sequence (docs/contract.md, "The create
sequence") step by step, and its steps carry that section's numbers. It
runs in named transactions (``models.db.transaction``), because the contract
needs two of its steps durable before the next begins: the insert (step 5,
after which the identity is held, unsettled, for everyone to see) and the
settlement (step 7). Every other function here leaves the commit to the
caller's unit of work.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sqlalchemy import String, cast, func, select, true, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from models.access import Caller
from models.db import transaction
from models.errors import (
    DeleteReserved,
    HolderChanged,
    IdentityRetired,
    InvalidExternalId,
    InvalidMerge,
    InvalidRelease,
    InvalidTask,
    TaskNotFound,
    WipLimitReached,
    WorkspaceMisconfigured,
    WorkspaceNotAccessible,
)
from models.events import EventType, append_created_if_missing, append_event
from models.external_id import normalize_external_id
from models.identities import (
    NAME_TAKEN,
    Entrance,
    IdentityState,
    ItemNames,
    Ruling,
    judge,
    recall,
    record_created,
    remember_aliases,
    remember_delivery,
    seen_before,
    task_became,
    task_called,
)
from models.integrity import violated_unique_index
from models.names import Name
from models.statements import dialect_insert, insert_from_values, sql_value
from models.tables import (
    Base,
    IdentityRelease,
    Task,
    TaskDeletion,
    TaskSource,
    WorkflowStep,
    Workspace,
    sql_constant,
    utcnow,
)

#: The longest title a task keeps (characters; the column is VARCHAR(500)).
MAX_TITLE_LENGTH = 500
#: The longest description a task keeps, in characters. GitHub caps an issue
#: or pull request body at 65,536 characters and Jira Cloud a description at
#: 32,767, so a real item fits whole; the adapters cut anything longer
#: (models.providers.drafts.draft_description) rather than lose the delivery.
MAX_DESCRIPTION_LENGTH = 65_536
#: What the source link's columns hold (models.tables.TaskSource).
MAX_PROVIDER_LENGTH = 32
MAX_REMOTE_KEY_LENGTH = 255
#: Text no database stores: PostgreSQL text cannot hold a NUL, and a lone
#: surrogate has no UTF-8 encoding. JSON can escape either ("\\u0000", "\\ud800"),
#: and ``json.loads`` joins escaped surrogate pairs, so any surrogate left is alone.
UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")


class CreateOutcome(enum.Enum):
    CREATED = "created"
    FOUND_SETTLED = "found_settled"
    FOUND_UNSETTLED = "found_unsettled"
    CREATED_IDENTITY_LOST = "created_identity_lost"

    @property
    def deduplicated(self) -> bool:
        """True when the task already existed and this call created nothing."""
        return self in (CreateOutcome.FOUND_SETTLED, CreateOutcome.FOUND_UNSETTLED)

    @property
    def creation_complete(self) -> bool:
        """False only for FOUND_UNSETTLED: the claiming create had not finished its
        required synchronous setup when observed (it may still be running)."""
        return self is not CreateOutcome.FOUND_UNSETTLED


@dataclass(frozen=True)
class CreateTaskResult:
    task: Task
    outcome: CreateOutcome

    @property
    def external_id(self) -> str | None:
        """The identity the task holds now: absent for CREATED_IDENTITY_LOST."""
        return self.task.external_id


@dataclass(frozen=True)
class SourceLink:
    """The GitHub or Jira item a task comes from."""

    provider: str
    url: str
    remote_key: str


@dataclass(frozen=True)
class NewTask:
    title: str
    description: str | None = None
    #: The raw caller-supplied value; normalized by the service (step 2).
    external_id: object = None
    #: Written by the required synchronous post-create step (step 6).
    source: SourceLink | None = None
    #: The inbox delivery making this create, recorded on the task it inserts.
    created_by_delivery: int | None = None
    #: The provider's stable key of the item, and the external ids a move
    #: left behind (models/names.py): names the identity ledger knows it by.
    stable_key: str | None = None
    moved_from: tuple[str, ...] = ()
    #: How the delivery making this create came in; None for a create made
    #: outside the inbox (REST, MCP). The ledger weighs it (step 3).
    entrance: Entrance | None = None


def _no_hook(*_args: object) -> None:
    return None


@dataclass(frozen=True)
class CreateHooks:
    """Seams in the create sequence, for tests and fail points.

    ``after_lookup`` runs after a lookup that missed, inside the lookup's read
    transaction (nothing is written yet, and nothing is locked on PostgreSQL);
    ``after_insert`` runs after the insert committed, with no transaction open.
    """

    after_lookup: Callable[[], None] = field(default=_no_hook)
    after_insert: Callable[[Task], None] = field(default=_no_hook)


NO_HOOKS = CreateHooks()

Dispatch = Callable[[Task], None]
#: Runs inside the insert's transaction once the new row has its id; raising
#: aborts the insert (the worker proves there that its delivery's lease is
#: still its own: docs/contract.md, "Fencing the create").
InsertFence = Callable[[Session, Task], None]


def create_task(
    *,
    session: Session,
    caller: Caller,
    workspace_id: int,
    new: NewTask,
    dispatch: Dispatch | None = None,
    hooks: CreateHooks = NO_HOOKS,
    fence: InsertFence | None = None,
) -> CreateTaskResult:
    """Create the task unless a task in the workspace already holds its external id.

    Commits in two named transactions, the insert's and the settlement's
    (see the module docstring), so call it with no writes of the caller's
    pending. ``dispatch`` is the asynchronous step (8): it is called with the
    task only after a successful settlement, never for a Found outcome and
    never when the identity was lost. Raises :class:`WorkspaceNotAccessible`,
    :class:`InvalidExternalId`, :class:`InvalidTask`, :class:`WipLimitReached`,
    or :class:`TaskNotFound` when the new task was deleted before it settled;
    whatever ``fence`` raises, with nothing inserted.
    """
    # 1. authorize workspace -- first, so an unauthorized caller learns nothing
    #    about which identities exist there.
    workspace = _authorized_workspace(session, caller, workspace_id)
    # 2. validate + normalize external_id -- before the lookup, so a malformed
    #    value is an error rather than an accidental lookup.
    external_id = normalize_external_id(new.external_id)
    names = None if external_id is None else _names(new, external_id)

    while True:
        task = _look_up_then_insert(session, workspace, new, names, hooks, fence)
        if isinstance(task, IdentityRetired):
            raise task
        if isinstance(task, CreateTaskResult):
            return task  # Found: by the lookup, or by the TOCTOU backstop
        if task is not None:
            break
        # The index said another task held the identity, but it was gone by
        # the time we re-read it (deleted or released): the identity is free
        # again, so the create starts over from the lookup.

    hooks.after_insert(task)
    return complete_creation(session=session, task=task, source=new.source, dispatch=dispatch)


class _Stage(enum.Enum):
    LOOKUP = "lookup"
    BEFORE_INSERT = "before_insert"
    INSERT = "insert"


def _names(new: NewTask, external_id: str) -> ItemNames:
    moved_from = []
    for old in new.moved_from:
        try:
            normalized = normalize_external_id(old)
        except InvalidExternalId:
            continue  # a name the item had, not one it is created under: never a refusal
        if normalized is not None:
            moved_from.append(normalized)
    return ItemNames(external_id, new.stable_key, tuple(moved_from))


class _NameTaken(Exception):
    """A rival create took one of the new task's names in the ledger after our lookup."""


def _look_up_then_insert(
    session: Session,
    workspace: Workspace,
    new: NewTask,
    names: ItemNames | None,
    hooks: CreateHooks,
    fence: InsertFence | None,
) -> Task | CreateTaskResult | IdentityRetired | None:
    """Steps 3-5 in the insert's transaction. The new task, a Found result
    (from the lookup, or from the backstop), the ledger's refusal (committed
    with its record of the delivery; the caller raises it), or None when the
    identity was freed again while we looked (the caller starts over)."""
    external_id = None if names is None else names.external_id
    stage = _Stage.LOOKUP
    try:
        with transaction(session, "the insert (create sequence, steps 3-5)"):
            # 3. LOOKUP before ANY write or allocation: resolving Found after the
            #    identifier allocation would burn a sequence number, and after WIP
            #    admission would turn a retry into a capacity error. The holder
            #    of the external id first, then the identity ledger: a name the
            #    item had, and what became of each (docs/contract.md §15).
            if names is not None:
                holder = _holder_of(session, workspace.id, names.external_id)
                if holder is None:
                    holder = _ask_the_ledger(session, workspace.id, names, new.entrance)
                if holder is not None:
                    if new.entrance is not None:
                        # Kept past the inbox row: a redelivery after pruning
                        # is judged by when this one came in.
                        remember_delivery(
                            session,
                            workspace_id=workspace.id,
                            name=names.external_id,
                            entrance=new.entrance,
                        )
                    # Committed with the record above; the caller raises it.
                    return holder if isinstance(holder, IdentityRetired) else _found(holder)
            hooks.after_lookup()
            stage = _Stage.BEFORE_INSERT
            # 4. required create-time validation: everything the create writes,
            #    the source link included, so nothing the database refuses can
            #    fail a write after the insert commits and leave the task unsettled.
            valid = validated_new_task(new)
            # 5. identifier allocation, WIP admission, task-row insert.
            identifier = _allocate_identifier(session, workspace)
            step = _admit_to_intake_step(session, workspace)
            stage = _Stage.INSERT
            now = utcnow()
            task = session.scalars(
                insert_task_statement(
                    workspace_id=workspace.id,
                    identifier=identifier,
                    title=valid.title,
                    description=valid.description,
                    step_id=step.id,
                    external_id=external_id,
                    stable_key=None if names is None else names.stable_key,
                    created_by_delivery=new.created_by_delivery,
                    now=now,
                ).returning(Task)
            ).one()
            if names is not None and not record_created(
                session,
                workspace_id=workspace.id,
                task_id=task.id,
                names=names,
                entrance=new.entrance,
                now=now,
            ):
                raise _NameTaken()
            if fence is not None:
                fence(session, task)
        return task
    except Exception as error:
        if stage is _Stage.LOOKUP or names is None:
            raise
        if stage is _Stage.INSERT and not (
            isinstance(error, _NameTaken)
            or (
                isinstance(error, IntegrityError)
                and violated_unique_index(error, Base.metadata) in NAME_TAKEN
            )
        ):
            raise
        # After a step-3 miss, a pre-insert failure (a full WIP step above
        # all) may hide a create that won the race; and the unique index (and
        # the ledger's key) is the backstop for the narrow race between the
        # lookup and the insert.
        holder = _holder_of(session, workspace.id, names.external_id) or _ask_the_ledger(
            session, workspace.id, names, new.entrance, remember=False
        )
        if isinstance(holder, IdentityRetired):
            raise holder from None
        if holder is not None:
            return _found(holder)
        if stage is _Stage.BEFORE_INSERT:
            raise
        return None


def complete_creation(
    *,
    session: Session,
    task: Task,
    source: SourceLink | None,
    dispatch: Dispatch | None = None,
) -> CreateTaskResult:
    """Steps 6-8 for a task whose row is committed: post-create work, settle, dispatch.

    Every step is idempotent, so the create that inserted the task -- and only
    that create, e.g. a redelivery of the same webhook delivery -- may call this
    again to finish what a crash interrupted. It never touches another
    caller's task.
    """
    # Read before anything can roll back: a rollback expires the instance.
    task_id, external_id = task.id, task.external_id
    try:
        with transaction(session, "the settlement (create sequence, steps 6-7)"):
            # 6. required synchronous post-create work
            if source is not None:
                record_task_source(session=session, task_id=task_id, source=source)
            # 7. SETTLE (a task without an external id has no identity to settle)
            settled = external_id is None or _settle(session, task, external_id)
            if settled:
                # The event commits with the settlement: it exists exactly when
                # the create did, and never for a Found outcome.
                append_event(session=session, type=EventType.CREATED, task=task)
    except IntegrityError:
        if _current(session, task_id) is None:
            raise TaskNotFound() from None  # deleted before its source link landed
        raise

    if settled:
        # 8. asynchronous dispatch -- only after settlement succeeded
        if dispatch is not None:
            dispatch(task)
        return CreateTaskResult(task, CreateOutcome.CREATED)

    # Zero rows: the task was deleted or its identity released while this
    # create ran. A benign race, not an error; never dispatch from here.
    with transaction(session, "the re-read of a task that did not settle"):
        current = _current(session, task_id)
    if current is None:
        raise TaskNotFound()
    if current.external_id == external_id and current.external_id_settled_at is not None:
        # A concurrent completion of this same create settled it first (and
        # dispatched); the task is ours and done (docs/contract.md, "Where
        # taskhook extends the contract").
        return CreateTaskResult(current, CreateOutcome.CREATED)
    return CreateTaskResult(current, CreateOutcome.CREATED_IDENTITY_LOST)


def validated_new_task(new: NewTask) -> NewTask:
    """``new`` as the task store keeps it: the title stripped, everything else as given.

    The one check of everything a create writes -- the title, the
    description and the source link (step 6) -- run by the create before its
    insert, and by the ingress on the task it keeps for the worker's fast
    path (``models.intake.read_delivery``), so the two cannot disagree
    (docs/contract.md, "Validation and normalization"). Raises
    :class:`InvalidTask` naming the field and the rule it breaks: a title
    missing or over :data:`MAX_TITLE_LENGTH`, a description over
    :data:`MAX_DESCRIPTION_LENGTH`, a link field over its column, or text no
    database stores (:data:`UNSTORABLE_TEXT`) anywhere.
    """
    if new.source is not None:
        _checked_text(new.source.provider, what="source provider", limit=MAX_PROVIDER_LENGTH)
        _checked_text(new.source.url, what="source url", limit=None)
        _checked_text(new.source.remote_key, what="source remote_key", limit=MAX_REMOTE_KEY_LENGTH)
    return replace(
        new, title=_validated_title(new.title), description=_validated_description(new.description)
    )


def _validated_title(raw: object) -> str:
    title = raw.strip() if isinstance(raw, str) else ""
    if not title:
        raise InvalidTask("title is required")
    return _checked_text(title, what="title", limit=MAX_TITLE_LENGTH)


def _validated_description(raw: object) -> str | None:
    if raw is None:
        return None
    return _checked_text(raw, what="description", limit=MAX_DESCRIPTION_LENGTH)


def _checked_text(value: object, *, what: str, limit: int | None) -> str:
    if not isinstance(value, str):
        raise InvalidTask(f"{what} must be text")
    unstorable = UNSTORABLE_TEXT.search(value)
    if unstorable:
        raise InvalidTask(
            f"{what} holds text no database stores "
            f"(U+{ord(unstorable.group()):04X} at position {unstorable.start()})"
        )
    if limit is not None and len(value) > limit:
        raise InvalidTask(f"{what} must be at most {limit} characters (got {len(value)})")
    return value


# --- the create's statements ----------------------------------------------------------
#
# Each takes values or bound parameters: the general path executes them one by
# one, and the fast path (models.fastpath) composes the same statements into
# its two, so a step is written once.


def allocate_identifier(workspace_id):
    """Step 5's identifier: the workspace's next sequence number, ``PREFIX-N``.
    The UPDATE locks the workspace row until commit, which also serializes a
    WIP count against concurrent creates."""
    return advance_task_sequence(workspace_id, by=1).returning(
        task_identifier(Workspace.task_prefix, Workspace.task_sequence).label("identifier")
    )


def advance_task_sequence(workspace_id, *, by):
    """The UPDATE that takes ``by`` numbers of the workspace's sequence at
    once (values or SQL expressions): the last of them is its new
    ``task_sequence``. A create's identifier is one of them
    (:func:`task_identifier`); the fast path numbers a group's creates in a
    workspace with one update, one version of the row, not one a create."""
    return (
        update(Workspace)
        .where(Workspace.id == workspace_id)
        .values(task_sequence=Workspace.task_sequence + by)
    )


def task_identifier(prefix, number):
    """SQL: the identifier ``PREFIX-N`` of a workspace's ``number``-th task."""
    return prefix + sql_constant("-") + cast(number, String)


def insert_task_statement(
    *,
    workspace_id,
    identifier,
    title,
    description,
    step_id,
    external_id,
    created_by_delivery,
    now,
    stable_key=None,
    task_id=None,
):
    """Step 5's insert: the task row, unsettled. ``task_id`` is the id when the
    caller drew it beforehand (PostgreSQL's fast path records it on the
    delivery in the same statement); by default the table's own.
    ``stable_key`` is the provider's stable key, the task's other own name
    (models/identities.py)."""
    values = {
        Task.workspace_id: workspace_id,
        Task.identifier: identifier,
        Task.title: title,
        Task.description: description,
        Task.step_id: step_id,
        Task.external_id: external_id,
        Task.stable_key: stable_key,
        Task.created_by_delivery: created_by_delivery,
        Task.created_at: now,
        Task.updated_at: now,
    }
    if task_id is not None:
        values = {Task.id: task_id, **values}
    return insert_from_values(Task, values)


def intake_step_query(workspace_id):
    """Where new tasks land: the workspace's step with the lowest position."""
    return (
        select(WorkflowStep)
        .where(WorkflowStep.workspace_id == workspace_id)
        .order_by(WorkflowStep.position)
        .limit(1)
    )


def holds_identity(workspace_id, external_id):
    """Step 3's lookup: the task in the workspace that holds ``external_id``."""
    return (Task.workspace_id == workspace_id, Task.external_id == external_id)


def settle_statement(*, task_id, external_id, now):
    """Step 7: stamp the settlement, only on the task that still holds the
    identity it was created with. ``external_id`` in the predicate is
    required, not defensive: release sets both columns to NULL, and a
    predicate on id and settled_at alone would stamp a settlement onto a task
    that no longer holds any identity."""
    return (
        update(Task)
        .where(
            Task.id == task_id,
            Task.external_id == external_id,
            Task.external_id_settled_at.is_(None),
        )
        .values(external_id_settled_at=now)
    )


def link_source_statement(dialect: str, *, task_id, provider, url, remote_key, now):
    """Step 6: link the task to the item it came from; a second write for the
    task is a no-op."""
    values = {
        TaskSource.task_id: task_id,
        TaskSource.provider: provider,
        TaskSource.url: url,
        TaskSource.remote_key: remote_key,
        TaskSource.created_at: now,
    }
    # INSERT ... SELECT, so that the values may be columns of a query (the
    # fast path links a group's tasks at once); WHERE true: SQLite reads an
    # INSERT ... SELECT followed by ON CONFLICT only when the SELECT has one.
    rows = select(*(sql_value(column, value) for column, value in values.items())).where(true())
    return (
        dialect_insert(dialect)(TaskSource)
        .from_select(list(values), rows)
        .on_conflict_do_nothing(index_elements=[TaskSource.task_id])
    )


def _allocate_identifier(session: Session, workspace: Workspace) -> str:
    return session.execute(allocate_identifier(workspace.id)).scalar_one()


def intake_step(session: Session, workspace_id: int) -> WorkflowStep:
    """Where new tasks land: the workspace's step with the lowest position."""
    step = session.scalars(intake_step_query(workspace_id)).first()
    if step is None:
        raise WorkspaceMisconfigured(f"workspace {workspace_id} has no workflow steps")
    return step


def _admit_to_intake_step(session: Session, workspace: Workspace) -> WorkflowStep:
    step = intake_step(session, workspace.id)
    if step.wip_limit is not None:
        in_progress = session.scalar(
            select(func.count())
            .select_from(Task)
            .where(Task.step_id == step.id, Task.archived_at.is_(None))
        )
        if in_progress >= step.wip_limit:
            raise WipLimitReached(step.name, step.wip_limit)
    return step


def _settle(session: Session, task: Task, external_id: str) -> bool:
    settled_at = utcnow()
    rows = session.execute(
        settle_statement(
            task_id=task.id, external_id=external_id, now=settled_at
        ).execution_options(synchronize_session=False)
    ).rowcount
    if rows == 1:
        task.external_id_settled_at = settled_at
        return True
    return False


def record_task_source(*, session: Session, task_id: int, source: SourceLink) -> None:
    """Link the task to the item it came from; a second write for the task is a no-op."""
    session.execute(
        link_source_statement(
            session.get_bind().dialect.name,
            task_id=task_id,
            provider=source.provider,
            url=source.url,
            remote_key=source.remote_key,
            now=utcnow(),
        )
    )


def _ask_the_ledger(
    session: Session,
    workspace_id: int,
    names: ItemNames,
    entrance: Entrance | None,
    *,
    remember: bool = True,
) -> Task | IdentityRetired | None:
    """The task one of ``names`` still names, if the ledger knows one; an
    :class:`IdentityRetired` when it says this entrance may not create the
    item again; None when nothing stands in the way (docs/contract.md §15)."""
    rows = recall(session, workspace_id, names.all())
    seen = None if entrance is None or not rows else seen_before(session, entrance)
    verdict = judge(rows, names, entrance, seen)
    if verdict.ruling is Ruling.RETIRED:
        return IdentityRetired(verdict.reason or "retired", verdict.task_id)
    if verdict.ruling is Ruling.CREATE:
        return None
    holder = _current(session, verdict.task_id)
    if holder is not None and remember:
        # Found under another name: the names it lacks become its aliases,
        # so the next lookup by them is direct.
        remember_aliases(session, workspace_id=workspace_id, names=names, known=rows)
    return holder


def _found(holder: Task) -> CreateTaskResult:
    # Found outcomes run no post-create work and dispatch nothing.
    settled = holder.external_id_settled_at is not None
    return CreateTaskResult(
        holder, CreateOutcome.FOUND_SETTLED if settled else CreateOutcome.FOUND_UNSETTLED
    )


def _authorized_workspace(session: Session, caller: Caller, workspace_id: int) -> Workspace:
    workspace = session.get(Workspace, workspace_id) if caller.may_access(workspace_id) else None
    if workspace is None:
        raise WorkspaceNotAccessible(workspace_id)
    return workspace


def _current(session: Session, task_id: int) -> Task | None:
    """The task as the database has it now, or None if its row is gone."""
    return session.scalars(
        select(Task).where(Task.id == task_id).execution_options(populate_existing=True)
    ).one_or_none()


def _holder_of(session: Session, workspace_id: int, external_id: str) -> Task | None:
    return session.scalars(
        select(Task)
        .where(*holds_identity(workspace_id, external_id))
        .execution_options(populate_existing=True)
    ).one_or_none()


def _required_external_id(raw: object) -> str:
    external_id = normalize_external_id(raw)
    if external_id is None:
        raise InvalidExternalId("external_id is required")
    return external_id


def find_task_by_external_id(
    *, session: Session, caller: Caller, workspace_id: int, external_id: object
) -> Task | None:
    """The task answering to ``external_id`` in the workspace (archived and
    unsettled ones included), or None: the one holding it, or the one it is
    an alias of in the identity ledger (docs/contract.md §15, item 9).
    Read-only. Authorizes, then validates, then looks."""
    _authorized_workspace(session, caller, workspace_id)
    name = Name.external(_required_external_id(external_id))
    task_id = task_called(session, workspace_id, name)
    return None if task_id is None else _current(session, task_id)


def get_task(*, session: Session, caller: Caller, task_id: int) -> Task:
    """The task, if the caller may see its workspace; otherwise TaskNotFound."""
    task = session.get(Task, task_id)
    if task is None or not caller.may_access(task.workspace_id):
        raise TaskNotFound()
    return task


def archive_task(*, session: Session, caller: Caller, task_id: int) -> Task:
    """Archive the task. It keeps its external id: a retry still finds it.

    One conditional UPDATE decides which archive archives: of two at once,
    the other matches no row (on PostgreSQL it waits for the first's row
    lock, then finds the task archived), so ``task.archived`` is appended
    once (docs/contract.md, "Task events"). Archiving an archived task
    changes nothing and answers the task."""
    get_task(session=session, caller=caller, task_id=task_id)
    now = utcnow()
    archived = session.execute(
        update(Task)
        .where(Task.id == task_id, Task.archived_at.is_(None))
        .values(archived_at=now, updated_at=now)
        .returning(Task.id)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()
    task = _current(session, task_id)
    if task is None:
        raise TaskNotFound()  # deleted since it was read
    if archived is not None:
        append_event(session=session, type=EventType.ARCHIVED, task=task)
        task_became(session, task=task, state=IdentityState.ARCHIVED)
    return task


def delete_task(*, session: Session, caller: Caller, task_id: int) -> TaskDeletion:
    """Delete the task; its external id goes with the row and is free again.

    The one delete every surface calls. It writes the audit row -- who
    (``caller.name``, and the caller's role), when, the task and the
    identity it freed -- in the delete's own transaction, as a release does
    (docs/contract.md §11). Raises :class:`TaskNotFound` (also for a task the
    caller may not see), then :class:`DeleteReserved` when the task's
    workspace reserves deletes to operators and ``caller`` is not one:
    nothing is deleted.
    """
    workspace_id = get_task(session=session, caller=caller, task_id=task_id).workspace_id
    workspace = session.get(Workspace, workspace_id)
    if workspace is not None and workspace.deletes_need_operator and not caller.operator:
        raise DeleteReserved(workspace.slug)
    # Held, so that a settlement cannot commit between the check below and
    # the delete: the task.created event comes exactly once either way.
    task = held_until_commit(session, task_id)
    if task is None:
        raise TaskNotFound()  # deleted by another request meanwhile
    append_created_if_missing(session=session, task=task)
    append_event(session=session, type=EventType.DELETED, task=task)
    # The ledger keeps the names: a scan never brings the item back
    # (docs/contract.md §15, "The identity ledger").
    task_became(session, task=task, state=IdentityState.DELETED)
    audit = TaskDeletion(
        workspace_id=task.workspace_id,
        task_id=task.id,
        identifier=task.identifier,
        external_id=task.external_id,
        operator=caller.name,
        role=DELETED_BY_OPERATOR if caller.operator else DELETED_BY_MEMBER,
    )
    session.add(audit)
    session.delete(task)
    session.flush()
    return audit


#: ``task_deletions.role``: the role of the token that deleted the task.
DELETED_BY_OPERATOR = "operator"
DELETED_BY_MEMBER = "member"


def held_until_commit(session: Session, task_id: int) -> Task | None:
    """The task read afresh and held until the caller's commit; None when
    its row is gone. PostgreSQL locks the row (``FOR UPDATE``). SQLite
    ignores ``FOR UPDATE``, so there the transaction begins with a write (one
    that changes nothing), which takes the database's one write lock
    (``models.sqlite_writer``, then SQLite's own) before the read: no other
    writer, a settlement included, commits until this transaction does."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(
            update(Task)
            .where(Task.id == task_id)
            .values(updated_at=Task.updated_at)
            .execution_options(synchronize_session=False)
        )
    return session.scalars(
        select(Task)
        .where(Task.id == task_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()


#: The longest reason and operator name an audit row keeps.
MAX_RELEASE_REASON_LENGTH = 1000
MAX_OPERATOR_LENGTH = 200
_AUDIT_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f]")


def clean_release_text(
    value: object,
    *,
    what: str,
    missing: str,
    limit: int,
    error: type[InvalidRelease] | type[InvalidMerge] = InvalidRelease,
) -> str:
    """``value`` as an audit row keeps it: one line of text, trimmed, not
    empty (``missing`` says so), at most ``limit`` characters. Raises
    ``error`` (:class:`InvalidRelease`, or a merge's :class:`InvalidMerge`)
    saying which rule it breaks; every release and merge surface calls it, so
    a 100,000-character reason or one with a terminal escape is refused
    everywhere, not stored raw."""
    if value is None:
        raise error(missing)
    if not isinstance(value, str):
        raise error(f"{what} must be text")
    text = value.strip()
    if not text:
        raise error(missing)
    control = _AUDIT_CONTROL_CHARACTER.search(text)
    if control:
        raise error(
            f"{what} must be one line without control characters "
            f"(U+{ord(control.group()):04X} at position {control.start()})"
        )
    if len(text) > limit:
        raise error(f"{what} must be at most {limit} characters (got {len(text)})")
    return text


def release_external_id(
    *,
    session: Session,
    workspace_id: int,
    external_id: object,
    operator: str,
    reason: str,
    expected_task_id: int | None = None,
) -> IdentityRelease:
    """Free an identity without deleting its task: an operator's decision, audited.

    Sets ``external_id`` and ``external_id_settled_at`` to NULL on the holder,
    writes the audit row, and changes nothing else. With ``expected_task_id``
    (the holder the operator was shown), only that task is released: the
    check and the release are one UPDATE, so a task that claimed the identity
    since is never freed by a request that waited in a queue
    (docs/contract.md, "Where taskhook extends the basic contract").

    Raises :class:`InvalidExternalId`, :class:`InvalidRelease` (no operator
    or reason, or one the audit cannot keep), :class:`TaskNotFound` when no
    task holds the identity, or :class:`HolderChanged` when another task
    than the expected one holds it.
    """
    normalized = _required_external_id(external_id)
    operator = clean_release_text(
        operator,
        what="the operator",
        missing="a release must name its operator",
        limit=MAX_OPERATOR_LENGTH,
    )
    reason = clean_release_text(
        reason,
        what="the reason",
        missing="a release must give a reason",
        limit=MAX_RELEASE_REASON_LENGTH,
    )
    held = list(holds_identity(workspace_id, normalized))
    predicate = held if expected_task_id is None else [*held, Task.id == expected_task_id]
    task_id = session.execute(
        update(Task)
        .where(*predicate)
        .values(external_id=None, external_id_settled_at=None)
        .returning(Task.id)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()
    if task_id is None:
        holder = _holder_of(session, workspace_id, normalized)
        if holder is None:
            raise TaskNotFound()
        expected = session.get(Task, expected_task_id) if expected_task_id is not None else None
        raise HolderChanged(
            expected_task_id,
            holder.id,
            holder.identifier,
            expected.identifier if expected is not None else None,
        )
    released = session.get(Task, task_id, populate_existing=True)
    # The row is locked by the UPDATE, so no settlement can commit meanwhile.
    append_created_if_missing(session=session, task=released, external_id=normalized)
    append_event(
        session=session, type=EventType.IDENTITY_RELEASED, task=released, external_id=normalized
    )
    # The identity and its aliases are free together (docs/contract.md §11).
    task_became(session, task=released, state=IdentityState.RELEASED, external_id=normalized)
    audit = IdentityRelease(
        workspace_id=workspace_id,
        external_id=normalized,
        task_id=task_id,
        expected_task_id=expected_task_id,
        operator=operator,
        reason=reason,
    )
    session.add(audit)
    session.flush()
    return audit


def list_tasks(
    *, session: Session, caller: Caller, workspace_id: int, limit: int = 50, after: int = 0
) -> list[Task]:
    """One page of the workspace's tasks, oldest first: ids above ``after``."""
    _authorized_workspace(session, caller, workspace_id)
    return list(
        session.scalars(
            select(Task)
            .where(Task.workspace_id == workspace_id, Task.id > after)
            .order_by(Task.id)
            .limit(limit)
        )
    )


def update_task(
    *,
    session: Session,
    caller: Caller,
    task_id: int,
    title: str | None = None,
    description: str | None = None,
    clear_description: bool = False,
) -> Task:
    """Edit a task's title and description. There is deliberately no way to
    change its external id: it is set once, at create."""
    task = get_task(session=session, caller=caller, task_id=task_id)
    # The create's rules (validated_new_task); a refusal rolls the unit of work back.
    if title is not None:
        task.title = _validated_title(title)
    if clear_description:
        task.description = None
    elif description is not None:
        task.description = _validated_description(description)
    task.updated_at = utcnow()
    session.flush()
    return task
