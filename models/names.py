"""What an item is called, and the moves a delivery announces.

A real item (a GitHub issue, a Jira issue, a GitLab issue) is known to
taskhook by its external id (``jira:PROJ-1234``, ``gh-issue/owner/repo#12``).
Items move: a GitHub issue is transferred, a Jira issue changes project, a
GitLab issue is moved to another project, a repository is renamed. The
external id changes with the move; the task must not (docs/contract.md,
§15, "Identities that move"). So a provider says, besides the external id:

- the item's *stable key*, where the provider has an id that survives the
  moves it knows (Jira's ``issue.id``, GitHub's ``repository.id`` with the
  number, GitLab's global issue ``id``);
- the names the item had before, when the create itself announces them
  (GitHub's ``issues.opened`` after a transfer carries ``changes.old_issue``);
- the :class:`Move` s a non-create delivery announces (``issues.transferred``,
  a Jira ``Key`` change, a GitLab close with ``moved_to_id``, a repository
  renamed or transferred).

These are values only: the identity ledger (models/identities.py) decides
what they mean for the workspace's tasks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class NameKind(enum.StrEnum):
    #: An external id, as a task holds it.
    EXTERNAL = "external"
    #: A provider's id that survives a move (see the module docstring).
    STABLE = "stable"


@dataclass(frozen=True, order=True)
class Name:
    kind: NameKind
    value: str

    @classmethod
    def external(cls, value: str) -> Name:
        return cls(NameKind.EXTERNAL, value)

    @classmethod
    def stable(cls, value: str) -> Name:
        return cls(NameKind.STABLE, value)


@dataclass(frozen=True)
class Move:
    """The item known as ``before`` is now (also) known as ``after``.

    With ``prefix``, both are external-id prefixes: every item whose external
    id begins with ``before`` is now known by the same id beginning with
    ``after`` (a repository renamed or transferred: ``gh-issue/old/repo#``
    → ``gh-issue/new/repo#``).
    """

    before: Name
    after: Name
    prefix: bool = False
