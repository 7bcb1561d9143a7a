"""The REST API's request and response bodies, as OpenAPI shows them.

``creation_complete`` and ``deduplicated`` keep their narrow meanings
(docs/contract.md, "Outcomes"); their descriptions say so, because a broader
reading ("the task is done", "an agent is running") is the mistake the names
were chosen to avoid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Self

from pydantic import BaseModel, ConfigDict, Field

from models.identities import NameView
from models.tables import Task

EXTERNAL_ID_DESCRIPTION = (
    "A stable identifier from your own system (issue key, webhook delivery id, a UUID "
    "you generated). Creating a task twice with the same external_id in the same "
    "workspace returns the first task instead of making a duplicate. Compared "
    "byte-exactly and case-sensitively; control characters are rejected; surrounding "
    "Unicode white space is trimmed; empty means none; at most 255 bytes of UTF-8."
)
DEDUPLICATED_DESCRIPTION = (
    "true when a task already held this external_id, so this request created nothing "
    "and returned that task; false when this request created the task."
)
CREATION_COMPLETE_DESCRIPTION = (
    "Only this: whether the create that claimed the external_id had finished its "
    "required synchronous setup when observed. It does not mean the task is done or "
    "that any work on it is running. false occurs only with deduplicated: true, and "
    "means another create may still be in progress: do not assume the task is ready, "
    "and do not release the identity to create again."
)


class ErrorBody(BaseModel):
    error: str


class TaskCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workspace_id: int
    title: str
    description: str | None = None
    external_id: str | None = Field(default=None, description=EXTERNAL_ID_DESCRIPTION)


class TaskPatch(BaseModel):
    """Title and description only: a task's external_id is set once, at create."""

    model_config = ConfigDict(extra="forbid")

    title: str | None = None
    description: str | None = None


class TaskName(BaseModel):
    """One name the identity ledger knows a task by (docs/contract.md §15, item 9)."""

    kind: str = Field(description="external (an external id) or stable (a provider's stable key).")
    name: str
    state: str = Field(description="held, archived, deleted or released.")
    alias: bool = Field(
        description="Not the name the task was created under: a move's or a merge's."
    )


class TaskRead(BaseModel):
    id: int
    workspace_id: int
    identifier: str = Field(description="The workspace-scoped identifier, e.g. ACME-42.")
    title: str
    description: str | None
    step_id: int
    archived_at: datetime | None
    created_at: datetime
    updated_at: datetime
    external_id: str | None = Field(
        default=None,
        exclude_if=lambda external_id: external_id is None,
        description="The external identity this task holds; omitted when it holds none.",
    )

    names: list[TaskName] = Field(
        default_factory=list,
        description="Every name the task answers or answered to: its own first, then its "
        "aliases (a move's, a merge's). A lookup by any live one finds the task.",
    )

    @classmethod
    def of(cls, task: Task, names: Sequence[NameView] = (), **outcome: bool) -> Self:
        """``task`` as this read model, with its ``names`` (``models.identities.names_shown``);
        ``outcome`` fills a subclass's own fields (``deduplicated``, ``creation_complete``)."""
        fields = {name: getattr(task, name) for name in TaskRead.model_fields if name != "names"}
        shown = [TaskName(**asdict(name)) for name in names]
        return cls(**fields, names=shown, **outcome)


class CreatedTask(TaskRead):
    deduplicated: bool = Field(description=DEDUPLICATED_DESCRIPTION)
    creation_complete: bool = Field(description=CREATION_COMPLETE_DESCRIPTION)


class FoundTask(TaskRead):
    creation_complete: bool = Field(description=CREATION_COMPLETE_DESCRIPTION)


class TaskPage(BaseModel):
    tasks: list[TaskRead]
    next_after: int | None = Field(
        description="Pass as ?after= for the next page; null on the last page."
    )
