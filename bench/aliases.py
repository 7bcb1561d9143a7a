"""``python -m bench aliases``: a create and a lookup through an alias, with
10,000 aliases stored against 1,000,000.

The identity ledger (models/identities.py) answers every create's step 3
after the holder lookup, and a name learned from a move is only in the
ledger. What must not happen is a lookup that grows with the ledger: each
name is one primary-key probe of ``identities``. Two databases are loaded
in bulk, one with each count of alias rows; in each, a set of tasks is
created and given an alias apiece. Then, taking turns round by round:

- **create through an alias**: ``models.tasks.create_task`` under the alias
  (the holder lookup misses, the ledger finds the task: Found, no
  identifier burned);
- **lookup through an alias**: ``models.identities.task_called``, what every
  lookup surface asks.

The figure is the mean latency at the larger size over the smaller one;
the goal is at most 1.2 (issue 32). PostgreSQL only: SQLite's primary-key
probe is the same B-tree walk, and bulk-loading a million rows there says
nothing new.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psycopg

from bench import report
from bench.processes import libpq_url, throwaway_database
from models.access import Caller
from models.db import make_engine, make_session_factory, session_scope
from models.identities import task_called
from models.names import Name
from models.tasks import NewTask, create_task
from models.workspaces import create_workspace

GOAL = 1.2


def _prepare(database: str, aliases: int, targets: int) -> tuple[int, list[str]]:
    """A workspace with ``targets`` tasks, each with one alias, among
    ``aliases`` alias rows in all; the workspace and the targets' aliases."""
    engine = make_engine(database)
    sessions = make_session_factory(engine)
    caller = Caller.trusted("bench")
    with session_scope(sessions) as session:
        workspace_id = create_workspace(
            session=session, slug="aliases", name="Aliases", task_prefix="ALIAS"
        ).id
    moved = []
    for index in range(targets):
        with session_scope(sessions) as session:
            create_task(
                session=session,
                caller=caller,
                workspace_id=workspace_id,
                new=NewTask(
                    title=f"target {index}",
                    external_id=f"gh-issue/bench/target#{index}",
                    moved_from=(f"gh-issue/bench/before#{index}",),
                ),
            )
        moved.append(f"gh-issue/bench/before#{index}")
    engine.dispose()
    # The rest of the aliases, in bulk: names of tasks that do not matter here.
    with psycopg.connect(libpq_url(database), autocommit=True) as connection:
        connection.execute(
            "INSERT INTO identities (workspace_id, kind, name, task_id, state, is_alias, "
            "created_at, changed_at) SELECT %s, 'external', 'gh-issue/bulk/alias#' || g, "
            "1000000 + g, 'held', true, now(), now() FROM generate_series(1, %s) g",
            (workspace_id, max(aliases - targets, 0)),
        )
        connection.execute("ANALYZE identities")
    return workspace_id, moved


def _time(database: str, workspace_id: int, names: list[str]) -> dict[str, list[float]]:
    engine = make_engine(database)
    sessions = make_session_factory(engine)
    caller = Caller.trusted("bench")
    creates, lookups = [], []
    for name in names:
        started = time.perf_counter()
        with session_scope(sessions) as session:
            result = create_task(
                session=session,
                caller=caller,
                workspace_id=workspace_id,
                new=NewTask(title="again", external_id=name),
            )
        creates.append(time.perf_counter() - started)
        if not result.outcome.deduplicated:
            raise AssertionError(f"a create through alias {name} was {result.outcome.value}")
        started = time.perf_counter()
        with sessions() as session:
            found = task_called(session, workspace_id, Name.external(name))
        lookups.append(time.perf_counter() - started)
        if found is None:
            raise AssertionError(f"no task found through alias {name}")
    engine.dispose()
    return {"create": creates, "lookup": lookups}


def aliases(bench: Any) -> dict[str, Any]:
    from bench.loadgen import percentiles

    sizes = bench.sizes
    small, large = sizes.aliases_sizes
    samples: dict[int, dict[str, list[float]]] = {
        size: {"create": [], "lookup": []} for size in (small, large)
    }
    with contextlib.ExitStack() as stack:
        prepared = {}
        for size in (small, large):
            database = stack.enter_context(throwaway_database())
            started = time.monotonic()
            prepared[size] = (database, *_prepare(database, size, sizes.aliases_lookups))
            bench.say(f"  {size:,} aliases stored in {time.monotonic() - started:.1f} s")
        for round_ in range(sizes.aliases_rounds):
            order = (small, large) if round_ % 2 == 0 else (large, small)
            for size in order:
                database, workspace_id, names = prepared[size]
                timed = _time(database, workspace_id, names)
                for what, values in timed.items():
                    samples[size][what] += values

    stats = {
        size: {what: percentiles(values) for what, values in by_what.items()}
        for size, by_what in samples.items()
    }
    ratios = {
        what: report.ratio(stats[large][what]["mean_ms"], stats[small][what]["mean_ms"])
        for what in ("create", "lookup")
    }
    rows = [
        {
            "label": f"{what} via alias\n{size:,} aliases",
            "rate": round(1000 / stats[size][what]["mean_ms"], 1),
            **{k: stats[size][what][k] for k in ("p50_ms", "p95_ms", "p99_ms")},
        }
        for what in ("create", "lookup")
        for size in (small, large)
    ]
    result = {
        "latency": {str(size): by_what for size, by_what in stats.items()},
        "ratios": {f"{what} mean latency {large} / {small}": r for what, r in ratios.items()},
        "goals": {
            f"{what} through an alias at {large:,} aliases within {GOAL}x of {small:,}": (
                ratio <= GOAL
            )
            for what, ratio in ratios.items()
        },
    }
    return bench.finish(
        result, rows, "Aliases: create and lookup through the identity ledger", rate_label="per s"
    )
