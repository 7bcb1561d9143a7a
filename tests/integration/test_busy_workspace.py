"""One busy workspace: many concurrent creates into it, a share of them for an
identity that is already held, and the identifiers stay gapless.

Every create that inserts takes the workspace's next number from its counter
row (``workspaces.task_sequence``); a Found outcome must take none
(docs/contract.md, "The create sequence": the lookup precedes the
allocation), and a create that loses the race for an identity at the unique
index rolls its number back with its insert. So after any mix of creates the
workspace's tasks are numbered 1..N, N its counter and its count of tasks.
Run through ``models.tasks.create_task`` on SQLite and PostgreSQL, and through
the worker (on PostgreSQL its fast path, which allocates the number in the
same statement as the insert) on every store the worker tests use.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import select

from models.db import make_engine, make_session_factory, session_scope
from models.tables import Task
from models.tasks import CreateOutcome, NewTask, create_task
from tests.support.feeds import make_feed, store_github_issue
from tests.support.runs import SETTINGS, run
from tests.support.stores import TRUSTED, Store

THREADS = 8
CREATES_PER_THREAD = 24
#: Fewer identities than creates: most are made once and then Found, some
#: by two threads at the same instant.
IDENTITIES = 60


def _numbers(store: Store, workspace_id: int) -> tuple[list[int], int]:
    """The workspace's identifier numbers, sorted, and its counter."""
    with store.sessions() as session:
        identifiers = session.scalars(
            select(Task.identifier).where(Task.workspace_id == workspace_id)
        ).all()
    counter = store.scalar("SELECT task_sequence FROM workspaces WHERE id = :id", id=workspace_id)
    return sorted(int(identifier.rsplit("-", 1)[1]) for identifier in identifiers), counter


def assert_gapless(store: Store, workspace_id: int, tasks: int) -> None:
    numbers, counter = _numbers(store, workspace_id)
    assert numbers == list(range(1, tasks + 1)), numbers
    assert counter == tasks


def test_concurrent_creates_with_found_outcomes_leave_no_gap(store: Store) -> None:
    busy = store.workspace("busy", "BUSY")
    quiet = store.workspace("quiet", "QUIET")
    engine = make_engine(store.url, pool_size=THREADS, max_overflow=0)
    sessions = make_session_factory(engine)
    start = threading.Barrier(THREADS)

    def creator(thread: int) -> list[tuple[int, str, CreateOutcome]]:
        start.wait()
        made = []
        for n in range(CREATES_PER_THREAD):
            # Neighbouring threads walk the identities in step, so the same
            # identity is often created by two of them at once.
            identity = f"busy-{(n * 5 + thread // 2) % IDENTITIES}"
            # One call in six goes to another workspace, whose counter is its own.
            workspace = quiet if n % 6 == thread % 6 else busy
            with session_scope(sessions) as session:
                result = create_task(
                    session=session,
                    caller=TRUSTED,
                    workspace_id=workspace.id,
                    new=NewTask(title=f"Busy {identity}", external_id=identity),
                )
            made.append((workspace.id, identity, result.outcome))
        return made

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            results = [entry for made in pool.map(creator, range(THREADS)) for entry in made]
    finally:
        engine.dispose()

    assert len(results) == THREADS * CREATES_PER_THREAD
    for workspace in (busy, quiet):
        mine = [(identity, outcome) for ws, identity, outcome in results if ws == workspace.id]
        outcomes = Counter(outcome for _identity, outcome in mine)
        identities = {identity for identity, _outcome in mine}
        # One task per identity, each made by exactly one create; the rest Found.
        assert outcomes[CreateOutcome.CREATED] == len(identities), outcomes
        found = outcomes[CreateOutcome.FOUND_SETTLED] + outcomes[CreateOutcome.FOUND_UNSETTLED]
        assert found == len(mine) - len(identities) > 0, outcomes
        assert_gapless(store, workspace.id, len(identities))


def test_concurrent_deliveries_into_one_workspace_leave_no_gap(store: Store) -> None:
    """The worker's runs (the fast path, on either database) from several threads,
    deliveries of 12 issues, each delivered three times under ids of its own."""
    feed = make_feed(store.sessions, "busy", "BUSY")
    issues = 12
    # Each issue delivered three times, under ids and bytes of its own.
    pks = [
        store_github_issue(store.sessions, feed, number)
        for _ in range(3)
        for number in range(1, issues + 1)
    ]
    start = threading.Barrier(4)

    def worker(thread: int) -> list:
        start.wait()
        return [run(store, pk, settings=SETTINGS) for pk in pks[thread::4]]

    with ThreadPoolExecutor(4) as pool:
        processed = [one for ran in pool.map(worker, range(4)) for one in ran]

    outcomes = Counter(one.outcome for one in processed)
    # A copy that met its issue's task still unsettled holds its lease until
    # its retry is due; run it again then, as its retry message would.
    waiting = [one for one in processed if one.retry_in is not None]
    if waiting:
        time.sleep(max(one.retry_in for one in waiting))
    for one in waiting:
        outcomes[run(store, one.delivery_pk, settings=SETTINGS).outcome] += 1
    outcomes.pop("found_unsettled", None)
    assert outcomes["created"] == issues, outcomes
    assert outcomes["found_settled"] == 2 * issues, outcomes
    if store.takes_fast_path:
        assert any(one.path == "fast" for one in processed)
    assert_gapless(store, feed.workspace_id, issues)
