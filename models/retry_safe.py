"""The retry-safe forms of the changes every surface offers: archive,
delete and release, each with a guard and, when the caller sends one, an
``Idempotency-Key`` (models/idempotency.py).

REST, MCP, the CLI and the console call these, so a key means the same on
each: a key sent over REST and again over MCP for the same request replays
(the action, not the route, is fingerprinted; the actor is the token).

A replay answers as a fresh request would where the caller's view changed:
it asks the caller's scope *now*, and the task's current state -- an archive
replayed after the task was deleted, or through a token that lost its
workspace, is 404, as a fresh archive is (docs/contract.md, "Retries of
everything that is not a create").
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from models import merges
from models.access import Caller
from models.errors import TaskNotFound, WorkspaceNotAccessible
from models.events import EventType
from models.external_id import normalize_external_id
from models.idempotency import (
    Action,
    KeyedRequest,
    Receipt,
    Retry,
    answered_once,
    check_revision,
    checked_if_match,
    keyed,
    latest_event,
    receipt_under_key,
    run_once,
)
from models.tables import IdentityRelease, Task
from models.tasks import (
    archive_task,
    delete_task,
    get_task,
    held_until_commit,
    release_external_id,
)


def _once(session: Session, retry: Retry | None, request: KeyedRequest, change) -> Receipt:
    if retry is None or retry.key is None:
        return change()
    return run_once(session=session, request=request, change=change, window=retry.window)


def _locked_at_revision(session: Session, caller: Caller, task_id: int, guard: str | None) -> Task:
    """The task, visible to ``caller``, held until commit, at ``guard``'s revision."""
    get_task(session=session, caller=caller, task_id=task_id)
    task = held_until_commit(session, task_id)
    if task is None:
        raise TaskNotFound()
    check_revision(task, guard)
    return task


def archive(
    *,
    session: Session,
    caller: Caller,
    task_id: int,
    if_match: object = None,
    retry: Retry | None = None,
) -> tuple[Task, Receipt]:
    """Archive the task unless it changed since ``if_match``; the task as it
    is now, and the receipt. A replay reads the task again as ``caller``."""
    guard = checked_if_match(if_match)

    def change() -> Receipt:
        task = _locked_at_revision(session, caller, task_id, guard)
        was_archived = task.archived_at is not None
        archive_task(session=session, caller=caller, task_id=task_id)
        event = (
            None
            if was_archived
            else latest_event(session, task_id=task_id, type=EventType.ARCHIVED)
        )
        return Receipt(status=200, workspace_id=task.workspace_id, task_id=task_id, event=event)

    receipt = _once(
        session, retry, keyed(retry, Action.ARCHIVE, f"task {task_id}", {}, guard), change
    )
    # Fresh or replayed, the answer is the task as the caller may see it now.
    return get_task(session=session, caller=caller, task_id=task_id), receipt


def delete(
    *,
    session: Session,
    caller: Caller,
    task_id: int,
    if_match: object = None,
    retry: Retry | None = None,
) -> Receipt:
    """Delete the task unless it changed since ``if_match``. A replay answers
    the first delete's receipt while ``caller`` may still see the workspace
    the task was in, and as a fresh delete (not found) once it may not."""
    guard = checked_if_match(if_match)

    def change() -> Receipt:
        task = _locked_at_revision(session, caller, task_id, guard)
        workspace_id = task.workspace_id
        delete_task(session=session, caller=caller, task_id=task_id)
        event = latest_event(session, task_id=task_id, type=EventType.DELETED)
        return Receipt(status=204, workspace_id=workspace_id, task_id=task_id, event=event)

    receipt = _once(
        session, retry, keyed(retry, Action.DELETE, f"task {task_id}", {}, guard), change
    )
    if receipt.replayed and not caller.may_access(receipt.workspace_id or 0):
        raise TaskNotFound()
    return receipt


def release_target(workspace_id: int, normalized_external_id: str | None) -> str:
    """A release's target, one spelling per identity."""
    return f"identity {workspace_id}/{normalized_external_id}"


def release(
    *,
    session: Session,
    caller: Caller,
    workspace_id: int,
    external_id: object,
    operator: str,
    reason: str,
    expected_task_id: int | None = None,
    retry: Retry | None = None,
) -> Receipt:
    """Release the identity (``models.tasks.release_external_id``; the guard
    is ``expected_task_id``). The target is the workspace and the normalized
    external id, never resolved again: a retry after the identity was freed,
    or after its task gained an alias, replays the first release."""
    if not caller.may_access(workspace_id):
        raise WorkspaceNotAccessible(workspace_id)
    normalized = normalize_external_id(external_id)

    def change() -> Receipt:
        audit = release_external_id(
            session=session,
            workspace_id=workspace_id,
            external_id=external_id,
            operator=operator,
            reason=reason,
            expected_task_id=expected_task_id,
        )
        event = latest_event(session, task_id=audit.task_id, type=EventType.IDENTITY_RELEASED)
        # The audit row, for the surfaces that answer with it (the CLI's worker).
        answer = {"audit_id": audit.id}
        return Receipt(
            status=204, workspace_id=workspace_id, task_id=audit.task_id, event=event, answer=answer
        )

    request = release_request(retry, workspace_id, normalized, reason, expected_task_id)
    return _once(session, retry, request, change)


def release_request(
    retry: Retry | None,
    workspace_id: int,
    normalized_external_id: str | None,
    reason: str,
    expected_task_id: int | None,
) -> KeyedRequest:
    """What makes two releases the same request."""
    return keyed(
        retry,
        Action.RELEASE,
        release_target(workspace_id, normalized_external_id),
        {"reason": (reason or "").strip()},
        expected_task_id,
    )


def released_under_key(
    session: Session, retry: Retry, workspace_id: int, external_id: object, reason: str
) -> Receipt | None:
    """The release a run under ``retry``'s key made of the identity, or None;
    for the CLI, which asks before it sends. The guard is the holder that
    run showed (read from its audit row): the operator never typed it, and
    the release freed it. Raises ``IdempotencyKeyReused`` when the key was
    another request's."""
    if retry.key is None:
        return None
    request = release_request(retry, workspace_id, normalize_external_id(external_id), reason, None)

    def guard_sent(receipt: Receipt) -> str | None:
        audit = session.get(IdentityRelease, (receipt.answer or {}).get("audit_id"))
        expected = audit.expected_task_id if audit is not None else None
        return None if expected is None else str(expected)

    return receipt_under_key(session=session, request=request, guard_of=guard_sent)


def merge_target(into_task_id: int) -> str:
    """A merge's target: the task that keeps its names."""
    return f"task {into_task_id}"


def merge_request(
    retry: Retry | None, into_task_id: int, from_task_id: int, reason: str
) -> KeyedRequest:
    """What makes two merges the same request."""
    body = {"from": from_task_id, "reason": (reason or "").strip()}
    return keyed(retry, Action.MERGE, merge_target(into_task_id), body, None)


def merge(
    *,
    session: Session,
    caller: Caller,
    into_task_id: int,
    from_task_id: int,
    operator: str,
    reason: str,
    retry: Retry | None = None,
) -> tuple[merges.MergeView, Receipt]:
    """Merge (``models.merges.merge``) once per key. The merge as ``caller``
    may see it now: a replay for a caller no longer scoped to the workspace
    is :class:`MergeNotFound`, as a fresh look at it is."""

    def change() -> Receipt:
        done = merges.merge(
            session=session,
            caller=caller,
            into_task_id=into_task_id,
            from_task_id=from_task_id,
            operator=operator,
            reason=reason,
        )
        return Receipt(
            status=200,
            workspace_id=done.workspace_id,
            task_id=into_task_id,
            answer={"merge_id": done.id},
        )

    request = merge_request(retry, into_task_id, from_task_id, reason)
    receipt = _once(session, retry, request, change)
    merge_id = (receipt.answer or {}).get("merge_id")
    return merges.get_merge(session=session, caller=caller, merge_id=merge_id), receipt


def merged_under_key(
    session: Session,
    caller: Caller,
    retry: Retry,
    *,
    into_task_id: int,
    from_task_id: int,
    reason: str,
) -> merges.MergeView | None:
    """The merge a run under ``retry``'s key made, or None; for the CLI, which
    shows a plan and asks before it merges (and whose plan a committed merge
    has made impossible). Raises ``IdempotencyKeyReused`` when the key was
    another request's."""
    if retry.key is None:
        return None
    request = merge_request(retry, into_task_id, from_task_id, reason)
    receipt = receipt_under_key(session=session, request=request)
    if receipt is None:
        return None
    merge_id = (receipt.answer or {}).get("merge_id")
    return merges.get_merge(session=session, caller=caller, merge_id=merge_id)


def unmerge(
    *,
    session: Session,
    caller: Caller,
    merge_id: int,
    operator: str,
    reason: str,
    retry: Retry | None = None,
) -> tuple[merges.MergeView, bool]:
    """Undo the merge (``models.merges.unmerge``) once per key: the merge as
    ``caller`` may see it now, and whether this was a retry. Another
    workspace's merge is not found, replayed or not."""
    merges.get_merge(session=session, caller=caller, merge_id=merge_id)

    def work() -> dict[str, Any]:
        merges.unmerge(
            session=session, caller=caller, merge_id=merge_id, operator=operator, reason=reason
        )
        return {"merge_id": merge_id}

    _answer, replayed = answered_once(
        session,
        retry,
        action=Action.UNMERGE,
        target=f"merge {merge_id}",
        body={"reason": (reason or "").strip()},
        work=work,
    )
    return merges.get_merge(session=session, caller=caller, merge_id=merge_id), replayed


def release_answer(session: Session, receipt: Receipt) -> dict[str, Any]:
    """What a release answers, from its receipt: the audit row it wrote. Here,
    not in the operator worker, so that the CLI answers from it without
    importing Celery."""
    audit = session.get(IdentityRelease, (receipt.answer or {}).get("audit_id"))
    if audit is None:  # no audit row under the receipt: say what the key kept
        return {"released": True, "replayed": receipt.replayed, "task_id": receipt.task_id}
    task = session.get(Task, audit.task_id)
    return {
        "released": True,
        "replayed": receipt.replayed,
        "workspace_id": audit.workspace_id,
        "external_id": audit.external_id,
        "task_id": audit.task_id,
        "expected_task_id": audit.expected_task_id,
        "identifier": task.identifier if task is not None else None,
        "audit_id": audit.id,
        "operator": audit.operator,
        "reason": audit.reason,
        "released_at": audit.released_at.isoformat(),
    }
