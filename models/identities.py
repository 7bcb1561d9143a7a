"""The identity ledger: what every name a workspace's task was known by has become.

Per (workspace, name), where a name is an external id or a provider's
stable key (models.names.py): the task it named, and its state -- held,
archived, deleted or released. A task's own names live on its row
(``tasks.external_id``, ``tasks.stable_key``) while it holds them, so a
plain create writes nothing here; the ``identities`` table keeps every other
name -- aliases, and names a task gave up -- written in the same transaction
as the change that set it. :func:`recall` reads both as one ledger. It
outlives delivery retention, so every entrance (a webhook, the catch-up, a
scan, a Jira search, a replay, a redelivery after pruning) asks the same
question of the same place, when the worker runs the delivery: :func:`judge`.
The rules and their reasons: docs/contract.md §15, "The identity ledger".

Writers: the create sequence (the task row; :func:`record_created` for the
names a move left), archive, delete and release (:func:`task_became`), the
worker learning a move (:func:`learn_move`), and an operator's merge
(models/merges.py).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import (
    Integer,
    and_,
    case,
    cast,
    delete,
    false,
    func,
    literal,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from models.names import Move, Name, NameKind
from models.statements import dialect_insert
from models.tables import (
    EXTERNAL_ID_INDEX,
    STABLE_KEY_INDEX,
    Delivery,
    Identity,
    IdentityDelivery,
    IdentityPrefix,
    Task,
    WebhookSource,
    sql_constant,
    utcnow,
)

#: The ledger's key, whose violation means "another create took this name".
LEDGER_KEY = "pk_identities"
#: The unique keys whose violation means a rival create took one of a new
#: task's names first: the tasks' own names, and the ledger's.
NAME_TAKEN = frozenset({EXTERNAL_ID_INDEX, STABLE_KEY_INDEX, LEDGER_KEY})


class IdentityState(enum.StrEnum):
    HELD = "held"
    ARCHIVED = "archived"
    DELETED = "deleted"
    RELEASED = "released"

    @property
    def live(self) -> bool:
        """A task still answers to the name (it may be archived)."""
        return self in (IdentityState.HELD, IdentityState.ARCHIVED)


#: ``deliveries.origin`` of a create synthesized from an item's state (a
#: GitHub scan, a Jira search): it never brings back what a workspace had.
SYNTHESIZED_ORIGIN = "scan"


@dataclass(frozen=True)
class Entrance:
    """How the delivery making a create came in: what :func:`judge` weighs."""

    origin: str
    source_id: int
    delivery_id: str
    body_sha256: str
    #: When it was received -- or replayed by an operator, which counts as
    #: received again (an operator's decision, made after whatever came before).
    received_at: datetime
    #: An operator replayed it: their decision, so neither "this delivery
    #: created it before" nor "a scan never brings it back" holds it back.
    replayed: bool = False

    @property
    def synthesized(self) -> bool:
        return self.origin == SYNTHESIZED_ORIGIN and not self.replayed


@dataclass(frozen=True)
class ItemNames:
    """Every name a create knows its item by: the external id it creates
    under, the provider's stable key, and the ids a move it announces left."""

    external_id: str
    stable_key: str | None = None
    moved_from: tuple[str, ...] = ()

    def all(self) -> list[Name]:
        names = [Name.external(self.external_id)]
        if self.stable_key is not None:
            names.append(Name.stable(self.stable_key))
        names += [Name.external(old) for old in self.moved_from if old != self.external_id]
        return names


@dataclass(frozen=True)
class Recalled:
    """One ledger row, as :func:`judge` reads it."""

    name: Name
    task_id: int
    state: IdentityState
    is_alias: bool
    source_id: int | None
    delivery_id: str | None
    changed_at: datetime


class Ruling(enum.Enum):
    #: Nothing the ledger knows stands in the way: the create goes on.
    CREATE = "create"
    #: A task still answers to one of the names: the create is Found on it.
    FOUND = "found"
    #: The item had a task the workspace removed, and this entrance may not
    #: bring it back: the delivery creates nothing.
    RETIRED = "retired"


@dataclass(frozen=True)
class Verdict:
    ruling: Ruling
    task_id: int | None = None
    reason: str | None = None


CREATE = Verdict(Ruling.CREATE)


def recall(session: Session, workspace_id: int, names: Sequence[Name]) -> list[Recalled]:
    """The ledger's rows for ``names``, and for the names a learned repository
    rename says each external one had before."""
    wanted = list(names)
    wanted += [
        Name.external(before)
        for name in names
        if name.kind is NameKind.EXTERNAL
        for before in _renamed_from(session, workspace_id, name.value)
    ]
    if not wanted:
        return []
    rows = session.execute(
        select(
            Identity.kind,
            Identity.name,
            Identity.task_id,
            Identity.state,
            Identity.is_alias,
            Identity.source_id,
            Identity.delivery_id,
            Identity.changed_at,
        ).where(
            Identity.workspace_id == workspace_id,
            or_(*(and_(Identity.kind == n.kind.value, Identity.name == n.value) for n in wanted)),
        )
    ).all()
    by_name = {
        Name(NameKind(kind), name): Recalled(
            Name(NameKind(kind), name),
            task_id,
            IdentityState(state),
            is_alias,
            source_id,
            delivery_id,
            changed_at,
        )
        for kind, name, task_id, state, is_alias, source_id, delivery_id, changed_at in rows
    }
    # In the order asked: the external id first, so its row decides a tie;
    # a live task's own name before a row of a task that gave it up.
    own = _own_rows(session, workspace_id, wanted)
    return [
        row
        for name in dict.fromkeys(wanted)
        for row in (own.get(name), by_name.get(name))
        if row is not None
    ]


def _own_rows(session: Session, workspace_id: int, names: Sequence[Name]) -> dict[Name, Recalled]:
    """The names in ``names`` a task holds as its own (its external id, its
    stable key), as ledger rows: held, or archived with the task."""
    wanted = {kind: [n.value for n in names if n.kind is kind] for kind in NameKind}
    held = [_OWN_COLUMN[kind].in_(values) for kind, values in wanted.items() if values]
    if not held:
        return {}
    found: dict[Name, Recalled] = {}
    tasks = session.execute(
        select(Task.id, Task.external_id, Task.stable_key, Task.archived_at, Task.created_at).where(
            Task.workspace_id == workspace_id, or_(*held)
        )
    )
    for task in tasks:
        state = IdentityState.HELD if task.archived_at is None else IdentityState.ARCHIVED
        for name in _own_names(task.external_id, task.stable_key):
            if name.value in wanted[name.kind]:
                found[name] = Recalled(
                    name, task.id, state, False, None, None, task.archived_at or task.created_at
                )
    return found


#: Where a task keeps each kind of its own name.
_OWN_COLUMN = {NameKind.EXTERNAL: Task.external_id, NameKind.STABLE: Task.stable_key}


def _own_names(external_id: str | None, stable_key: str | None) -> list[Name]:
    names = [] if external_id is None else [Name.external(external_id)]
    return names + ([] if stable_key is None else [Name.stable(stable_key)])


def _renamed_from(session: Session, workspace_id: int, external_id: str) -> list[str]:
    """``external_id`` as it was before each learned rename whose new prefix it has."""
    prefixes = session.execute(
        select(IdentityPrefix.before, IdentityPrefix.after).where(
            IdentityPrefix.workspace_id == workspace_id,
            func.substr(literal(external_id), 1, func.length(IdentityPrefix.after))
            == IdentityPrefix.after,
        )
    ).all()
    return [before + external_id[len(after) :] for before, after in prefixes]


@dataclass(frozen=True)
class Seen:
    """What the ledger kept of a delivery it judged before (identity_deliveries)."""

    received_at: datetime
    created: bool


def seen_before(session: Session, entrance: Entrance) -> Seen | None:
    """The delivery's record from an earlier judgment, if it has one: after
    its inbox row was pruned, what says when it first came in."""
    row = session.execute(
        select(IdentityDelivery.received_at, IdentityDelivery.created).where(
            IdentityDelivery.source_id == entrance.source_id,
            IdentityDelivery.delivery_id == entrance.delivery_id,
        )
    ).first()
    return None if row is None else Seen(row.received_at, row.created)


_CREATED_BEFORE = "this same delivery created it before, and never creates twice"


def judge(
    rows: Sequence[Recalled],
    names: ItemNames,
    entrance: Entrance | None,
    seen: Seen | None = None,
) -> Verdict:
    """What the ledger says of a create of ``names``, whose names recalled
    ``rows``; ``seen`` is the delivery's own record from an earlier judgment.

    ``entrance`` is None for a create made outside the inbox (REST, MCP):
    such a caller gets only the Found a name's task gives; the retirement
    rules are about deliveries (docs/contract.md §15, "The identity ledger").
    """
    for row in rows:
        if row.state.live:
            return Verdict(Ruling.FOUND, row.task_id)
    if entrance is None or not rows:
        return CREATE
    received_at = entrance.received_at
    if not entrance.replayed:
        for row in rows:
            if row.source_id == entrance.source_id and row.delivery_id == entrance.delivery_id:
                return _retired(row, _CREATED_BEFORE)
        if seen is not None:
            if seen.created:
                return _retired(rows[0], _CREATED_BEFORE)
            # Judged before, its inbox row since pruned: it came in then.
            received_at = min(received_at, seen.received_at)
    if entrance.synthesized:
        return _retired(
            rows[0], "the workspace had a task for it, and a scan or search never brings one back"
        )
    for row in rows:
        if row.changed_at > received_at:
            return _retired(
                row,
                f"the delivery was received before that "
                f"({row.changed_at:%Y-%m-%d %H:%M:%S} UTC); replay it to create anew",
            )
    created_under = Name.external(names.external_id)
    if any(row.name == created_under and not row.is_alias for row in rows):
        return CREATE  # a new delivery after a delete or a release: a new task
    for row in rows:
        if row.state is IdentityState.DELETED:
            # Known only by another name (before a move, or its stable key):
            # the item an operator deleted has moved, not been created anew.
            return _retired(row, "the item was deleted under that name, and has since moved")
    return CREATE


def remember_delivery(
    session: Session, *, workspace_id: int, name: str, entrance: Entrance
) -> None:
    """Keep that this delivery was judged for ``name`` (Found, or turned
    away), past its inbox row: the first record stands."""
    _remember(
        session,
        {
            "source_id": entrance.source_id,
            "delivery_id": entrance.delivery_id,
            "workspace_id": workspace_id,
            "name": name,
            "body_sha256": entrance.body_sha256,
            "received_at": entrance.received_at,
            "created": False,
        },
    )


def _remember(session: Session, values: dict[str, object]) -> None:
    dialect = session.get_bind().dialect.name
    insert_ = dialect_insert(dialect)
    session.execute(
        insert_(IdentityDelivery)
        .values(values)
        .on_conflict_do_nothing(
            index_elements=[IdentityDelivery.source_id, IdentityDelivery.delivery_id]
        )
    )


def keep_creators(session: Session, delivery_pks: Sequence[int]) -> None:
    """Of the inbox rows ``delivery_pks``, about to be deleted by retention,
    those that created a task are kept in identity_deliveries: such a
    delivery never creates again, nor its body under another id, whatever
    becomes of its task (docs/contract.md §14). A task holds its own names
    on its row with no ledger row to keep its creator meanwhile."""
    dialect = session.get_bind().dialect.name
    insert_ = dialect_insert(dialect)
    creators = (
        select(
            Delivery.source_id,
            Delivery.delivery_id,
            WebhookSource.workspace_id,
            Delivery.external_id,
            Delivery.body_sha256,
            Delivery.received_at,
            true(),
        )
        .join(WebhookSource, WebhookSource.id == Delivery.source_id)
        .where(
            Delivery.id.in_(delivery_pks),
            Delivery.created_task_id.is_not(None),
            Delivery.external_id.is_not(None),
        )
    )
    columns = ["source_id", "delivery_id", "workspace_id", "name", "body_sha256"]
    session.execute(
        insert_(IdentityDelivery)
        .from_select([*columns, "received_at", "created"], creators)
        .on_conflict_do_nothing(
            index_elements=[IdentityDelivery.source_id, IdentityDelivery.delivery_id]
        )
    )


def _keep_the_earlier_creator(session: Session, workspace_id: int, name: str) -> None:
    """Before a new task takes over a freed name, the delivery that created
    the earlier one moves to identity_deliveries: it must never create again."""
    earlier = session.execute(
        select(
            Identity.source_id, Identity.delivery_id, Identity.body_sha256, Identity.created_at
        ).where(
            Identity.workspace_id == workspace_id,
            Identity.kind == NameKind.EXTERNAL.value,
            Identity.name == name,
            Identity.delivery_id.is_not(None),
            Identity.source_id.is_not(None),
        )
    ).first()
    if earlier is None:
        return
    _remember(
        session,
        {
            "source_id": earlier.source_id,
            "delivery_id": earlier.delivery_id,
            "workspace_id": workspace_id,
            "name": name,
            "body_sha256": earlier.body_sha256 or "",
            "received_at": earlier.created_at,
            "created": True,
        },
    )


def _retired(row: Recalled, why: str) -> Verdict:
    return Verdict(
        Ruling.RETIRED,
        row.task_id,
        f"{row.name.value!r} was {row.state.value} (task {row.task_id}): {why}",
    )


def record_created(
    session: Session,
    *,
    workspace_id: int,
    task_id: int,
    names: ItemNames,
    entrance: Entrance | None,
    now: datetime | None = None,
) -> bool:
    """Record the names of a task just inserted, in the insert's transaction,
    besides its own (its row holds those): the ids a move it announces left,
    as its aliases.

    A name the ledger holds as deleted or released is taken over; a name a
    live task answers to is not. Returns False when one was (a rival create
    took it since the lookup): the caller rolls back and looks again.
    """
    now = now or utcnow()
    dialect = session.get_bind().dialect.name
    for old in names.moved_from:
        if old == names.external_id:
            continue
        _keep_the_earlier_creator(session, workspace_id, old)
        taken = session.execute(
            record_statement(
                dialect,
                workspace_id=workspace_id,
                task_id=task_id,
                name=Name.external(old),
                is_alias=True,
                creator=Creator.of(entrance),
                now=now,
            )
        ).first()
        if taken is None:
            return False
    return True


@dataclass(frozen=True)
class Creator:
    """The delivery that created a task, as a ledger row keeps it: so that
    delivery never creates again, nor its body under another id."""

    source_id: int
    delivery_id: str
    body_sha256: str | None

    @classmethod
    def of(cls, entrance: Entrance | None) -> Creator | None:
        if entrance is None:
            return None
        return cls(entrance.source_id, entrance.delivery_id, entrance.body_sha256)


def record_statement(
    dialect: str,
    *,
    workspace_id: int,
    task_id: int,
    name: Name,
    is_alias: bool,
    creator: Creator | None,
    now: datetime,
    state: IdentityState = IdentityState.HELD,
    merge_id: int | None = None,
    created_at: datetime | None = None,
):
    """INSERT the name's row, or take over a freed one; RETURNING a row only
    when the name is now the task's."""
    insert = dialect_insert(dialect)
    values = {
        "workspace_id": workspace_id,
        "kind": name.kind.value,
        "name": name.value,
        "task_id": task_id,
        "state": state.value,
        "is_alias": is_alias,
        "source_id": creator.source_id if creator else None,
        "delivery_id": creator.delivery_id if creator else None,
        "body_sha256": creator.body_sha256 if creator else None,
        "merge_id": merge_id,
        "created_at": created_at or now,
        "changed_at": now,
    }
    statement = insert(Identity).values(values)
    freed = Identity.state.in_([IdentityState.DELETED.value, IdentityState.RELEASED.value])
    set_ = {key: statement.excluded[key] for key in values}
    # A row taken over is the new task's from its creation; the task's own row keeps its time.
    set_["created_at"] = case((freed, statement.excluded.created_at), else_=Identity.created_at)
    return statement.on_conflict_do_update(
        index_elements=[Identity.workspace_id, Identity.kind, Identity.name],
        set_=set_,
        where=or_(freed, Identity.task_id == task_id),
    ).returning(Identity.task_id)


def remember_aliases(
    session: Session, *, workspace_id: int, names: ItemNames, known: Sequence[Recalled]
) -> None:
    """A create of ``names`` was Found on the task a ``known`` live row names:
    the names the ledger lacks become that task's aliases, in its state."""
    found = next(row for row in known if row.state.live)
    recorded = {row.name for row in known}
    dialect = session.get_bind().dialect.name
    for name in names.all():
        if name in recorded:
            continue
        session.execute(
            record_statement(
                dialect,
                workspace_id=workspace_id,
                task_id=found.task_id,
                name=name,
                is_alias=True,
                creator=None,
                now=utcnow(),
                state=found.state,
            )
        )


def unknown_to_the_ledger(workspace_id, external_id, stable_key):
    """SQL: neither name of a create, nor a rename of its external id, is in
    the ledger's ``identities`` -- the fast path's share of step 3
    (models.fastpath.plain_case), beside its lookup of the task holding the
    external id. A task holding the stable key is left to the tasks' unique
    index: a move is rare, and its insert then fails as a rival's would
    (``NAME_TAKEN``), and the general path finds that task."""
    return and_(
        ~select(Identity.task_id)
        .where(
            Identity.workspace_id == workspace_id,
            Identity.kind == sql_constant(NameKind.EXTERNAL.value),
            Identity.name == external_id,
        )
        .exists(),
        ~select(Identity.task_id)
        .where(
            Identity.workspace_id == workspace_id,
            Identity.kind == sql_constant(NameKind.STABLE.value),
            Identity.name == stable_key,
        )
        .exists(),
        ~select(IdentityPrefix.before)
        .where(
            IdentityPrefix.workspace_id == workspace_id,
            func.substr(external_id, 1, func.length(IdentityPrefix.after)) == IdentityPrefix.after,
        )
        .exists(),
    )


def task_became(
    session: Session, *, task: Task, state: IdentityState, external_id: str | None = None
) -> None:
    """The task is now ``state`` (archived, deleted or released), in the
    transaction of the change itself: its aliases follow it, and a task
    deleted or released gives up its own names, which the ledger keeps from
    then on. ``external_id``: the one a release has just cleared from its row."""
    now = utcnow()
    if state is not IdentityState.ARCHIVED:
        give_up_own_names(
            session, task=task, state=state, external_id=external_id or task.external_id, now=now
        )
    live = [IdentityState.HELD.value, IdentityState.ARCHIVED.value]
    session.execute(
        update(Identity)
        .where(Identity.task_id == task.id, Identity.state.in_(live))
        .values(state=state.value, changed_at=now)
        .execution_options(synchronize_session=False)
    )


def give_up_own_names(
    session: Session, *, task: Task, state: IdentityState, external_id: str | None, now: datetime
) -> None:
    """Write the task's own names -- ``external_id`` and its stable key --
    into the ledger in ``state``, with the delivery that created it, and
    clear the stable key from its row: a task deleted, released or merged
    into another (models/merges.py) answers to them no more by its row.

    A freed row of an earlier task is taken over, its creator kept first
    (:func:`_keep_the_earlier_creator`); a name another live task answers
    to stays that task's."""
    creator = None
    if task.created_by_delivery is not None:
        row = session.execute(
            select(Delivery.source_id, Delivery.delivery_id, Delivery.body_sha256).where(
                Delivery.id == task.created_by_delivery
            )
        ).first()
        # Gone after retention: retention kept it in identity_deliveries.
        creator = None if row is None else Creator(*row)
    dialect = session.get_bind().dialect.name
    for name in _own_names(external_id, task.stable_key):
        if name.kind is NameKind.EXTERNAL:
            _keep_the_earlier_creator(session, task.workspace_id, name.value)
        session.execute(
            record_statement(
                dialect,
                workspace_id=task.workspace_id,
                task_id=task.id,
                name=name,
                is_alias=False,
                creator=creator,
                now=now,
                state=state,
                created_at=task.created_at,
            )
        )
    if task.stable_key is not None:
        session.execute(
            update(Task)
            .where(Task.id == task.id)
            .values(stable_key=None)
            .execution_options(synchronize_session=False)
        )
        set_committed_value(task, "stable_key", None)


def take_back_own_names(session: Session, *, task: Task, names: Sequence[Name]) -> None:
    """``names`` are the task's own again (an undone merge): its row holds
    them, so their ledger rows go. The caller has checked no other task holds them."""
    for name in names:
        if name.kind is NameKind.STABLE:
            task.stable_key = name.value
        session.execute(
            delete(Identity).where(
                Identity.workspace_id == task.workspace_id,
                Identity.kind == name.kind.value,
                Identity.name == name.value,
                Identity.task_id == task.id,
            )
        )


def learn_move(session: Session, *, workspace_id: int, move: Move) -> str:
    """Record what ``move`` announces; a sentence saying what was learned.

    The new name becomes an alias of the task the old one names, in the old
    one's state (so a deleted item stays deleted under its new name). A
    repository rename is kept as a prefix. A name another task already
    answers to is left alone: two tasks for one item are an operator's to
    merge (models/merges.py).
    """
    if move.prefix:
        return _learn_prefix(session, workspace_id, move)
    # The first row a name recalls: a live task's own before a freed one.
    (before, *_) = recall(session, workspace_id, [move.before]) or (None,)
    if before is None:
        return f"nothing known as {move.before.value!r}; nothing to move"
    (after, *_) = recall(session, workspace_id, [move.after]) or (None,)
    if after is not None:
        if after.task_id == before.task_id:
            return f"{move.after.value!r} is already task {before.task_id}'s"
        if after.state.live:
            return (
                f"{move.after.value!r} is task {after.task_id}'s, {move.before.value!r} task "
                f"{before.task_id}'s: merge them if they are one item (taskhook identities merge)"
            )
    dialect = session.get_bind().dialect.name
    session.execute(
        record_statement(
            dialect,
            workspace_id=workspace_id,
            task_id=before.task_id,
            name=move.after,
            is_alias=True,
            creator=None,
            # The old name's own time: a delivery received after its release
            # is judged so under the new name too, whenever the move was learned.
            now=before.changed_at,
            state=before.state,
        )
    )
    return f"{move.after.value!r} is now an alias of task {before.task_id} ({before.state.value})"


def _learn_prefix(session: Session, workspace_id: int, move: Move) -> str:
    earlier = session.get(IdentityPrefix, (workspace_id, move.before.value))
    # A second rename (a → b, then b → c) points c at a, where the names live.
    before = earlier.before if earlier is not None else move.before.value
    dialect = session.get_bind().dialect.name
    insert = dialect_insert(dialect)
    statement = insert(IdentityPrefix).values(
        workspace_id=workspace_id, after=move.after.value, before=before, learned_at=utcnow()
    )
    session.execute(
        statement.on_conflict_do_update(
            index_elements=[IdentityPrefix.workspace_id, IdentityPrefix.after],
            set_={"before": statement.excluded.before, "learned_at": statement.excluded.learned_at},
        )
    )
    return f"external ids beginning {move.after.value!r} are the ones beginning {before!r}"


def task_called(session: Session, workspace_id: int, name: Name) -> int | None:
    """The id of the task in the workspace that answers to ``name``, or None.

    Every lookup surface asks this one function (docs/contract.md §15, item 9):
    the task holding it as its own -- the basic contract's lookup, for an
    external id -- or the one it is a live alias of (a move's, a merge's), or
    a name before a learned repository rename. A deleted or released name
    answers nothing.
    """
    for row in recall(session, workspace_id, [name]):
        if row.state.live:
            return row.task_id
    return None


@dataclass(frozen=True)
class NameView:
    """One of a task's names, as every surface shows it."""

    kind: str
    name: str
    state: str
    #: Not the name the task was created under: a move's, or a merge's.
    alias: bool


def names_shown(session: Session, task_ids: Iterable[int]) -> dict[int, list[NameView]]:
    """:func:`names_of`, as plain values: each task's names, its own first."""
    return {
        task_id: [NameView(row.kind, row.name, row.state, row.alias) for row in rows]
        for task_id, rows in names_of(session, task_ids).items()
    }


@dataclass(frozen=True)
class LedgerRow:
    """One name of a task and what became of it: a task's own name read from
    its row, or a row of ``identities``."""

    task_id: int
    kind: str
    name: str
    state: str
    alias: bool
    #: The operator merge that made it an alias (models/merges.py), if one did.
    merge_id: int | None
    changed_at: datetime


def list_names(
    session: Session, *, workspace_id: int | None = None, task_id: int | None = None, limit: int
) -> list[LedgerRow]:
    """The ledger's names of a workspace or of a task, by task, its own names first
    (``taskhook identities list``)."""
    return _ledger_rows(
        session,
        workspace_id=workspace_id,
        task_ids=None if task_id is None else [task_id],
        limit=limit,
    )


def names_of(session: Session, task_ids: Iterable[int]) -> dict[int, list[LedgerRow]]:
    """Each task's names in the ledger, its own first, then its aliases."""
    ids = list(task_ids)
    found: dict[int, list[LedgerRow]] = {task_id: [] for task_id in ids}
    if ids:
        for row in _ledger_rows(session, task_ids=ids):
            found[row.task_id].append(row)
    return found


def _ledger_rows(
    session: Session,
    *,
    workspace_id: int | None = None,
    task_ids: list[int] | None = None,
    limit: int | None = None,
) -> list[LedgerRow]:
    """The ledger as one table: the tasks' own names, and ``identities``."""
    state = case(
        (Task.archived_at.is_(None), literal(IdentityState.HELD.value)),
        else_=literal(IdentityState.ARCHIVED.value),
    )
    parts = [
        select(
            Task.id.label("task_id"),
            literal(kind.value).label("kind"),
            column.label("name"),
            state.label("state"),
            false().label("alias"),
            cast(null(), Integer).label("merge_id"),
            func.coalesce(Task.archived_at, Task.created_at).label("changed_at"),
        ).where(
            column.is_not(None),
            *([] if workspace_id is None else [Task.workspace_id == workspace_id]),
            *([] if task_ids is None else [Task.id.in_(task_ids)]),
        )
        for kind, column in _OWN_COLUMN.items()
    ]
    parts.append(
        select(
            Identity.task_id,
            Identity.kind,
            Identity.name,
            Identity.state,
            Identity.is_alias.label("alias"),
            Identity.merge_id,
            Identity.changed_at,
        ).where(
            *([] if workspace_id is None else [Identity.workspace_id == workspace_id]),
            *([] if task_ids is None else [Identity.task_id.in_(task_ids)]),
        )
    )
    ledger = union_all(*parts).subquery("ledger")
    query = select(ledger).order_by(ledger.c.task_id, ledger.c.alias, ledger.c.kind, ledger.c.name)
    if limit is not None:
        query = query.limit(limit)
    return [
        LedgerRow(
            row.task_id,
            row.kind,
            row.name,
            row.state,
            bool(row.alias),
            row.merge_id,
            row.changed_at,
        )
        for row in session.execute(query)
    ]
