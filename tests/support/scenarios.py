"""Scenarios of the inbox and the task store, built with the service
functions the worker and the CLI use: a source, a delivery, a create by a
delivery (crashed or finished), a parked or settled delivery, a release.
Shared by the reports' and the CLI's tests."""

from __future__ import annotations

import uuid
from datetime import datetime

import pytest
from sqlalchemy import update

from models.catchup import set_log_access
from models.db import session_scope
from models.inbox import (
    DeliveryStatus,
    IncomingDelivery,
    claim,
    fence_create,
    finish,
    record_delivery,
)
from models.reports import lineage
from models.sources import add_source
from models.tables import Delivery
from models.tasks import (
    CreateHooks,
    NewTask,
    SourceLink,
    create_task,
    release_external_id,
)
from tests.support.stores import TRUSTED, Store

SECRET = "never-show-me-7f3a"
EXTERNAL_ID = "gh-issue/acme/api#12"


def a_source(store: Store, workspace_id: int, slug: str = "acme-github") -> int:
    with session_scope(store.sessions) as session:
        return add_source(
            session=session,
            provider="github",
            workspace_id=workspace_id,
            slug=slug,
            secret=SECRET,
            create_events=["issues.opened"],
        ).id


def reading_the_github_log(
    sessions, api_base_url: str, token: str, slug: str = "acme-github", hook_id: str = "123"
) -> None:
    """Source ``slug``'s catch-up reads hook ``hook_id`` of ``acme/widgets``
    on the GitHub at ``api_base_url`` (a fake's) with ``token``."""
    with session_scope(sessions) as session:
        set_log_access(
            session=session,
            slug=slug,
            target="repos/acme/widgets",
            hook_id=hook_id,
            token=token,
            api_base_url=api_base_url,
        )


def a_delivery(
    store: Store,
    source_id: int,
    delivery_id: str,
    headers: dict[str, str] | None = None,
    *,
    external_id: str | None = None,
) -> int:
    """A queued delivery; ``external_id`` is what the ingress read from its body."""
    incoming = IncomingDelivery(
        source_id=source_id,
        delivery_id=delivery_id,
        # A body of its own: one body under two delivery ids is a replay.
        body=b'{"action": "opened", "delivery": "%s"}' % delivery_id.encode(),
        event="issues.opened",
        action="opened",
        headers=headers or {"X-GitHub-Event": "issues", "User-Agent": "GitHub-Hookshot/abc"},
        content_type="application/json",
        external_id=external_id,
    )
    with session_scope(store.sessions) as session:
        return record_delivery(session=session, incoming=incoming).pk


def a_backlog(
    store: Store,
    source_id: int,
    *,
    queued: int = 0,
    processing: int = 0,
    finished: int = 0,
    received_at: datetime | None = None,
) -> list[int]:
    """Deliveries of the source, stored as the ingress stores them, then left
    ``queued``, marked ``processing`` (as a worker's claim), or ``done``;
    ``received_at`` sets when every one was received. Their keys, in that order."""
    keys = []
    with session_scope(store.sessions) as session:
        for status, count in (
            (DeliveryStatus.QUEUED, queued),
            (DeliveryStatus.PROCESSING, processing),
            (DeliveryStatus.DONE, finished),
        ):
            for _ in range(count):
                # An id and a body of its own, or the inbox takes it for a
                # duplicate or a replay of an earlier one.
                unique = uuid.uuid4().hex
                incoming = IncomingDelivery(
                    source_id=source_id,
                    delivery_id=f"backlog-{unique}",
                    body=b'{"backlog": "%s"}' % unique.encode(),
                    event="issues.opened",
                    action="opened",
                    headers={},
                    content_type="application/json",
                )
                key = record_delivery(session=session, incoming=incoming).pk
                values: dict[str, object] = {"status": status.value}
                if received_at is not None:
                    values["received_at"] = received_at
                session.execute(update(Delivery).where(Delivery.id == key).values(**values))
                keys.append(key)
    return keys


class Crash(Exception):
    """The worker died between the insert and the settlement."""


def _crash(_task) -> None:
    raise Crash()


def create_by(
    store: Store,
    workspace_id: int,
    delivery_pk: int,
    external_id: str = EXTERNAL_ID,
    *,
    crash_before_settle: bool = False,
) -> int:
    """What process_delivery does for a create event: claim, create, record the outcome.

    With ``crash_before_settle`` the worker dies after inserting the task: the
    task stays unsettled and the delivery keeps no outcome (its lease runs out).
    """
    new = NewTask(
        title="Login page is blank",
        external_id=external_id,
        source=SourceLink("github", "https://github.com/acme/api/issues/12", "acme/api#12"),
        created_by_delivery=delivery_pk,
    )
    with session_scope(store.sessions) as session:
        lease = claim(session=session, delivery_pk=delivery_pk, lease_seconds=60)
    with store.sessions() as session:
        if crash_before_settle:
            with pytest.raises(Crash):
                create_task(
                    session=session,
                    caller=TRUSTED,
                    workspace_id=workspace_id,
                    new=new,
                    hooks=CreateHooks(after_insert=_crash),
                    fence=fence_create(lease),
                )
            return store.scalar(
                "SELECT id FROM tasks WHERE created_by_delivery = :pk", pk=delivery_pk
            )
        result = create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=workspace_id,
            new=new,
            fence=fence_create(lease),
        )
        task_id, outcome = result.task.id, result.outcome.value
    with session_scope(store.sessions) as session:
        finish(
            session=session,
            lease=lease,
            status=DeliveryStatus.DONE,
            outcome=outcome,
            task_id=task_id,
        )
    return task_id


def settle_as(
    store: Store,
    delivery_pk: int,
    status: DeliveryStatus,
    *,
    outcome: str | None = None,
    task_id: int | None = None,
    reason: str | None = None,
    error: str | None = None,
) -> None:
    """Take the delivery through the worker's claim and finish it in ``status``."""
    with session_scope(store.sessions) as session:
        lease = claim(session=session, delivery_pk=delivery_pk, lease_seconds=60)
        finish(
            session=session,
            lease=lease,
            status=status,
            outcome=outcome,
            task_id=task_id,
            reason=reason,
            error=error,
        )


def park(store: Store, delivery_pk: int, task_id: int) -> None:
    settle_as(
        store,
        delivery_pk,
        DeliveryStatus.NEEDS_OPERATOR,
        outcome="found_unsettled",
        task_id=task_id,
        reason="another delivery's create never finished",
    )


def release(store: Store, workspace_id: int, external_id: str = EXTERNAL_ID) -> int:
    with session_scope(store.sessions) as session:
        return release_external_id(
            session=session,
            workspace_id=workspace_id,
            external_id=external_id,
            operator="alice",
            reason="creating worker died",
        ).id


def lineage_of(store: Store, external_id: object = EXTERNAL_ID, workspace: str = "acme"):
    with store.sessions() as session:
        return lineage(session=session, workspace_slug=workspace, external_id=external_id)


# --- workspaces and sources ---------------------------------------------------------------


def a_settled_task(store: Store) -> tuple[int, int, int]:
    """A task created by delivery d-1, then found again by delivery d-2."""
    acme = store.workspace()
    source_id = a_source(store, acme.id)
    first = a_delivery(store, source_id, "d-1")
    task_id = create_by(store, acme.id, first)
    second = a_delivery(store, source_id, "d-2")
    settle_as(store, second, DeliveryStatus.DONE, outcome="found_settled", task_id=task_id)
    return task_id, first, second


def an_unfinished_create(store: Store) -> tuple[int, int, int, int]:
    """Delivery d-1's worker died after its insert; d-2 is parked as needs_operator."""
    acme = store.workspace()
    source_id = a_source(store, acme.id)
    creator = a_delivery(store, source_id, "d-1")
    task_id = create_by(store, acme.id, creator, crash_before_settle=True)
    parked = a_delivery(store, source_id, "d-2")
    park(store, parked, task_id)
    return acme.id, task_id, creator, parked
