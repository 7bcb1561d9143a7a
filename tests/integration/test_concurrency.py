"""Many creates of one identity at the same instant: exactly one task.

32 threads, each with its own connection, released together by a barrier,
ten rounds in a row. On PostgreSQL the race is real (row locks, the unique
index, the backstop); SQLite serializes writers, and must give the same answer.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from models.db import make_engine, make_session_factory
from models.tasks import CreateHooks, CreateOutcome, NewTask, create_task
from tests.support.stores import TRUSTED, Store

THREADS = 32
ROUNDS = 10


def race(store: Store, workspace_id: int, external_id: str) -> tuple[list, int]:
    """Every thread's result, and how many threads missed the lookup (the rest
    of them went through the backstop or the re-read after a failed insert)."""
    misses = []
    hooks = CreateHooks(after_lookup=lambda: misses.append(1))
    engine = make_engine(store.url, pool_size=THREADS, max_overflow=0)
    sessions = make_session_factory(engine)
    start = threading.Barrier(THREADS)

    def one_create(_: int):
        start.wait()
        with sessions() as session:
            return create_task(
                session=session,
                caller=TRUSTED,
                workspace_id=workspace_id,
                new=NewTask(title="Race", external_id=external_id),
                hooks=hooks,
            )

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            return list(pool.map(one_create, range(THREADS))), len(misses)
    finally:
        engine.dispose()


@pytest.mark.parametrize("round_number", range(ROUNDS))
def test_concurrent_creates_of_one_identity_make_exactly_one_task(store: Store, round_number):
    workspace = store.workspace()
    external_id = f"jira:RACE-{round_number}"

    results, lookup_misses = race(store, workspace.id, external_id)
    print(f"{store.dialect} round {round_number}: {lookup_misses} of {THREADS} missed the lookup")

    outcomes = Counter(result.outcome for result in results)
    assert outcomes[CreateOutcome.CREATED] == 1, outcomes
    assert outcomes[CreateOutcome.FOUND_SETTLED] + outcomes[CreateOutcome.FOUND_UNSETTLED] == 31
    assert len({result.task.id for result in results}) == 1
    assert store.scalar("SELECT count(*) FROM tasks") == 1
    assert store.scalar("SELECT task_sequence FROM workspaces WHERE id = :id", id=workspace.id) == 1
