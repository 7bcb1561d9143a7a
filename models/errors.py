"""The domain's errors, all of them: one home, one kind each.

Every error is a :class:`TaskStoreError` and declares its :class:`ErrorKind`.
Each surface maps the kind to its answer once -- REST (a status code,
``ingest.rest``), MCP (a tool error, ``ingest.mcp``), the CLI (a one-line
refusal, ``worker.cli.runtime``) -- and none of them is a crash. A refused
delivery also says which :class:`RefusalKind` it is, which the webhook routes
answer once (``ingest.webhooks``). The worker decides a delivery's ending by
the class itself (``worker.processing``), so the classes stay as fine as its
table needs.
"""

from __future__ import annotations

import enum
from typing import ClassVar, Protocol


class ErrorKind(enum.Enum):
    """What a refusal means to the caller, whatever the surface."""

    #: What the request names does not exist -- or the caller may not see it
    #: (one answer for both, so a caller learns nothing about other tenants).
    NOT_FOUND = "not_found"
    #: The request itself is wrong; sent again unchanged, it fails again.
    INVALID = "invalid"
    #: The request is well formed, but the store's current state refuses it:
    #: a full WIP step, a holder that changed, a delivery not in a replayable
    #: state, a lease a newer attempt took over.
    CONFLICT = "conflict"
    #: The caller may see what the request names, but its role may not do
    #: this there (a member's delete where the workspace reserves deletes to
    #: operators). Sent again with an operator's token, it succeeds.
    FORBIDDEN = "forbidden"
    #: The store's own setup is wrong (a workspace without workflow steps):
    #: not the caller's mistake, and only an operator can fix it.
    MISCONFIGURED = "misconfigured"
    #: The caller's guard (``If-Match``: the revision it saw) names a state
    #: the target has left: nothing was changed. Read it again, then decide.
    STALE = "stale"


class RefusalKind(enum.Enum):
    """Why the intake (``models.intake``) refuses a delivery: finer than its
    :class:`ErrorKind` (invalid, every one), so that the webhook routes
    answer each kind once (``ingest.webhooks.ANSWER_OF_REFUSAL``)."""

    #: The delivery cannot be read or kept as sent: a body the provider
    #: cannot decode, no event, a delivery id or an event the row cannot hold.
    MALFORMED = "malformed"
    #: A content type the provider does not send, or one the row cannot hold.
    UNSUPPORTED_CONTENT_TYPE = "unsupported_content_type"
    #: Sent longer ago than any retry of its sender: a captured body, resent.
    TOO_OLD = "too_old"


class TaskStoreError(Exception):
    """Base class; ``str(error)`` is safe to show the caller.

    Every subclass names its ``kind`` (tests/unit/test_errors.py checks)."""

    kind: ClassVar[ErrorKind]


# --- not found -------------------------------------------------------------------------


class WorkspaceNotAccessible(TaskStoreError, LookupError):
    """The workspace does not exist, or the caller may not see it (one answer for both)."""

    kind = ErrorKind.NOT_FOUND

    def __init__(self, workspace_id: object) -> None:
        super().__init__(f"workspace {workspace_id} not found")
        self.workspace_id = workspace_id


class TaskNotFound(TaskStoreError, LookupError):
    kind = ErrorKind.NOT_FOUND

    def __init__(self, what: str = "task not found") -> None:
        super().__init__(what)


class DeliveryNotFound(TaskStoreError, LookupError):
    kind = ErrorKind.NOT_FOUND

    def __init__(self, delivery_pk: int) -> None:
        super().__init__(f"delivery {delivery_pk} not found")


class SourceNotFound(TaskStoreError, LookupError):
    kind = ErrorKind.NOT_FOUND

    def __init__(self, slug: str) -> None:
        super().__init__(f"no webhook source named {slug!r}")


class TokenNotFound(TaskStoreError, LookupError):
    """No such token, or one the caller may not manage (one answer for both)."""

    kind = ErrorKind.NOT_FOUND

    def __init__(self, token_id: int) -> None:
        super().__init__(f"no token with id {token_id}")


class OperationNotFound(TaskStoreError, LookupError):
    kind = ErrorKind.NOT_FOUND

    def __init__(self, operation_id: int) -> None:
        super().__init__(f"operation {operation_id} not found")


class MergeNotFound(TaskStoreError, LookupError):
    kind = ErrorKind.NOT_FOUND

    def __init__(self, merge_id: object) -> None:
        super().__init__(f"merge {merge_id} not found")
        self.merge_id = merge_id


# --- invalid ---------------------------------------------------------------------------


class InvalidTask(TaskStoreError, ValueError):
    """Create-time validation failed (a missing title, say)."""

    kind = ErrorKind.INVALID


class InvalidRelease(TaskStoreError, ValueError):
    """A release without an operator or a reason, or with one the audit row
    cannot keep as given (too long, control characters)."""

    kind = ErrorKind.INVALID


class InvalidSource(TaskStoreError, ValueError):
    kind = ErrorKind.INVALID


class InvalidWorkspace(TaskStoreError, ValueError):
    kind = ErrorKind.INVALID


class InvalidToken(TaskStoreError, ValueError):
    kind = ErrorKind.INVALID


class InvalidFilter(TaskStoreError, ValueError):
    """A delivery filter that cannot be applied: an unknown status, an empty
    or reversed time range, a search longer than any key it could match."""

    kind = ErrorKind.INVALID


class InvalidOperation(TaskStoreError, ValueError):
    """A bulk operation without a usable name or operator, or with an
    impossible expected count."""

    kind = ErrorKind.INVALID


class InvalidMerge(TaskStoreError, ValueError):
    """A merge that can never be made as asked: a task into itself, tasks of
    two workspaces, no operator or reason (models/merges.py)."""

    kind = ErrorKind.INVALID


class InvalidIdempotencyKey(TaskStoreError, ValueError):
    """An ``Idempotency-Key`` or a guard no key row can keep (models/idempotency.py)."""

    kind = ErrorKind.INVALID


class InvalidExternalId(TaskStoreError, ValueError):
    """The external id is malformed; ``reason`` is safe to show the caller.

    One subclass per rule of ``models.external_id.normalize_external_id``."""

    kind = ErrorKind.INVALID

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ExternalIdHasControlCharacter(InvalidExternalId):
    def __init__(self, position: int, code_point: int) -> None:
        super().__init__(
            f"external_id must not contain control characters "
            f"(U+{code_point:04X} at position {position})"
        )


class ExternalIdTooLong(InvalidExternalId):
    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"external_id must be at most {limit} bytes of UTF-8 (got {length})")


class ExternalIdNotText(InvalidExternalId):
    def __init__(self, kind: str) -> None:
        super().__init__(f"external_id must be a string of Unicode text (got {kind})")


class DeliveryRefused(TaskStoreError, ValueError):
    """A delivery the inbox will not take as sent, and why (``refusal``);
    nothing is stored. Sent again unchanged, it is refused again."""

    kind = ErrorKind.INVALID

    def __init__(self, refusal: RefusalKind, reason: str) -> None:
        super().__init__(reason)
        self.refusal = refusal


# --- conflict --------------------------------------------------------------------------


class WipLimitReached(TaskStoreError):
    """The workspace's intake step is at its work-in-progress limit."""

    kind = ErrorKind.CONFLICT

    def __init__(self, step_name: str, wip_limit: int) -> None:
        super().__init__(f"step {step_name!r} is at its WIP limit of {wip_limit}")
        self.step_name = step_name
        self.wip_limit = wip_limit


class HolderChanged(TaskStoreError):
    """A release named the holder it expected, and another task holds the
    identity now: nothing was released."""

    kind = ErrorKind.CONFLICT

    def __init__(
        self,
        expected_task_id: int,
        current_task_id: int,
        identifier: str,
        expected_identifier: str | None = None,
    ) -> None:
        # Identifiers for people, ids for the REST routes that take them.
        expected = (
            f"{expected_identifier} (id {expected_task_id})"
            if expected_identifier
            else (str(expected_task_id))
        )
        super().__init__(
            f"the identity is held by task {identifier} (id {current_task_id}), not by the "
            f"expected task {expected}; nothing was released"
        )
        self.expected_task_id = expected_task_id
        self.current_task_id = current_task_id
        self.identifier = identifier


class IdentityRetired(TaskStoreError):
    """The identity ledger says this delivery may not create its item again:
    the item's task was deleted or released, and this entrance (a scan, a
    redelivery of the delivery that created it, one received before the
    change) may not bring it back (docs/contract.md §15)."""

    kind = ErrorKind.CONFLICT

    def __init__(self, reason: str, task_id: int | None) -> None:
        super().__init__(reason)
        self.task_id = task_id


class MergeRefused(TaskStoreError):
    """The tasks' current state refuses a merge or its undo: a task without
    names to move, a create not settled yet, a merge already undone, names
    that moved on since the merge (models/merges.py)."""

    kind = ErrorKind.CONFLICT


class IdempotencyKeyReused(TaskStoreError):
    """An ``Idempotency-Key`` came back with a request other than the one it
    first carried (another body, route, target or guard): nothing was done."""

    kind = ErrorKind.CONFLICT

    def __init__(self, key: str) -> None:
        super().__init__(
            f"Idempotency-Key {key!r} was first sent with a different request; "
            "nothing was done (use a new key for a new request)"
        )
        self.key = key


class IdempotencyKeyBusy(TaskStoreError):
    """The key's row kept vanishing while a request claimed it (a prune at
    that very moment): nothing was done, and the retry is safe."""

    kind = ErrorKind.CONFLICT

    def __init__(self, key: str) -> None:
        super().__init__(f"Idempotency-Key {key!r} is busy; nothing was done, retry")
        self.key = key


class NotReplayable(TaskStoreError):
    """The delivery is in a state a replay cannot start from."""

    kind = ErrorKind.CONFLICT


class HeldLease(Protocol):
    """What :class:`LeaseTakenOver` reads of a lease (``models.inbox.Lease``):
    declared here, so that the errors, below every module that raises them,
    import none of those modules."""

    @property
    def delivery_pk(self) -> int: ...

    @property
    def attempt(self) -> int: ...


class LeaseTakenOver(TaskStoreError):
    """A newer attempt claimed the delivery: this attempt may write nothing more.

    Internal to the worker, never shown to anyone; a conflict all the same --
    the delivery's current state (a newer lease) refuses the write."""

    kind = ErrorKind.CONFLICT

    def __init__(self, lease: HeldLease) -> None:
        super().__init__(
            f"delivery {lease.delivery_pk}: attempt {lease.attempt} was taken over by a newer one"
        )
        self.lease = lease


# --- forbidden -------------------------------------------------------------------------


class DeleteReserved(TaskStoreError, PermissionError):
    """The workspace reserves deletes to operators, and a member asked:
    nothing was deleted (``taskhook workspace deletes``)."""

    kind = ErrorKind.FORBIDDEN

    def __init__(self, workspace: str) -> None:
        super().__init__(
            f"workspace {workspace} reserves deleting tasks to operators: "
            "ask one, or archive the task instead"
        )
        self.workspace = workspace


# --- stale -----------------------------------------------------------------------------


class StaleRevision(TaskStoreError):
    """``If-Match`` named a revision of the task other than its current one."""

    kind = ErrorKind.STALE

    def __init__(self, task_id: int, expected: str, current: str) -> None:
        super().__init__(
            f"task {task_id} changed since revision {expected} (now {current}); nothing was done"
        )
        self.task_id = task_id
        self.expected = expected
        self.current = current


# --- misconfigured ---------------------------------------------------------------------


class WorkspaceMisconfigured(TaskStoreError):
    """The workspace cannot take tasks (it has no workflow steps)."""

    kind = ErrorKind.MISCONFIGURED
