"""Operator-only tasks, consumed from the ``operator`` queue by their own worker.

Releasing an external identity frees it without deleting its task, so that a
later create makes a new task. Only a person decides that, never an automated
path (docs/contract.md, "Release"), so it is reachable only from operator
surfaces -- this task, sent by the CLI, the REST release route for
operator tokens and the console's release form -- and never from a webhook
handler or a delivery task. The CLI and the console always name the holder
the operator was shown, and this task refuses a message that names none: a
message may wait in the queue while its task is deleted and another claims
the identity.
``tests/integration/worker/test_release_boundary.py`` walks their imports to
keep it so.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from sqlalchemy.orm import Session

from models.broker.messages import RELEASE_IDENTITY
from models.broker.versions import notice_unknown
from models.db import session_scope
from models.errors import HolderChanged, InvalidExternalId, InvalidRelease, TaskNotFound
from models.tables import Task
from models.tasks import release_external_id
from worker import runtime

log = logging.getLogger(__name__)

#: Why a RELEASE_IDENTITY message that names no expected holder is refused.
NO_EXPECTED_HOLDER = (
    "the release message names no expected holder (expected_task_id, its fifth "
    "argument), so a task that claimed the identity while the message waited in the "
    "queue could be freed; nothing was released. Release it again with `taskhook release`, "
    "which shows the holder and sends it"
)


def release_identity(
    *,
    session: Session,
    workspace_id: object,
    external_id: object,
    operator: object,
    reason: object,
    expected_task_id: object = None,
) -> dict[str, Any]:
    """Release the identity and write its audit row, in the caller's unit of work.

    Returns a JSON-able answer either way: ``{"released": true, ...}`` with the
    task and the audit row, or ``{"released": false, "error": ...}`` for a
    caller's mistake (no operator or reason, an invalid external id, nothing
    holding it, or -- with ``expected_task_id`` -- another task holding it,
    answered with ``"holder_changed": true`` and the current holder).
    Database failures raise: they are not the caller's mistake.
    """
    if isinstance(workspace_id, bool) or not isinstance(workspace_id, int):
        return _refused("workspace_id must be an integer")
    if expected_task_id is not None and (
        isinstance(expected_task_id, bool) or not isinstance(expected_task_id, int)
    ):
        return _refused("expected_task_id must be an integer")
    for name, value in (("operator", operator), ("reason", reason)):
        if value is not None and not isinstance(value, str):
            return _refused(f"{name} must be text")
    try:
        audit = release_external_id(
            session=session,
            workspace_id=workspace_id,
            external_id=external_id,
            operator=operator or "",
            reason=reason or "",
            expected_task_id=expected_task_id,
        )
    except (InvalidRelease, InvalidExternalId) as error:
        return _refused(str(error))
    except HolderChanged as error:
        return _refused(
            str(error),
            holder_changed=True,
            current_task_id=error.current_task_id,
            current_identifier=error.identifier,
        )
    except TaskNotFound:
        return _refused(f"no task in workspace {workspace_id} holds external id {external_id!r}")
    task = session.get(Task, audit.task_id)
    return {
        "released": True,
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


def _refused(error: str, **details: Any) -> dict[str, Any]:
    return {"released": False, "error": error, **details}


def release_by_message(
    *,
    session: Session,
    workspace_id: object,
    external_id: object,
    operator: object,
    reason: object,
    expected_task_id: object = None,
) -> dict[str, Any]:
    """What the operator worker answers a RELEASE_IDENTITY message:
    :func:`release_identity`, guarded by the holder the sender showed.

    A message without ``expected_task_id`` -- the four arguments an older
    CLI queued -- is refused, logged, and changes nothing: it may have
    waited in the queue while the task it was meant for was deleted and a
    new create claimed the identity (docs/contract.md, "Release")."""
    if expected_task_id is None:
        log.warning(
            "refused a release of external id %r in workspace %r (operator %r): %s",
            external_id,
            workspace_id,
            operator,
            NO_EXPECTED_HOLDER,
        )
        return _refused(NO_EXPECTED_HOLDER, expected_holder_missing=True)
    return release_identity(
        session=session,
        workspace_id=workspace_id,
        external_id=external_id,
        operator=operator,
        reason=reason,
        expected_task_id=expected_task_id,
    )


@shared_task(name=RELEASE_IDENTITY, bind=True, ignore_result=False)
def release_identity_task(
    self,
    workspace_id: int,
    external_id: str,
    operator: str,
    reason: str,
    expected_task_id: int | None = None,
    **unknown: Any,
) -> dict[str, Any]:
    """RELEASE_IDENTITY(workspace_id, external_id, operator, reason, expected_task_id)
    on the operator queue. The fifth argument has a default only so that a
    message an older CLI queued (four arguments) is answered with a refusal
    (:func:`release_by_message`), not a crash of the task."""
    notice_unknown(RELEASE_IDENTITY, unknown, self.request.headers)
    with session_scope(runtime.sessions()) as session:
        return release_by_message(
            session=session,
            workspace_id=workspace_id,
            external_id=external_id,
            operator=operator,
            reason=reason,
            expected_task_id=expected_task_id,
        )
