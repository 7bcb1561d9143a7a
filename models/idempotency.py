"""Retry-safe changes: an ``Idempotency-Key`` kept with the change it made.

A create is safe to retry because its external id is its key. Every other
change (a release, an archive, a delete, a merge ...) takes a key here: the
surface builds a :class:`KeyedRequest` -- who asks (the actor), the key, and
everything that makes two requests the same -- and runs the change through
:func:`run_once` in one transaction:

1. The key row is inserted first (``ON CONFLICT DO NOTHING``), so of two
   concurrent retries one inserts and acts; the other's insert waits for it
   (PostgreSQL waits on the unique index; SQLite has one writer) and then
   finds its committed row.
2. A row found within its window with the same fingerprint is a retry: its
   receipt comes back and nothing is done again. Another fingerprint -- another
   actor, action, target, body or guard -- is a different request under a
   used key: :class:`IdempotencyKeyReused`, which says nothing of the first
   (a key is one actor's, for one target: another's is never replayed to it).
3. A row past its window is forgotten: deleted, and the request is new.
4. Otherwise the change runs, and its receipt is written into the row: the
   event it appended (the committed event *is* the receipt), or a status and
   an answer when it appended none.

The row commits with the change or not at all: a refused change keeps no key,
and a retry of it is judged afresh. A change whose answer was lost after the
commit finds its row on the retry; its event was appended once.

The target is spelled one way per thing (a task by id, an identity by its
normalized external id), so two spellings of one request fingerprint alike;
a retry never resolves the target again, so one after a move still replays.
Whether the caller may still see what the receipt names is the surface's
question, asked again on every replay (:class:`Receipt` says what to ask).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from models.errors import (
    IdempotencyKeyBusy,
    IdempotencyKeyReused,
    InvalidIdempotencyKey,
    StaleRevision,
)
from models.statements import dialect_insert
from models.tables import IdempotencyKey, Task, TaskEvent, utcnow

#: The longest key a row keeps (a UUID is 36).
MAX_KEY_LENGTH = 255
#: How often a claim is tried while its row keeps vanishing (pruned between
#: the insert and the read); more than two means something is wrong.
_CLAIM_ATTEMPTS = 3
#: The common window: a retry a day later still replays.
DEFAULT_WINDOW = timedelta(hours=24)


def checked_key(raw: object) -> str | None:
    """``raw`` as a key, or None when none was sent. Raises
    :class:`InvalidIdempotencyKey` for one no row can keep: empty, longer than
    :data:`MAX_KEY_LENGTH`, or with characters other than visible ASCII."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise InvalidIdempotencyKey("Idempotency-Key must be text")
    key = raw.strip()
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise InvalidIdempotencyKey(f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters")
    if not all("!" <= character <= "~" for character in key):
        raise InvalidIdempotencyKey(
            "Idempotency-Key must be visible ASCII characters, without spaces"
        )
    return key


@dataclass(frozen=True)
class KeyedRequest:
    """Everything that makes two requests the same, under one actor's key."""

    actor: str
    key: str
    #: The change, as ``METHOD /route/{template}`` (never the spelling sent).
    action: str
    #: The thing changed, spelled one way: ``task 42``, ``identity 3/jira:X-1``.
    target: str
    body: Mapping[str, object] = field(default_factory=dict)
    #: What the caller saw (a revision, an expected holder), or None.
    guard: str | None = None

    def fingerprint(self) -> str:
        canonical = json.dumps(
            [self.actor, self.action, self.target, dict(self.body), self.guard],
            sort_keys=True,
            separators=(",", ":"),
            default=str,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Receipt:
    """What a change did: the answer a retry gets back.

    ``event`` is the committed event when the change appended one (its
    workspace and task say where the caller must still see); ``status`` and
    ``answer`` are the surface's own words otherwise. ``replayed`` is true on
    a retry."""

    status: int
    workspace_id: int | None = None
    task_id: int | None = None
    event: TaskEvent | None = None
    answer: dict | None = None
    replayed: bool = False


def run_once(
    *,
    session: Session,
    request: KeyedRequest,
    change: Callable[[], Receipt],
    window: timedelta = DEFAULT_WINDOW,
    now: datetime | None = None,
) -> Receipt:
    """``change()`` once per key: its receipt, or the first run's on a retry.

    The caller commits (the key row goes with the change). Raises
    :class:`IdempotencyKeyReused` for another request under a used key, and
    whatever ``change`` raises (then nothing of the key is kept)."""
    now = now or utcnow()
    fingerprint = request.fingerprint()
    row_id = _claim(session, request, fingerprint, now + window)
    for _attempt in range(_CLAIM_ATTEMPTS):
        if row_id is not None:
            break
        found = _row(session, request)
        if found is None:
            # Deleted meanwhile (pruned, or a concurrent forget): try again.
            row_id = _claim(session, request, fingerprint, now + window)
            continue
        if found.expires_at > now:
            if found.fingerprint != fingerprint:
                raise IdempotencyKeyReused(request.key)
            return _receipt_of(session, found)
        # Past its window: forgotten, and this request is a new one.
        session.execute(
            delete(IdempotencyKey).where(
                IdempotencyKey.id == found.id, IdempotencyKey.expires_at <= now
            )
        )
        row_id = _claim(session, request, fingerprint, now + window)
    if row_id is None:
        raise IdempotencyKeyBusy(request.key)
    receipt = change()
    session.execute(
        update(IdempotencyKey)
        .where(IdempotencyKey.id == row_id)
        .values(
            status=receipt.status,
            workspace_id=receipt.workspace_id,
            task_id=receipt.task_id,
            event_id=receipt.event.id if receipt.event is not None else None,
            answer=receipt.answer,
        )
        .execution_options(synchronize_session=False)
    )
    return receipt


def _claim(
    session: Session, request: KeyedRequest, fingerprint: str, expires_at: datetime
) -> int | None:
    """Insert the key's row; its id, or None when a row for the key exists
    (on PostgreSQL, after waiting for a concurrent insert's transaction)."""
    insert = dialect_insert(session.get_bind().dialect.name)
    return session.execute(
        insert(IdempotencyKey)
        .values(
            actor=request.actor,
            key=request.key,
            fingerprint=fingerprint,
            target=request.target,
            created_at=utcnow(),
            expires_at=expires_at,
        )
        .on_conflict_do_nothing(index_elements=[IdempotencyKey.key])
        .returning(IdempotencyKey.id)
    ).scalar_one_or_none()


def _row(session: Session, request: KeyedRequest) -> IdempotencyKey | None:
    return session.scalars(
        select(IdempotencyKey)
        .where(IdempotencyKey.key == request.key)
        .execution_options(populate_existing=True)
    ).one_or_none()


def _receipt_of(session: Session, row: IdempotencyKey) -> Receipt:
    event = session.get(TaskEvent, row.event_id) if row.event_id is not None else None
    return Receipt(
        status=row.status or 200,
        workspace_id=event.workspace_id if event is not None else row.workspace_id,
        task_id=event.task_id if event is not None else row.task_id,
        event=event,
        answer=row.answer,
        replayed=True,
    )


def receipt_under_key(
    *,
    session: Session,
    request: KeyedRequest,
    guard_of: Callable[[Receipt], str | None] | None = None,
    now: datetime | None = None,
) -> Receipt | None:
    """The receipt of ``request``'s key while the key is in its window, or
    None. For a surface that decides before it changes anything -- the CLI
    asks before it acts, and its release is made by the operator worker -- so
    that a run again under a used key answers what the first run did instead
    of asking again. Raises :class:`IdempotencyKeyReused` when the key was
    another request's, as :func:`run_once` does.

    ``guard_of`` is for a guard the caller does not repeat: the CLI's release
    guards with the holder it showed, and a committed release has freed the
    identity, so a run again compares everything else and takes the guard
    the first run sent from its receipt."""
    row = _row(session, request)
    if row is None or row.expires_at <= (now or utcnow()) or row.status is None:
        return None
    receipt = _receipt_of(session, row)
    if guard_of is not None:
        request = replace(request, guard=guard_of(receipt))
    if row.fingerprint != request.fingerprint():
        raise IdempotencyKeyReused(request.key)
    return receipt


def latest_event(session: Session, *, task_id: int, type: str) -> TaskEvent | None:
    """The task's newest event of ``type``: inside the change's transaction,
    the one the change just appended (its row lock keeps out another)."""
    return session.scalars(
        select(TaskEvent)
        .where(TaskEvent.task_id == task_id, TaskEvent.type == type)
        .order_by(TaskEvent.id.desc())
        .limit(1)
    ).one_or_none()


def prune_expired(*, session: Session, now: datetime | None = None, limit: int = 1000) -> int:
    """Delete up to ``limit`` key rows past their window; how many. A lookup
    already treats them as gone: this only keeps the table small."""
    now = now or utcnow()
    ids = list(
        session.scalars(
            select(IdempotencyKey.id).where(IdempotencyKey.expires_at <= now).limit(limit)
        )
    )
    if ids:
        session.execute(delete(IdempotencyKey).where(IdempotencyKey.id.in_(ids)))
    return len(ids)


# --- the guard of an archive or a delete: the task's revision --------------------------


def task_revision(task: Task) -> str:
    """The task's revision as an entity tag (``"r1-<16 hex>"``): a digest of
    every column a change writes, so it changes with every change -- an
    edit, an archive, a settlement, a release, a move of its names -- which
    ``updated_at`` alone does not (a settlement and a release leave it)."""
    state = [
        task.id,
        task.workspace_id,
        task.step_id,
        task.identifier,
        task.title,
        task.description,
        task.archived_at.isoformat() if task.archived_at else None,
        task.updated_at.isoformat() if task.updated_at else None,
        task.external_id,
        task.external_id_settled_at.isoformat() if task.external_id_settled_at else None,
        task.stable_key,
    ]
    digest = hashlib.sha256(json.dumps(state, default=str).encode()).hexdigest()
    return f'"r1-{digest[:16]}"'


def checked_if_match(raw: object) -> str | None:
    """An ``If-Match`` value as the guard keeps it: None when none was
    sent; ``*`` (any revision, the task must exist) or entity tags, weak
    ones taken as strong. Raises :class:`InvalidIdempotencyKey` for one that
    is not a list of quoted tags."""
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidIdempotencyKey("If-Match must be * or a quoted revision")
    tags = [part.strip().removeprefix("W/") for part in raw.split(",")]
    if tags == ["*"]:
        return "*"
    if any(len(tag) < 2 or not (tag.startswith('"') and tag.endswith('"')) for tag in tags):
        raise InvalidIdempotencyKey("If-Match must be * or a quoted revision (as ETag gives it)")
    if len(raw) > MAX_KEY_LENGTH:
        raise InvalidIdempotencyKey(f"If-Match must be at most {MAX_KEY_LENGTH} characters")
    return ", ".join(tags)


def check_revision(task: Task, guard: str | None) -> None:
    """Raise :class:`StaleRevision` unless ``guard`` (from
    :func:`checked_if_match`) names the task's current revision."""
    if guard is None or guard == "*":
        return
    current = task_revision(task)
    if current not in guard.split(", "):
        raise StaleRevision(task.id, guard, current)


# --- what every surface sends --------------------------------------------------------------


class Action:
    """The changes a key can be sent with, one name each whatever the surface:
    a key sent over REST and again over MCP or the console for the same
    request replays (the action, not the route, is fingerprinted)."""

    MERGE = "task.merge"
    ARCHIVE = "task.archive"
    DELETE = "task.delete"
    RELEASE = "identity.release"
    # The changes whose receipt is what they answered (no event of their own):
    UNMERGE = "merge.undo"
    REPLAY = "delivery.replay"
    BULK_REPLAY = "deliveries.bulk_replay"
    ROTATE_SECRET = "source.rotate"
    FINISH_ROTATION = "source.finish_rotation"
    REVOKE_TOKEN = "token.revoke"


@dataclass(frozen=True)
class Retry:
    """Who sends the key, the key (None: no key, the change runs as sent),
    and how long it is kept."""

    actor: str
    key: str | None
    window: timedelta = DEFAULT_WINDOW

    @classmethod
    def of(cls, actor: str, key: object, window: timedelta = DEFAULT_WINDOW) -> Retry:
        """Raises :class:`InvalidIdempotencyKey` for a key no row can keep."""
        return cls(actor=actor, key=checked_key(key), window=window)


def token_actor(token_id: int) -> str:
    """The actor of a token's requests, whichever surface it uses."""
    return f"token:{token_id}"


def cli_actor(operator: str) -> str:
    """The actor of an operator's CLI commands (the name they run under)."""
    return f"cli:{operator}"


def keyed(retry: Retry | None, action: str, target: str, body: dict, guard) -> KeyedRequest:
    """The request a surface sends under ``retry``'s key (none: an empty key)."""
    return KeyedRequest(
        actor=retry.actor if retry else "",
        key=(retry.key or "") if retry else "",
        action=action,
        target=target,
        body=body,
        guard=None if guard is None else str(guard),
    )


def answered_once(
    session: Session,
    retry: Retry | None,
    *,
    action: str,
    target: str,
    body: Mapping[str, object],
    work: Callable[[], dict[str, Any]],
) -> tuple[dict[str, Any], bool]:
    """``work()``'s answer, once per key, and whether this was a retry -- which
    gets the first answer, and must not repeat what followed the commit (a
    message sent, a secret shown). For the changes whose receipt is what they
    answered: an unmerge, a replay, a rotation, a revocation."""
    if retry is None or retry.key is None:
        return work(), False
    receipt = run_once(
        session=session,
        request=keyed(retry, action, target, body, None),
        change=lambda: Receipt(status=200, answer=work()),
        window=retry.window,
    )
    return dict(receipt.answer or {}), receipt.replayed


def answered_before(
    session: Session,
    retry: Retry | None,
    *,
    action: str,
    target: str,
    body: Mapping[str, object],
) -> dict[str, Any] | None:
    """What a run under ``retry``'s key answered, when that run committed;
    for the CLI, which shows and asks before it acts, and answers a run again
    without asking. Raises ``IdempotencyKeyReused`` when the key was another
    request's."""
    if retry is None or retry.key is None:
        return None
    receipt = receipt_under_key(session=session, request=keyed(retry, action, target, body, None))
    return None if receipt is None else dict(receipt.answer or {})
