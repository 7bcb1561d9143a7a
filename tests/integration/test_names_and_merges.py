"""A task answers to every live name the identity ledger gives it, and an
operator's merge of two tasks for one item is audited and undoable
(docs/contract.md §15, items 9 and 10), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from models.access import Caller
from models.db import session_scope
from models.errors import InvalidMerge, MergeNotFound, MergeRefused, TaskNotFound
from models.events import EventType
from models.identities import IdentityState, learn_move, list_names, names_shown, task_called
from models.merges import get_merge, list_merges, merge, plan_merge, unmerge
from models.names import Move, Name
from models.tables import IdentityMerge, Task, TaskEvent, utcnow
from models.tasks import (
    CreateOutcome,
    NewTask,
    SourceLink,
    archive_task,
    create_task,
    delete_task,
    find_task_by_external_id,
    release_external_id,
)
from tests.support.invariants import assert_invariants, violations
from tests.support.stores import TRUSTED, Store

#: The same Jira issue before and after a site migration gave it new ids.
OLD_SITE = "jira:OPS-7"
NEW_SITE = "jira:OPS2-7"


def _create(store: Store, workspace_id: int, external_id: str | None, **fields):
    with store.sessions() as session:
        return create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=workspace_id,
            new=NewTask(title=f"Task {external_id}", external_id=external_id, **fields),
        )


def _lookup(store: Store, workspace_id: int, name: str) -> Task | None:
    with store.sessions() as session:
        return find_task_by_external_id(
            session=session, caller=TRUSTED, workspace_id=workspace_id, external_id=name
        )


def _two_tasks(store: Store) -> tuple[int, Task, Task]:
    ws = store.workspace().id
    into = _create(store, ws, OLD_SITE).task
    from_ = _create(store, ws, NEW_SITE).task
    return ws, into, from_


def _merge(store: Store, into: int, from_: int, **audit):
    with session_scope(store.sessions) as session:
        return merge(
            session=session,
            caller=TRUSTED,
            into_task_id=into,
            from_task_id=from_,
            operator=audit.get("operator", "ops"),
            reason=audit.get("reason", "the Jira site migration"),
        )


def _unmerge(store: Store, merge_id, operator="ops", reason="merged the wrong tasks"):
    with session_scope(store.sessions) as session:
        return unmerge(
            session=session, caller=TRUSTED, merge_id=merge_id, operator=operator, reason=reason
        )


def _ledger(store: Store, ws: int) -> dict[str, tuple[int, str, bool, int | None]]:
    with store.sessions() as session:
        rows = list_names(session, workspace_id=ws, limit=10_000)
    return {row.name: (row.task_id, row.state, row.alias, row.merge_id) for row in rows}


def _task(store: Store, task_id: int) -> Task:
    with store.sessions() as session:
        return session.get(Task, task_id)


# --- lookup by any name -----------------------------------------------------------------------


def test_a_lookup_by_an_alias_a_move_taught_finds_the_task(store: Store):
    ws = store.workspace().id
    task = _create(store, ws, "jira:TCP-2").task
    with session_scope(store.sessions) as session:
        learn_move(
            session,
            workspace_id=ws,
            move=Move(Name.external("jira:TCP-2"), Name.external("jira:INDEV-130")),
        )

    assert _lookup(store, ws, "jira:INDEV-130").id == task.id
    assert _lookup(store, ws, "jira:TCP-2").id == task.id
    with store.sessions() as session:
        shown = names_shown(session, [task.id])[task.id]
    assert [(n.name, n.state, n.alias) for n in shown] == [
        ("jira:TCP-2", "held", False),
        ("jira:INDEV-130", "held", True),
    ]


def test_a_lookup_finds_the_task_by_its_stable_key_and_a_learned_rename(store: Store):
    ws = store.workspace().id
    task = _create(store, ws, "gh-issue/old/repo#3", stable_key="github:repo/991#3").task
    with session_scope(store.sessions) as session:
        learn_move(
            session,
            workspace_id=ws,
            move=Move(
                Name.external("gh-issue/old/repo#"),
                Name.external("gh-issue/new/repo#"),
                prefix=True,
            ),
        )
        assert task_called(session, ws, Name.stable("github:repo/991#3")) == task.id
        assert task_called(session, ws, Name.external("gh-issue/new/repo#3")) == task.id
        assert task_called(session, ws, Name.external("gh-issue/new/repo#4")) is None


def test_an_archived_task_answers_to_its_alias_and_a_deleted_or_released_one_does_not(
    store: Store,
):
    ws = store.workspace().id
    archived = _create(store, ws, "jira:A-1", moved_from=("jira:OLD-A-1",)).task
    deleted = _create(store, ws, "jira:D-1", moved_from=("jira:OLD-D-1",)).task
    _create(store, ws, "jira:R-1", moved_from=("jira:OLD-R-1",))
    with session_scope(store.sessions) as session:
        archive_task(session=session, caller=TRUSTED, task_id=archived.id)
        delete_task(session=session, caller=TRUSTED, task_id=deleted.id)
        release_external_id(
            session=session,
            workspace_id=ws,
            external_id="jira:R-1",
            operator="ops",
            reason="abandoned",
        )

    assert _lookup(store, ws, "jira:OLD-A-1").id == archived.id
    assert _lookup(store, ws, "jira:OLD-D-1") is None
    # A release frees the identity together with its aliases.
    assert _lookup(store, ws, "jira:OLD-R-1") is None
    assert _lookup(store, ws, "jira:R-1") is None


def test_a_lookup_never_crosses_workspaces(store: Store):
    acme, globex = store.workspace().id, store.workspace("globex", "GLX").id
    _create(store, acme, "jira:X-1", moved_from=("jira:OLD-X-1",))
    assert _lookup(store, globex, "jira:OLD-X-1") is None
    with store.sessions() as session, pytest.raises(Exception, match="not found"):
        find_task_by_external_id(
            session=session,
            caller=Caller.of_workspaces("globex-only", globex),
            workspace_id=acme,
            external_id="jira:OLD-X-1",
        )


# --- merge ------------------------------------------------------------------------------------


def test_a_merge_makes_the_names_aliases_archives_the_other_task_and_audits(store: Store):
    ws, into, from_ = _two_tasks(store)

    done = _merge(store, into.id, from_.id, operator="ana", reason="site migration")

    assert _ledger(store, ws) == {
        OLD_SITE: (into.id, "held", False, None),
        NEW_SITE: (into.id, "held", True, done.id),
    }
    assert _lookup(store, ws, NEW_SITE).id == into.id
    merged_from = _task(store, from_.id)
    assert merged_from.archived_at is not None and merged_from.external_id is None
    assert merged_from.external_id_settled_at is None
    assert (done.operator, done.reason, done.undone) == ("ana", "site migration", False)
    assert [(n.name, n.state, n.is_alias) for n in done.names] == [(NEW_SITE, "held", False)]
    with store.sessions() as session:
        archived = session.scalars(
            select(TaskEvent.external_id).where(
                TaskEvent.task_id == from_.id, TaskEvent.type == EventType.ARCHIVED.value
            )
        ).all()
    assert archived == [NEW_SITE]


def test_a_create_under_a_merged_name_is_found_and_burns_no_identifier(store: Store):
    ws, into, from_ = _two_tasks(store)
    _merge(store, into.id, from_.id)

    again = _create(store, ws, NEW_SITE)

    assert again.outcome is CreateOutcome.FOUND_SETTLED and again.task.id == into.id
    with store.sessions() as session:
        assert session.scalar(select(Task.id).order_by(Task.id.desc()).limit(1)) == from_.id


def test_an_undo_puts_everything_back(store: Store):
    ws, into, from_ = _two_tasks(store)
    before = _task(store, from_.id)
    done = _merge(store, into.id, from_.id)

    undone = _unmerge(store, done.id, operator="bo", reason="two items after all")

    assert _ledger(store, ws) == {
        OLD_SITE: (into.id, "held", False, None),
        NEW_SITE: (from_.id, "held", False, None),
    }
    back = _task(store, from_.id)
    assert back.archived_at is None and back.external_id == NEW_SITE
    assert back.external_id_settled_at == before.external_id_settled_at
    assert _lookup(store, ws, NEW_SITE).id == from_.id
    assert undone.undone_by == "bo" and undone.undone_at is not None
    assert undone.reason == "the Jira site migration | undone: two items after all"


def test_a_stable_key_moves_with_the_merge_and_back_with_the_undo(store: Store):
    """A task holds its stable key on its row: the merge writes it into the
    ledger as the other task's alias, and the undo gives it back to the row."""
    ws = store.workspace().id
    into = _create(store, ws, OLD_SITE).task
    from_ = _create(store, ws, NEW_SITE, stable_key="jira-issue:10042").task
    key = Name.stable("jira-issue:10042")

    done = _merge(store, into.id, from_.id)

    assert {(n.kind, n.name) for n in done.names} == {
        ("external", NEW_SITE),
        ("stable", "jira-issue:10042"),
    }
    assert _task(store, from_.id).stable_key is None
    assert _ledger(store, ws)["jira-issue:10042"] == (into.id, "held", True, done.id)
    with store.sessions() as session:
        assert task_called(session, ws, key) == into.id

    _unmerge(store, done.id)

    assert _task(store, from_.id).stable_key == "jira-issue:10042"
    assert _ledger(store, ws)["jira-issue:10042"] == (from_.id, "held", False, None)
    with store.sessions() as session:
        assert task_called(session, ws, key) == from_.id


def test_an_undo_leaves_a_task_archived_before_the_merge_archived(store: Store):
    ws, into, from_ = _two_tasks(store)
    with session_scope(store.sessions) as session:
        archive_task(session=session, caller=TRUSTED, task_id=from_.id)
    done = _merge(store, into.id, from_.id)
    assert [n.state for n in done.names] == ["archived"]

    _unmerge(store, done.id)

    back = _task(store, from_.id)
    assert back.archived_at is not None and back.external_id == NEW_SITE
    assert _ledger(store, ws)[NEW_SITE] == (from_.id, "archived", False, None)


def test_a_merge_into_an_archived_task_keeps_the_names_archived(store: Store):
    ws, into, from_ = _two_tasks(store)
    with session_scope(store.sessions) as session:
        archive_task(session=session, caller=TRUSTED, task_id=into.id)
    _merge(store, into.id, from_.id)
    assert _ledger(store, ws)[NEW_SITE][:2] == (into.id, IdentityState.ARCHIVED)


def test_merges_chain_and_undo_in_turn(store: Store):
    ws, into, from_ = _two_tasks(store)
    third = _create(store, ws, "jira:OPS3-7").task
    first = _merge(store, from_.id, third.id)
    second = _merge(store, into.id, from_.id)
    assert {n.name for n in second.names} == {NEW_SITE, "jira:OPS3-7"}

    _unmerge(store, second.id)
    assert _ledger(store, ws)["jira:OPS3-7"] == (from_.id, "held", True, first.id)
    _unmerge(store, first.id)

    assert _ledger(store, ws)["jira:OPS3-7"] == (third.id, "held", False, None)
    assert _task(store, third.id).external_id == "jira:OPS3-7"


def test_a_release_after_a_merge_frees_the_merged_names_too_and_the_undo_refuses(store: Store):
    ws, into, from_ = _two_tasks(store)
    done = _merge(store, into.id, from_.id)
    with session_scope(store.sessions) as session:
        release_external_id(
            session=session, workspace_id=ws, external_id=OLD_SITE, operator="ops", reason="x"
        )
    assert _lookup(store, ws, NEW_SITE) is None

    with pytest.raises(MergeRefused, match="moved on since"):
        _unmerge(store, done.id)


def test_the_stores_promises_hold_through_a_merge_and_its_undo(store: Store):
    ws = store.workspace().id
    into, from_ = (
        _create(
            store,
            ws,
            f"jira:{key}",
            source=SourceLink("jira", f"https://old.atlassian.net/browse/{key}", key),
        ).task
        for key in ("OPS-7", "OPS2-7")
    )
    done = _merge(store, into.id, from_.id)
    # The task merged from lost its identity by the merge's audit row.
    assert_invariants(store.engine)
    with session_scope(store.sessions) as session:
        session.get(IdentityMerge, done.id).undone_at = utcnow()
    assert "without an audit row" in " ".join(violations(store.engine).violations)
    with session_scope(store.sessions) as session:
        session.get(IdentityMerge, done.id).undone_at = None

    _unmerge(store, done.id)

    assert_invariants(store.engine)


def test_a_merge_never_deletes_a_task(store: Store):
    _ws, into, from_ = _two_tasks(store)
    _merge(store, into.id, from_.id)
    with store.sessions() as session:
        assert session.scalar(select(Task.id).where(Task.id == from_.id)) == from_.id


def test_a_plan_says_what_a_merge_would_do_and_changes_nothing(store: Store):
    ws, into, from_ = _two_tasks(store)
    with store.sessions() as session:
        plan = plan_merge(
            session=session, caller=TRUSTED, into_task_id=into.id, from_task_id=from_.id
        )
    assert [n.name for n in plan.moving] == [NEW_SITE]
    assert plan.archives_from and plan.into.external_id == OLD_SITE
    assert _ledger(store, ws)[NEW_SITE] == (from_.id, "held", False, None)


def test_merges_are_listed_by_task_and_by_workspace(store: Store):
    _ws, into, from_ = _two_tasks(store)
    done = _merge(store, into.id, from_.id)
    other = store.workspace("globex", "GLX").id
    with store.sessions() as session:
        assert [m.id for m in list_merges(session=session, caller=TRUSTED, task_id=into.id)] == [
            done.id
        ]
        assert list_merges(session=session, caller=TRUSTED, workspace_id=other) == []
        hidden = Caller.of_workspaces("globex-only", other)
        assert list_merges(session=session, caller=hidden) == []
        with pytest.raises(MergeNotFound):
            get_merge(session=session, caller=hidden, merge_id=done.id)


# --- refusals ---------------------------------------------------------------------------------


def test_a_task_cannot_be_merged_into_itself(store: Store):
    _, into, _ = _two_tasks(store)
    with pytest.raises(InvalidMerge, match="itself"):
        _merge(store, into.id, into.id)


def test_tasks_of_two_workspaces_cannot_be_merged(store: Store):
    ws = store.workspace().id
    other = store.workspace("globex", "GLX").id
    into = _create(store, ws, OLD_SITE).task
    from_ = _create(store, other, NEW_SITE).task
    with pytest.raises(InvalidMerge, match="different workspaces"):
        _merge(store, into.id, from_.id)


def test_a_task_without_names_has_nothing_to_merge(store: Store):
    ws = store.workspace().id
    into = _create(store, ws, OLD_SITE).task
    nameless = _create(store, ws, None).task
    with pytest.raises(MergeRefused, match="answers to no name"):
        _merge(store, into.id, nameless.id)


def test_an_unknown_task_or_merge_is_not_found(store: Store):
    _, into, _ = _two_tasks(store)
    with pytest.raises(TaskNotFound, match="task 999999"):
        _merge(store, into.id, 999999)
    with pytest.raises(MergeNotFound):
        _unmerge(store, 999999)


def test_a_merge_needs_an_operator_and_a_reason(store: Store):
    _, into, from_ = _two_tasks(store)
    with pytest.raises(InvalidMerge, match="operator"):
        _merge(store, into.id, from_.id, operator=" ")
    with pytest.raises(InvalidMerge, match="reason"):
        _merge(store, into.id, from_.id, reason="")
    with pytest.raises(InvalidMerge, match="control characters"):
        _merge(store, into.id, from_.id, reason="a\x1b[2Jb")
    with store.sessions() as session:
        assert session.scalar(select(IdentityMerge.id)) is None


def test_a_merge_undone_twice_is_refused(store: Store):
    _, into, from_ = _two_tasks(store)
    done = _merge(store, into.id, from_.id)
    _unmerge(store, done.id)
    with pytest.raises(MergeRefused, match="undone already"):
        _unmerge(store, done.id)


def test_an_undo_after_the_task_merged_from_was_deleted_is_refused(store: Store):
    _, into, from_ = _two_tasks(store)
    done = _merge(store, into.id, from_.id)
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=from_.id)
    with pytest.raises(MergeRefused, match="deleted since"):
        _unmerge(store, done.id)
