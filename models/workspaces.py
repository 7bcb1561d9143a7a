"""Workspaces and their workflow steps."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from models.errors import InvalidWorkspace
from models.tables import WorkflowStep, Workspace

_SLUG = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$")
_PREFIX = re.compile(r"^[A-Z][A-Z0-9]{0,15}$")


@dataclass(frozen=True)
class StepSpec:
    name: str
    wip_limit: int | None = None


DEFAULT_STEPS = (StepSpec("Inbox"), StepSpec("In progress"), StepSpec("Done"))


def checked_slug(slug: str) -> str:
    """``slug`` if a workspace may have it; else :class:`InvalidWorkspace`
    saying why (the CLI checks its arguments with it, too)."""
    if not _SLUG.match(slug):
        raise InvalidWorkspace(
            f"slug {slug!r} must be lowercase letters, digits and dashes (at most 64)"
        )
    return slug


def checked_prefix(task_prefix: str) -> str:
    """``task_prefix`` if a workspace may have it; else :class:`InvalidWorkspace`."""
    if not _PREFIX.match(task_prefix):
        raise InvalidWorkspace(
            f"task prefix {task_prefix!r} must be an uppercase letter then up to 15 "
            "uppercase letters or digits"
        )
    return task_prefix


def checked_name(name: str) -> str:
    """``name`` trimmed, if not empty; else :class:`InvalidWorkspace`."""
    if not name.strip():
        raise InvalidWorkspace("a workspace needs a name")
    return name.strip()


def create_workspace(
    *,
    session: Session,
    slug: str,
    name: str,
    task_prefix: str,
    steps: Sequence[StepSpec] = DEFAULT_STEPS,
) -> Workspace:
    """A new workspace with its workflow; the first step is the intake step."""
    slug, task_prefix, name = checked_slug(slug), checked_prefix(task_prefix), checked_name(name)
    if not steps:
        raise InvalidWorkspace("a workspace needs at least one workflow step")
    if any(step.wip_limit is not None and step.wip_limit < 0 for step in steps):
        raise InvalidWorkspace("a WIP limit cannot be negative")
    if session.scalar(select(Workspace.id).where(Workspace.slug == slug)) is not None:
        raise InvalidWorkspace(f"a workspace with slug {slug!r} already exists")

    workspace = Workspace(slug=slug, name=name, task_prefix=task_prefix)
    session.add(workspace)
    session.flush()
    for position, step in enumerate(steps):
        session.add(
            WorkflowStep(
                workspace_id=workspace.id,
                name=step.name,
                position=position,
                wip_limit=step.wip_limit,
            )
        )
    session.flush()
    return workspace


def find_step(*, session: Session, workspace_id: int, step_name: str | None) -> WorkflowStep:
    """The workspace's step named ``step_name``; None: its intake step, where
    new tasks land. Raises :class:`InvalidWorkspace`, naming the steps there
    are, for a step the workspace does not have."""
    steps = list(
        session.scalars(
            select(WorkflowStep)
            .where(WorkflowStep.workspace_id == workspace_id)
            .order_by(WorkflowStep.position)
        )
    )
    if not steps:
        raise InvalidWorkspace(f"workspace {workspace_id} has no workflow steps")
    if step_name is None:
        return steps[0]
    step = next((s for s in steps if s.name == step_name), None)
    if step is None:
        names = ", ".join(repr(s.name) for s in steps)
        raise InvalidWorkspace(f"no step {step_name!r} in the workspace (its steps: {names})")
    return step


def set_wip_limit(
    *, session: Session, workspace_id: int, step_name: str | None, wip_limit: int | None
) -> WorkflowStep:
    """Set the WIP limit of the workspace's step named ``step_name`` (None: its
    intake step); ``wip_limit`` None removes the limit.

    Tasks already in the step stay: a lower limit only stops new ones until
    enough are archived or moved on. Raises :class:`InvalidWorkspace` for a
    negative limit or a step the workspace does not have."""
    if wip_limit is not None and wip_limit < 0:
        raise InvalidWorkspace("a WIP limit cannot be negative")
    step = find_step(session=session, workspace_id=workspace_id, step_name=step_name)
    step.wip_limit = wip_limit
    session.flush()
    return step


def reserve_deletes(*, session: Session, workspace: Workspace, to_operators: bool) -> bool:
    """Reserve deleting the workspace's tasks to operator tokens, or let
    member tokens delete too; enforced by ``models.tasks.delete_task``.
    Answers whether the setting changed."""
    changed = workspace.deletes_need_operator != to_operators
    workspace.deletes_need_operator = to_operators
    session.flush()
    return changed
