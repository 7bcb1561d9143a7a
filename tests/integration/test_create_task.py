"""The create sequence (docs/contract.md), outcome by outcome, on SQLite and PostgreSQL."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from models.access import Caller
from models.db import session_scope
from models.errors import (
    ExternalIdHasControlCharacter,
    InvalidTask,
    TaskNotFound,
    WipLimitReached,
    WorkspaceNotAccessible,
)
from models.tables import Task, TaskSource
from models.tasks import (
    MAX_DESCRIPTION_LENGTH,
    NO_HOOKS,
    CreateHooks,
    CreateOutcome,
    NewTask,
    SourceLink,
    create_task,
    delete_task,
    release_external_id,
)
from tests.support.stores import TRUSTED, Store

JIRA = SourceLink(
    provider="jira", url="https://acme.atlassian.net/browse/PROJ-1", remote_key="PROJ-1"
)


class Dispatches(list):
    """Records the tasks handed to the asynchronous dispatch step."""

    def __call__(self, task: Task) -> None:
        self.append(task.id)


def create(
    store: Store,
    workspace_id: int,
    external_id=None,
    *,
    title="Fix the login page",
    source=JIRA,
    dispatch=None,
    hooks=NO_HOOKS,
    caller=TRUSTED,
):
    with store.sessions() as session:
        return create_task(
            session=session,
            caller=caller,
            workspace_id=workspace_id,
            new=NewTask(title=title, external_id=external_id, source=source),
            dispatch=dispatch,
            hooks=hooks,
        )


def sequence_of(store: Store, workspace_id: int) -> int:
    return store.scalar("SELECT task_sequence FROM workspaces WHERE id = :id", id=workspace_id)


def count_tasks(store: Store) -> int:
    return store.scalar("SELECT count(*) FROM tasks")


def test_created_holds_the_identity_settles_and_dispatches_once(store: Store):
    workspace = store.workspace()
    dispatched = Dispatches()

    result = create(store, workspace.id, "jira:PROJ-1", dispatch=dispatched)

    assert result.outcome is CreateOutcome.CREATED
    assert (result.outcome.deduplicated, result.outcome.creation_complete) == (False, True)
    assert result.external_id == "jira:PROJ-1"
    assert result.task.identifier == "ACME-1"
    assert result.task.external_id_settled_at is not None
    assert dispatched == [result.task.id]
    with store.sessions() as session:
        link = session.scalars(select(TaskSource)).one()
        assert (link.task_id, link.provider, link.remote_key) == (result.task.id, "jira", "PROJ-1")
        stored = session.get(Task, result.task.id)
        assert stored.external_id_settled_at is not None


def test_found_settled_returns_the_same_task_and_burns_no_sequence_number(store: Store):
    workspace = store.workspace()
    first = create(store, workspace.id, "jira:PROJ-1")
    dispatched = Dispatches()

    again = create(
        store, workspace.id, "jira:PROJ-1", title="a different title", dispatch=dispatched
    )

    assert again.outcome is CreateOutcome.FOUND_SETTLED
    assert (again.outcome.deduplicated, again.outcome.creation_complete) == (True, True)
    assert again.task.id == first.task.id
    assert again.external_id == "jira:PROJ-1"
    assert again.task.title == "Fix the login page"
    assert dispatched == []
    assert sequence_of(store, workspace.id) == 1
    assert count_tasks(store) == 1


def test_found_unsettled_while_the_claiming_create_has_not_finished(store: Store):
    workspace = store.workspace()
    seen = []

    def retry_while_first_is_unfinished(task: Task) -> None:
        seen.append(create(store, workspace.id, "jira:PROJ-1"))

    first = create(
        store,
        workspace.id,
        "jira:PROJ-1",
        hooks=CreateHooks(after_insert=retry_while_first_is_unfinished),
    )

    (retry,) = seen
    assert retry.outcome is CreateOutcome.FOUND_UNSETTLED
    assert (retry.outcome.deduplicated, retry.outcome.creation_complete) == (True, False)
    assert retry.task.id == first.task.id
    assert retry.external_id == "jira:PROJ-1"
    assert first.outcome is CreateOutcome.CREATED
    assert sequence_of(store, workspace.id) == 1


def test_found_runs_no_post_create_work(store: Store):
    workspace = store.workspace()
    first = create(store, workspace.id, "jira:PROJ-1", source=None)

    again = create(store, workspace.id, "jira:PROJ-1", source=JIRA)

    assert again.outcome is CreateOutcome.FOUND_SETTLED
    assert again.task.id == first.task.id
    assert store.scalar("SELECT count(*) FROM task_sources") == 0


def test_release_between_insert_and_settle_loses_the_identity_and_dispatches_nothing(store: Store):
    workspace = store.workspace()
    dispatched = Dispatches()

    def operator_releases(task: Task) -> None:
        with session_scope(store.sessions) as session:
            release_external_id(
                session=session,
                workspace_id=workspace.id,
                external_id="jira:PROJ-1",
                operator="alice",
                reason="abandoned",
            )

    result = create(
        store,
        workspace.id,
        "jira:PROJ-1",
        dispatch=dispatched,
        hooks=CreateHooks(after_insert=operator_releases),
    )

    assert result.outcome is CreateOutcome.CREATED_IDENTITY_LOST
    assert (result.outcome.deduplicated, result.outcome.creation_complete) == (False, True)
    assert result.external_id is None
    assert result.task.external_id_settled_at is None
    assert dispatched == []
    # The work finished: the task and its source link survive without the identity.
    assert (
        store.scalar("SELECT count(*) FROM task_sources WHERE task_id = :id", id=result.task.id)
        == 1
    )
    assert store.scalar("SELECT external_id FROM tasks WHERE id = :id", id=result.task.id) is None


def test_delete_between_insert_and_settle_is_not_found_and_dispatches_nothing(store: Store):
    workspace = store.workspace()
    dispatched = Dispatches()

    def someone_deletes(task: Task) -> None:
        with session_scope(store.sessions) as session:
            delete_task(session=session, caller=TRUSTED, task_id=task.id)

    with pytest.raises(TaskNotFound):
        create(
            store,
            workspace.id,
            "jira:PROJ-1",
            dispatch=dispatched,
            hooks=CreateHooks(after_insert=someone_deletes),
        )
    assert dispatched == []
    assert count_tasks(store) == 0


def test_delete_between_insert_and_settle_without_post_create_work_is_not_found(store: Store):
    workspace = store.workspace()

    def someone_deletes(task: Task) -> None:
        with session_scope(store.sessions) as session:
            delete_task(session=session, caller=TRUSTED, task_id=task.id)

    with pytest.raises(TaskNotFound):
        create(
            store,
            workspace.id,
            "jira:PROJ-1",
            source=None,
            hooks=CreateHooks(after_insert=someone_deletes),
        )


def test_a_race_between_lookup_and_insert_goes_through_the_backstop_to_found(store: Store):
    workspace = store.workspace()
    rivals = []

    def rival_wins_the_race() -> None:
        if not rivals:  # only the first lookup miss; the rival's own create passes here too
            rivals.append(None)
            rivals[0] = create(store, workspace.id, "jira:PROJ-1")

    dispatched = Dispatches()
    result = create(
        store,
        workspace.id,
        "jira:PROJ-1",
        dispatch=dispatched,
        hooks=CreateHooks(after_lookup=rival_wins_the_race),
    )

    assert rivals[0].outcome is CreateOutcome.CREATED
    assert result.outcome is CreateOutcome.FOUND_SETTLED
    assert result.task.id == rivals[0].task.id
    assert dispatched == []
    # The loser's allocation rolled back with its insert: no number burned.
    assert sequence_of(store, workspace.id) == 1
    assert count_tasks(store) == 1


def test_a_retry_against_a_full_wip_step_returns_found_not_a_capacity_error(store: Store):
    workspace = store.workspace(intake_wip_limit=1)
    first = create(store, workspace.id, "jira:PROJ-1")

    again = create(store, workspace.id, "jira:PROJ-1")

    assert again.outcome is CreateOutcome.FOUND_SETTLED
    assert again.task.id == first.task.id
    with pytest.raises(WipLimitReached):
        create(store, workspace.id, "jira:PROJ-2")
    assert sequence_of(store, workspace.id) == 1


def test_a_capacity_failure_after_a_lost_race_rereads_and_returns_found(store: Store):
    workspace = store.workspace(intake_wip_limit=1)
    rivals = []

    def rival_fills_the_step() -> None:
        if not rivals:
            rivals.append(create(store, workspace.id, "jira:PROJ-1"))

    result = create(
        store, workspace.id, "jira:PROJ-1", hooks=CreateHooks(after_lookup=rival_fills_the_step)
    )

    assert result.outcome is CreateOutcome.FOUND_SETTLED
    assert result.task.id == rivals[0].task.id


def test_a_capacity_failure_with_nobody_holding_the_identity_surfaces(store: Store):
    workspace = store.workspace(intake_wip_limit=0)
    with pytest.raises(WipLimitReached):
        create(store, workspace.id, "jira:PROJ-1")
    assert sequence_of(store, workspace.id) == 0


def test_a_violation_of_another_unique_index_is_not_reported_as_found(store: Store):
    workspace = store.workspace()
    create(store, workspace.id, "jira:PROJ-1")
    # Rewind the sequence so the next allocation collides on the identifier index.
    with store.engine.begin() as connection:
        connection.execute(text("UPDATE workspaces SET task_sequence = 0"))

    with pytest.raises(IntegrityError) as raised:
        create(store, workspace.id, "jira:PROJ-2")
    assert "identifier" in str(raised.value)
    assert count_tasks(store) == 1


def test_identities_are_byte_exact_and_case_sensitive(store: Store):
    workspace = store.workspace()
    ids = ["ext-1", "EXT-1", "\u00e9", "e\u0301"]

    results = [create(store, workspace.id, external_id) for external_id in ids]

    assert [r.outcome for r in results] == [CreateOutcome.CREATED] * 4
    assert len({r.task.id for r in results}) == 4
    assert [r.external_id for r in results] == ids
    for external_id, result in zip(ids, results, strict=True):
        assert create(store, workspace.id, external_id).task.id == result.task.id


def test_identities_are_scoped_to_their_workspace(store: Store):
    acme, globex = store.workspace("acme", "ACME"), store.workspace("globex", "GLX")

    in_acme = create(store, acme.id, "jira:PROJ-1")
    in_globex = create(store, globex.id, "jira:PROJ-1")

    assert in_globex.outcome is CreateOutcome.CREATED
    assert in_globex.task.id != in_acme.task.id
    assert in_globex.task.identifier == "GLX-1"


def test_tasks_without_an_external_id_never_collide(store: Store):
    workspace = store.workspace()
    dispatched = Dispatches()

    results = [
        create(store, workspace.id, raw, dispatch=dispatched) for raw in (None, "", "  \u3000 ")
    ]

    assert [r.outcome for r in results] == [CreateOutcome.CREATED] * 3
    assert [r.external_id for r in results] == [None] * 3
    assert [r.task.identifier for r in results] == ["ACME-1", "ACME-2", "ACME-3"]
    assert dispatched == [r.task.id for r in results]


def test_the_stored_identity_is_the_trimmed_value(store: Store):
    workspace = store.workspace()
    result = create(store, workspace.id, "\u00a0 jira:PROJ-1\u2028")
    assert result.external_id == "jira:PROJ-1"
    assert create(store, workspace.id, "jira:PROJ-1").task.id == result.task.id


def test_an_unauthorized_caller_learns_nothing_and_nothing_is_written(store: Store):
    acme, globex = store.workspace("acme", "ACME"), store.workspace("globex", "GLX")
    create(store, acme.id, "jira:PROJ-1")
    outsider = Caller.of_workspaces("globex-token", globex.id)

    # Authorization comes first: an invalid id and a held id get the same answer.
    for external_id in ("jira:PROJ-1", "bad\n", "jira:PROJ-404"):
        with pytest.raises(WorkspaceNotAccessible):
            create(store, acme.id, external_id, caller=outsider)
    with pytest.raises(WorkspaceNotAccessible):
        create(store, 9999, "jira:PROJ-1")
    assert count_tasks(store) == 1
    assert sequence_of(store, acme.id) == 1


def test_validation_precedes_the_lookup(store: Store):
    workspace = store.workspace()
    create(store, workspace.id, "jira:PROJ-1")
    with pytest.raises(ExternalIdHasControlCharacter):
        create(store, workspace.id, "jira:PROJ-1\n")


def test_create_time_validation_runs_after_the_lookup(store: Store):
    workspace = store.workspace()
    first = create(store, workspace.id, "jira:PROJ-1")

    # The sequence's order: a Found retry is answered before create-time validation.
    assert create(store, workspace.id, "jira:PROJ-1", title="").task.id == first.task.id
    with pytest.raises(InvalidTask):
        create(store, workspace.id, "jira:PROJ-2", title="   ")
    assert sequence_of(store, workspace.id) == 1


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (
            SourceLink("github", "https://github.com/o/r/issues/1\u0000", "o/r#1"),
            "source url holds text no database stores (U+0000 at position 31)",
        ),
        (
            SourceLink("github", "https://github.com/o/r/issues/\ud8001", "o/r#1"),
            "source url holds text no database stores (U+D800 at position 30)",
        ),
        (
            SourceLink("jira", "https://acme.atlassian.net/browse/P-1", "P-1\u0000"),
            "source remote_key holds text no database stores (U+0000 at position 3)",
        ),
        (
            SourceLink("jira", "https://acme.atlassian.net/browse/P-1", "P" * 256),
            "source remote_key must be at most 255 characters (got 256)",
        ),
    ],
    ids=["nul-in-url", "surrogate-in-url", "nul-in-key", "key-too-long"],
)
def test_a_source_link_the_database_cannot_store_is_refused_before_the_insert(
    store: Store, source: SourceLink, reason: str
):
    # Found out by the link's write after the insert committed, it would leave
    # a task that never settles, holding the identity for good.
    workspace = store.workspace()
    with pytest.raises(InvalidTask) as refused:
        create(store, workspace.id, "gh-issue/o/r#1", source=source)

    assert str(refused.value) == reason
    assert (count_tasks(store), sequence_of(store, workspace.id)) == (0, 0)


def test_a_description_over_the_limit_or_unstorable_is_refused_before_the_insert(store: Store):
    workspace = store.workspace()
    for description, reason in [
        ("d" * (MAX_DESCRIPTION_LENGTH + 1), "description must be at most 65536 characters"),
        ("nul\u0000", "description holds text no database stores (U+0000 at position 3)"),
    ]:
        with store.sessions() as session, pytest.raises(InvalidTask, match=re.escape(reason)):
            create_task(
                session=session,
                caller=TRUSTED,
                workspace_id=workspace.id,
                new=NewTask(title="t", description=description, external_id="jira:P-1"),
            )
    assert (count_tasks(store), sequence_of(store, workspace.id)) == (0, 0)


def test_writing_the_source_link_twice_is_a_no_op(store: Store):
    from models.tasks import record_task_source

    workspace = store.workspace()
    task = create(store, workspace.id, "jira:PROJ-1").task
    with session_scope(store.sessions) as session:
        record_task_source(session=session, task_id=task.id, source=JIRA)
        record_task_source(
            session=session,
            task_id=task.id,
            source=SourceLink("jira", "https://elsewhere/browse/PROJ-9", "PROJ-9"),
        )
    assert store.scalar("SELECT count(*) FROM task_sources") == 1
    assert store.scalar("SELECT remote_key FROM task_sources") == "PROJ-1"


def test_the_fence_runs_in_the_inserts_transaction_and_a_refusal_inserts_nothing(store: Store):
    workspace = store.workspace()
    seen = []

    def record(session, task):
        seen.append(task.id)
        session.execute(text("UPDATE workspaces SET name = 'touched'"))

    with store.sessions() as session:
        result = create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=workspace.id,
            new=NewTask(title="t", external_id="jira:PROJ-1"),
            fence=record,
        )
    assert seen == [result.task.id]
    assert store.scalar("SELECT name FROM workspaces") == "touched"

    class Refused(Exception):
        pass

    def refuse(session, task):
        session.execute(text("UPDATE workspaces SET name = 'rolled back'"))
        raise Refused()

    with store.sessions() as session, pytest.raises(Refused):
        create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=workspace.id,
            new=NewTask(title="t", external_id="jira:PROJ-2"),
            fence=refuse,
        )
    # Neither the task, nor its sequence number, nor what the fence wrote committed.
    assert store.scalar("SELECT count(*) FROM tasks WHERE external_id = 'jira:PROJ-2'") == 0
    assert store.scalar("SELECT task_sequence FROM workspaces") == 1
    assert store.scalar("SELECT name FROM workspaces") == "touched"
    assert store.scalar("SELECT count(*) FROM task_events WHERE external_id = 'jira:PROJ-2'") == 0
