"""An identity's lifecycle: archive keeps it, delete and release free it; lookup reads."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from models.access import Caller
from models.db import session_scope
from models.errors import (
    ExternalIdHasControlCharacter,
    InvalidExternalId,
    InvalidRelease,
    TaskNotFound,
    WorkspaceNotAccessible,
)
from models.tables import IdentityRelease, Task
from models.tasks import (
    CreateOutcome,
    NewTask,
    archive_task,
    create_task,
    delete_task,
    find_task_by_external_id,
    get_task,
    release_external_id,
)
from tests.support.stores import TRUSTED, Store


def create(store: Store, workspace_id: int, external_id: str | None = "jira:PROJ-1"):
    with store.sessions() as session:
        return create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=workspace_id,
            new=NewTask(title="Fix the login page", external_id=external_id),
        )


def release(
    store: Store,
    workspace_id: int,
    external_id="jira:PROJ-1",
    operator="alice",
    reason="the Jira issue was recreated",
):
    with session_scope(store.sessions) as session:
        return release_external_id(
            session=session,
            workspace_id=workspace_id,
            external_id=external_id,
            operator=operator,
            reason=reason,
        )


def lookup(store: Store, workspace_id: int, external_id="jira:PROJ-1", caller=TRUSTED):
    with store.sessions() as session:
        return find_task_by_external_id(
            session=session, caller=caller, workspace_id=workspace_id, external_id=external_id
        )


def row_of(store: Store, task_id: int) -> Task | None:
    with store.sessions() as session:
        return session.get(Task, task_id)


def test_archive_keeps_the_identity(store: Store):
    workspace = store.workspace()
    first = create(store, workspace.id)
    with session_scope(store.sessions) as session:
        archive_task(session=session, caller=TRUSTED, task_id=first.task.id)

    again = create(store, workspace.id)

    assert again.outcome is CreateOutcome.FOUND_SETTLED
    assert again.task.id == first.task.id
    assert again.task.archived_at is not None
    assert lookup(store, workspace.id).id == first.task.id


def test_delete_frees_the_identity(store: Store):
    workspace = store.workspace()
    first = create(store, workspace.id)
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=first.task.id)

    assert lookup(store, workspace.id) is None
    again = create(store, workspace.id)
    assert again.outcome is CreateOutcome.CREATED
    assert again.task.id != first.task.id
    assert again.task.identifier == "ACME-2"


def test_release_frees_the_identity_keeps_the_task_and_writes_the_audit_row(store: Store):
    workspace = store.workspace()
    first = create(store, workspace.id)
    before = row_of(store, first.task.id)

    audit = release(store, workspace.id)

    after = row_of(store, first.task.id)
    assert (after.external_id, after.external_id_settled_at) == (None, None)
    # Nothing else changed.
    for column in (
        "identifier",
        "title",
        "description",
        "step_id",
        "archived_at",
        "created_at",
        "updated_at",
        "workspace_id",
    ):
        assert getattr(after, column) == getattr(before, column), column
    with store.sessions() as session:
        (row,) = session.scalars(select(IdentityRelease)).all()
    assert (row.id, row.workspace_id, row.external_id, row.task_id, row.operator, row.reason) == (
        audit.id,
        workspace.id,
        "jira:PROJ-1",
        first.task.id,
        "alice",
        "the Jira issue was recreated",
    )
    assert row.released_at is not None

    again = create(store, workspace.id)
    assert again.outcome is CreateOutcome.CREATED
    assert again.task.id != first.task.id


def test_release_of_an_identity_nobody_holds_is_not_found_and_writes_nothing(store: Store):
    workspace = store.workspace()
    with pytest.raises(TaskNotFound):
        release(store, workspace.id, "jira:PROJ-404")
    assert store.scalar("SELECT count(*) FROM identity_releases") == 0


def test_release_validates_the_identity_and_needs_an_operator_and_a_reason(store: Store):
    workspace = store.workspace()
    create(store, workspace.id)
    with pytest.raises(ExternalIdHasControlCharacter):
        release(store, workspace.id, "jira:PROJ-1\n")
    with pytest.raises(InvalidExternalId):
        release(store, workspace.id, "   ")
    with pytest.raises(InvalidRelease):
        release(store, workspace.id, reason="  ")
    with pytest.raises(InvalidRelease):
        release(store, workspace.id, operator="")
    assert lookup(store, workspace.id) is not None
    assert store.scalar("SELECT count(*) FROM identity_releases") == 0


def test_lookup_finds_unsettled_tasks(store: Store):
    workspace = store.workspace()
    task = create(store, workspace.id).task
    with store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE tasks SET external_id_settled_at = NULL")

    found = lookup(store, workspace.id)

    assert found.id == task.id
    assert found.external_id_settled_at is None


def test_lookup_misses_cleanly_and_never_writes(store: Store):
    workspace = store.workspace()
    assert lookup(store, workspace.id, "jira:PROJ-404") is None
    assert store.scalar("SELECT task_sequence FROM workspaces") == 0


def test_lookup_authorizes_before_validating(store: Store):
    acme, globex = store.workspace("acme", "ACME"), store.workspace("globex", "GLX")
    create(store, acme.id)
    outsider = Caller.of_workspaces("globex-token", globex.id)
    for external_id in ("jira:PROJ-1", "bad\n", None):
        with pytest.raises(WorkspaceNotAccessible):
            lookup(store, acme.id, external_id, caller=outsider)
    with pytest.raises(InvalidExternalId):
        lookup(store, acme.id, None)


def test_tasks_of_another_workspace_look_missing(store: Store):
    acme, globex = store.workspace("acme", "ACME"), store.workspace("globex", "GLX")
    task = create(store, acme.id).task
    outsider = Caller.of_workspaces("globex-token", globex.id)
    with store.sessions() as session:
        for action in (get_task, archive_task, delete_task):
            with pytest.raises(TaskNotFound):
                action(session=session, caller=outsider, task_id=task.id)
    assert row_of(store, task.id).archived_at is None
