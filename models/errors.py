"""The task store's domain errors. Each surface maps them to its own answer
(a status code, a CLI message, a delivery state); none of them is a crash."""

from __future__ import annotations


class TaskStoreError(Exception):
    """Base class; ``str(error)`` is safe to show the caller."""


class WorkspaceNotAccessible(TaskStoreError, LookupError):
    """The workspace does not exist, or the caller may not see it (one answer for both)."""

    def __init__(self, workspace_id: object) -> None:
        super().__init__(f"workspace {workspace_id} not found")
        self.workspace_id = workspace_id


class TaskNotFound(TaskStoreError, LookupError):
    def __init__(self, what: str = "task not found") -> None:
        super().__init__(what)


class InvalidTask(TaskStoreError, ValueError):
    """Create-time validation failed (a missing title, say)."""


class WipLimitReached(TaskStoreError):
    """The workspace's intake step is at its work-in-progress limit."""

    def __init__(self, step_name: str, wip_limit: int) -> None:
        super().__init__(f"step {step_name!r} is at its WIP limit of {wip_limit}")
        self.step_name = step_name
        self.wip_limit = wip_limit


class WorkspaceMisconfigured(TaskStoreError):
    """The workspace cannot take tasks (it has no workflow steps)."""


class InvalidRelease(TaskStoreError, ValueError):
    """A release without an operator or a reason, or with one the audit row
    cannot keep as given (too long, control characters)."""


class HolderChanged(TaskStoreError):
    """A release named the holder it expected, and another task holds the
    identity now: nothing was released."""

    def __init__(self, expected_task_id: int, current_task_id: int, identifier: str) -> None:
        super().__init__(
            f"the identity is held by task {identifier} (id {current_task_id}), not by the "
            f"expected task {expected_task_id}; nothing was released"
        )
        self.expected_task_id = expected_task_id
        self.current_task_id = current_task_id
        self.identifier = identifier
