"""How the worker tests run a delivery and bring about its faults: one run,
a crash between the insert and the settlement, an expired lease, a replay,
a database that goes away, a task deleted before its create settled.
Shared by the worker's test modules, and by the replays' tests."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from models.db import session_scope
from models.inbox import DeliveryStatus, replay
from models.settings import Settings
from models.tables import Delivery, Task, utcnow
from models.tasks import delete_task
from tests.support.feeds import delivery, store_fixture, tasks_of
from tests.support.stores import TRUSTED, Store
from worker.processing import Processed, Seams, process_delivery

SETTINGS = Settings(
    task_time_limit_seconds=10,
    lease_seconds=30,
    retry_base_seconds=1.0,
    retry_max_seconds=8.0,
    unsettled_max_retries=3,
    database_max_retries=2,
)


class Crash(BaseException):
    """A simulated process death: nothing catches it."""


def run(store: Store, pk: int, **options) -> Processed:
    options["settings"] = store.worker_settings(options.get("settings", SETTINGS))
    with session_scope(store.sessions) as session:
        return process_delivery(session=session, delivery_pk=pk, **options)


def crash_after_insert(_task: Task) -> None:
    raise Crash()


def expire_lease(store: Store, pk: int) -> None:
    with session_scope(store.sessions) as session:
        session.execute(
            update(Delivery)
            .where(Delivery.id == pk)
            .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )


def crashed_create(store: Store, feed, name: str = "jira_issue_created__cloud") -> int:
    """A delivery whose worker died between the task insert and the settle."""
    pk = store_fixture(store.sessions, feed, "jira", name)
    with pytest.raises(Crash):
        run(store, pk, seams=Seams(after_insert=crash_after_insert))
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (task.created_by_delivery, task.external_id_settled_at) == (pk, None)
    assert delivery(store.sessions, pk).status == "processing"
    return pk


def deleted_before_it_settled(store: Store, pk: int) -> int:
    """Have the worker park stored delivery ``pk`` as ``needs_operator``
    because the task its create inserted was deleted before that create
    settled: its worker dies after the insert, someone deletes the task over
    REST, and its next attempt finds it gone. The deleted task's id."""
    with pytest.raises(Crash):
        run(store, pk, seams=Seams(after_insert=crash_after_insert))
    task_id = delivery(store.sessions, pk).created_task_id
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=task_id)
    expire_lease(store, pk)
    parked = run(store, pk)
    assert parked.status is DeliveryStatus.NEEDS_OPERATOR, parked
    assert "deleted before its creation settled" in parked.reason
    return task_id


def a_create_deleted_before_it_settled(
    store: Store, feed, name: str = "jira_issue_created__cloud"
) -> tuple[int, int]:
    """A delivery of fixture ``name`` parked by :func:`deleted_before_it_settled`:
    its key and the deleted task's id."""
    pk = store_fixture(store.sessions, feed, "jira", name)
    return pk, deleted_before_it_settled(store, pk)


def replay_delivery(store: Store, pk: int) -> None:
    with session_scope(store.sessions) as session:
        replay(session=session, delivery_pk=pk)


def database_goes_away() -> None:
    raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))
