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

from models import idempotency, retry_safe
from models.access import Caller
from models.broker.messages import IDEMPOTENCY_KEY_HEADER, RELEASE_IDENTITY
from models.broker.versions import notice_unknown
from models.db import session_scope
from models.errors import (
    HolderChanged,
    IdempotencyKeyReused,
    InvalidExternalId,
    InvalidIdempotencyKey,
    InvalidRelease,
    TaskNotFound,
)
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
    idempotency_key: object = None,
) -> dict[str, Any]:
    """Release the identity and write its audit row, in the caller's unit of work.

    With ``idempotency_key`` (the CLI sends one per run, and the one
    ``--idempotency-key`` names), a message sent again -- the operator ran the
    command again after it gave up waiting -- answers the first release, with
    ``"replayed": true``, and releases nothing twice (docs/contract.md §16).

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
        retry = idempotency.Retry.of(idempotency.cli_actor(operator or ""), idempotency_key)
        receipt = retry_safe.release(
            session=session,
            caller=Caller.trusted(operator or "operator"),
            workspace_id=workspace_id,
            external_id=external_id,
            operator=operator or "",
            reason=reason or "",
            expected_task_id=expected_task_id,
            retry=retry,
        )
    except (
        InvalidRelease,
        InvalidExternalId,
        InvalidIdempotencyKey,
        IdempotencyKeyReused,
    ) as error:
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
    return retry_safe.release_answer(session, receipt)


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
    idempotency_key: object = None,
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
        idempotency_key=idempotency_key,
    )


@shared_task(name=RELEASE_IDENTITY, bind=True, ignore_result=False)
def release_identity_task(
    self,
    workspace_id: int,
    external_id: str,
    operator: str,
    reason: str,
    expected_task_id: int | None = None,
    idempotency_key: str | None = None,
    **unknown: Any,
) -> dict[str, Any]:
    """RELEASE_IDENTITY(workspace_id, external_id, operator, reason, expected_task_id)
    on the operator queue, and the keyword ``idempotency_key`` (0.2.0; a
    0.1.0 worker logs it as unknown and releases once per message, as before).
    The fifth argument has a default only so that a message an older CLI
    queued (four arguments) is answered with a refusal
    (:func:`release_by_message`), not a crash of the task."""
    notice_unknown(RELEASE_IDENTITY, unknown, self.request.headers)
    if idempotency_key is None:
        idempotency_key = _header(self.request, IDEMPOTENCY_KEY_HEADER)
    with session_scope(runtime.sessions()) as session:
        return release_by_message(
            session=session,
            workspace_id=workspace_id,
            external_id=external_id,
            operator=operator,
            reason=reason,
            expected_task_id=expected_task_id,
            idempotency_key=idempotency_key,
        )


def _header(request: Any, name: str) -> Any:
    """A custom header of the message: Celery keeps it in ``request.headers``
    or, by protocol, as an attribute of the request."""
    return (getattr(request, "headers", None) or {}).get(name) or getattr(request, name, None)
