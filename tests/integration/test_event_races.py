"""Task events exactly once when two writers race, on SQLite and PostgreSQL:
two real threads, each on its own connection, round after round.

A round whose window is *held open* pauses one writer at the point where the
race is lost -- right after it read what decides its write -- long enough for
the other to commit, had nothing made it wait; the other rounds race freely.
A delete against a settlement, two archives against each other: each task
gets one ``task.created``, one ``task.archived`` (docs/contract.md, "Task
events").
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from models.db import make_engine, make_session_factory, session_scope
from models.errors import TaskNotFound
from models.tables import TaskEvent
from models.tasks import CreateHooks, NewTask, archive_task, create_task, delete_task
from tests.support.stores import TRUSTED, Store

FREE_ROUNDS = 40
HELD_ROUNDS = 8
#: How long a writer held at its window waits for the other to commit. The
#: other cannot, when the fix holds: this is what a held round costs.
HELD_SECONDS = 0.2
#: The longest any one wait may take before the round is a failure, not a hang.
PATIENCE_SECONDS = 10


class Writers:
    """Two writers' sessions, each thread on a connection of its own; a hook
    that runs in a thread after a statement it names, once a round."""

    def __init__(self, store: Store) -> None:
        self.engine = make_engine(store.url, pool_size=2, max_overflow=0)
        self.sessions: sessionmaker[Session] = make_session_factory(self.engine)
        self._hooks: dict[int, tuple[Callable[[str], bool], Callable[[], None]]] = {}
        event.listen(self.engine, "after_cursor_execute", self._after)

    def after_statement(self, matches: Callable[[str], bool], then: Callable[[], None]) -> None:
        """In the calling thread, run ``then`` once after the next statement
        ``matches`` accepts."""
        self._hooks[threading.get_ident()] = (matches, then)

    def _after(self, _connection, _cursor, statement, *_args) -> None:
        hook = self._hooks.get(threading.get_ident())
        if hook is not None and hook[0](statement):
            del self._hooks[threading.get_ident()]
            hook[1]()

    def close(self) -> None:
        event.remove(self.engine, "after_cursor_execute", self._after)
        self.engine.dispose()


@pytest.fixture
def writers(store: Store) -> Iterator[Writers]:
    pair = Writers(store)
    try:
        yield pair
    finally:
        pair.close()


def both(first: Callable[[], object], second: Callable[[], object]) -> list[object]:
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(first), pool.submit(second)]
        return [future.result(timeout=PATIENCE_SECONDS * 3) for future in futures]


def events_per_task(store: Store, workspace_id: int) -> dict[int, Counter]:
    with store.sessions() as session:
        rows = session.execute(
            select(TaskEvent.task_id, TaskEvent.type).where(TaskEvent.workspace_id == workspace_id)
        ).all()
    counted: dict[int, Counter] = {}
    for task_id, kind in rows:
        counted.setdefault(task_id, Counter())[kind] += 1
    return counted


def rounds() -> list[tuple[int, bool]]:
    return [(n, False) for n in range(FREE_ROUNDS)] + [
        (FREE_ROUNDS + n, True) for n in range(HELD_ROUNDS)
    ]


# --- a delete racing the settlement ---------------------------------------------------------


def reads_created_events(statement: str) -> bool:
    """The delete's check for the task's ``task.created``: its last read
    before it writes an event."""
    return statement.lstrip().upper().startswith("SELECT") and "task_events" in statement


def delete_racing_the_settlement(
    store: Store, writers: Writers, workspace_id: int, external_id: str, *, held: bool
) -> None:
    """One create whose settlement races a delete of its task, right after
    its insert; ``held``: the delete, having read the task unsettled, waits
    for the settlement to commit (it must not be able to)."""
    inserted = threading.Barrier(2, timeout=PATIENCE_SECONDS)
    checked, settled = threading.Event(), threading.Event()

    def settle_after_the_insert(_task) -> None:
        inserted.wait()
        if held:  # settle only once the delete has read the task unsettled
            assert checked.wait(PATIENCE_SECONDS)

    def create() -> str:
        try:
            with writers.sessions() as session:
                return create_task(
                    session=session,
                    caller=TRUSTED,
                    workspace_id=workspace_id,
                    new=NewTask(title="t", external_id=external_id),
                    hooks=CreateHooks(after_insert=settle_after_the_insert),
                ).outcome.value
        except TaskNotFound:
            return "deleted before it settled"
        finally:
            settled.set()

    def hold_the_window() -> None:
        checked.set()
        settled.wait(HELD_SECONDS)

    def delete() -> str:
        inserted.wait()
        if held:
            writers.after_statement(reads_created_events, hold_the_window)
        task_id = store.scalar("SELECT id FROM tasks WHERE external_id = :e", e=external_id)
        with session_scope(writers.sessions) as session:
            delete_task(session=session, caller=TRUSTED, task_id=task_id)
        return "deleted"

    both(create, delete)


def test_a_delete_racing_the_settlement_appends_task_created_once(store: Store, writers: Writers):
    workspace = store.workspace()
    for number, held in rounds():
        delete_racing_the_settlement(store, writers, workspace.id, f"jira:RACE-{number}", held=held)

    counted = events_per_task(store, workspace.id)
    assert len(counted) == FREE_ROUNDS + HELD_ROUNDS
    for task_id, kinds in counted.items():
        assert kinds == Counter({"task.created": 1, "task.deleted": 1}), (task_id, kinds)
    assert store.scalar("SELECT count(*) FROM tasks") == 0


# --- two archives at once -------------------------------------------------------------------


def reads_the_task(statement: str) -> bool:
    """The archive's read of the task it was asked for."""
    text = statement.lstrip().upper()
    return text.startswith("SELECT") and "FROM TASKS" in text


def archived_twice_at_once(writers: Writers, task_id: int, *, held: bool) -> list[object]:
    """When each of two archives of the task at once says it was archived;
    ``held``: each reads the task before either writes."""
    start = threading.Barrier(2, timeout=PATIENCE_SECONDS)
    both_read = threading.Barrier(2, timeout=PATIENCE_SECONDS)

    def archive() -> object:
        start.wait()
        if held:
            writers.after_statement(reads_the_task, both_read.wait)
        with session_scope(writers.sessions) as session:
            return archive_task(session=session, caller=TRUSTED, task_id=task_id).archived_at

    return both(archive, archive)


def test_two_archives_at_once_append_task_archived_once(store: Store, writers: Writers):
    workspace = store.workspace()
    with store.sessions() as session:
        task_ids = [
            create_task(
                session=session,
                caller=TRUSTED,
                workspace_id=workspace.id,
                new=NewTask(title="t", external_id=f"jira:ARCHIVE-{number}"),
            ).task.id
            for number, _ in rounds()
        ]

    for (_, held), task_id in zip(rounds(), task_ids, strict=True):
        first, second = archived_twice_at_once(writers, task_id, held=held)
        assert first == second  # both answer with the one archive that happened

    counted = events_per_task(store, workspace.id)
    for task_id in task_ids:
        assert counted[task_id] == Counter({"task.created": 1, "task.archived": 1}), (
            task_id,
            counted[task_id],
        )


def test_archiving_an_archived_task_changes_nothing(store: Store):
    workspace = store.workspace()
    with store.sessions() as session:
        task_id = create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=workspace.id,
            new=NewTask(title="t", external_id="jira:ARCHIVE-1"),
        ).task.id
    archived_at = []
    for _ in range(2):
        with session_scope(store.sessions) as session:
            archived_at.append(
                archive_task(session=session, caller=TRUSTED, task_id=task_id).archived_at
            )

    assert archived_at[0] is not None and archived_at[0] == archived_at[1]
    assert events_per_task(store, workspace.id)[task_id] == Counter(
        {"task.created": 1, "task.archived": 1}
    )


@pytest.mark.parametrize("change", [archive_task, delete_task])
def test_a_task_deleted_after_it_was_read_is_task_not_found(store: Store, writers: Writers, change):
    workspace = store.workspace()
    with store.sessions() as session:
        task_id = create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=workspace.id,
            new=NewTask(title="t", external_id="jira:GONE-1"),
        ).task.id

    def deleted_by_another_request() -> None:
        with session_scope(store.sessions) as session:
            delete_task(session=session, caller=TRUSTED, task_id=task_id)

    writers.after_statement(reads_the_task, deleted_by_another_request)
    with pytest.raises(TaskNotFound), session_scope(writers.sessions) as session:
        change(session=session, caller=TRUSTED, task_id=task_id)

    assert events_per_task(store, workspace.id)[task_id] == Counter(
        {"task.created": 1, "task.deleted": 1}
    )
