"""Who is asking: the workspaces a caller may see.

Surfaces build a :class:`Caller` (a REST token, an MCP session, the worker
acting for a webhook source) and the task service authorizes against it
before doing anything else. A workspace the caller may not see is reported
exactly like one that does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Caller:
    name: str
    #: The workspaces this caller may touch; ``None`` means every workspace
    #: (trusted in-process callers: the worker, the operator CLI).
    workspace_ids: frozenset[int] | None
    #: Acting with an operator's role: a token's role, or a trusted
    #: in-process caller. What a workspace may reserve to operators (a
    #: delete, ``models.tasks.delete_task``) asks this.
    operator: bool = False

    @classmethod
    def trusted(cls, name: str) -> Caller:
        return cls(name=name, workspace_ids=None, operator=True)

    @classmethod
    def of_workspaces(cls, name: str, *workspace_ids: int, operator: bool = False) -> Caller:
        return cls(name=name, workspace_ids=frozenset(workspace_ids), operator=operator)

    def may_access(self, workspace_id: int) -> bool:
        return self.workspace_ids is None or workspace_id in self.workspace_ids
