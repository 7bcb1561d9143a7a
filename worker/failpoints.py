"""Named fail points: places where a test can make a worker die or stall.

The end-to-end and reliability tests prove that a crash at any step of a
delivery's create loses nothing and duplicates nothing. They set
``TASKHOOK_FAILPOINT`` for the worker process they start::

    TASKHOOK_FAILPOINT=after_insert:kill             # SIGKILL itself there
    TASKHOOK_FAILPOINT=after_settle:pause=2.5        # sleep 2.5 s there
    TASKHOOK_FAILPOINT=after_insert:pause=1,before_ack:kill
    TASKHOOK_FAILPOINT=after_settle:kill@0.1         # ... on one hit in ten, at random
    TASKHOOK_FAILPOINT=after_insert:hold=/tmp/t/go   # stall there until that file exists

A pause races whatever the test waits for meanwhile, and on a busy machine
that can lose; a hold ends when the test says so, by creating the file (a
path without ``,`` or ``@``), so the order of events is the test's, not the
scheduler's. A hold gives up after ``HOLD_LIMIT_SECONDS`` and says so: a test
that died before releasing it must not leave a worker stalled for good.

Under the threads pool (the default) or ``--pool solo`` a kill loses the
whole worker, with every delivery it was running. Under prefork only the
pool child dies and its message is rejected back to the queue
(``task_reject_on_worker_lost``): with a plain ``kill`` the next child dies at
the same point, over and over, so prefork tests kill with a probability
(``kill@P``) and the pool replaces each child it loses.

Every action says what it does on stderr, with the delivery it was working on
and the wall-clock time, before it does it: a test measures recovery from that
line (``fail point after_insert: SIGKILL to pid 412 (delivery 37) at 1732890000.125``).

The variable is read once, when this module is imported; unset (production),
:func:`failpoint` is a test of an empty dict and nothing more. A name or an
action this module does not know is an error at import, so a typo cannot make
a crash test pass by never crashing.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Callable, Mapping

ENVIRONMENT_VARIABLE = "TASKHOOK_FAILPOINT"

#: The lookup by external id missed; nothing is written yet (``Seams.after_lookup``).
#: A pause here widens the race between the lookup and the insert, so that a
#: concurrent create takes the insert's unique-index backstop. PostgreSQL's
#: fast path looks up and inserts in one statement, with no point between
#: them: a worker with this fail point armed takes the general path.
AFTER_LOOKUP = "after_lookup"
#: The task row's insert has committed; the create has not settled (``Seams.after_insert``).
AFTER_INSERT = "after_insert"
#: About to settle: the source link and the settle UPDATE come next. Reached by a
#: first create (right after AFTER_INSERT) and by a redelivery finishing its own create.
BEFORE_SETTLE = "before_settle"
#: The task is settled and committed. On the general path the inbox row is
#: not marked done yet; on PostgreSQL's fast path (``models.fastpath``) it
#: committed with the settlement, so this is the same state as BEFORE_ACK.
AFTER_SETTLE = "after_settle"
#: The inbox row's final state has committed; the broker has not had the ack yet.
BEFORE_ACK = "before_ack"

NAMES = frozenset({AFTER_LOOKUP, AFTER_INSERT, BEFORE_SETTLE, AFTER_SETTLE, BEFORE_ACK})

#: An action, called with the delivery the process is working on (None if unknown).
Action = Callable[[int | None], None]

#: The longest a hold waits for its file (a reliability scenario's own bound).
HOLD_LIMIT_SECONDS = 300.0

# Not seeded from anything a fork copies: every prefork child draws its own.
_chance = random.SystemRandom()


def parse(spec: str) -> dict[str, Action]:
    """``name:kill``, ``name:pause=SECONDS`` or ``name:hold=PATH``, each
    optionally ``@PROBABILITY``, comma-separated, to actions by name."""
    actions: dict[str, Action] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, _, action = item.partition(":")
        name, action = name.strip(), action.strip()
        if name not in NAMES:
            raise ValueError(f"{ENVIRONMENT_VARIABLE}: unknown fail point {name!r}")
        actions[name] = _action(name, action)
    return actions


def _action(name: str, spec: str) -> Action:
    action, at, chance = spec.partition("@")
    probability = _probability(name, chance) if at else 1.0
    run = _run(name, action.strip())
    if probability >= 1.0:
        return run

    def sometimes(delivery: int | None) -> None:
        if _chance.random() < probability:
            run(delivery)

    return sometimes


def _probability(name: str, text: str) -> float:
    try:
        probability = float(text)
    except ValueError:
        probability = -1.0
    if not 0.0 < probability <= 1.0:
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE}: {name} needs a probability in (0, 1] after '@', not {text!r}"
        )
    return probability


def _run(name: str, action: str) -> Action:
    if action == "kill":
        return lambda delivery: _kill(name, delivery)
    kind, _, seconds = action.partition("=")
    if kind == "pause":
        try:
            delay = float(seconds)
        except ValueError:
            delay = -1.0
        if delay >= 0:
            return lambda delivery: _pause(name, delay, delivery)
    if kind == "hold" and seconds:
        return lambda delivery: _hold(name, seconds, delivery)
    raise ValueError(
        f"{ENVIRONMENT_VARIABLE}: {name} needs 'kill', 'pause=SECONDS' or 'hold=PATH', "
        f"not {action!r}"
    )


def _kill(name: str, delivery: int | None) -> None:
    _say(f"fail point {name}: SIGKILL to pid {os.getpid()}{_about(delivery)}")
    os.kill(os.getpid(), signal.SIGKILL)


def _pause(name: str, seconds: float, delivery: int | None) -> None:
    _say(f"fail point {name}: pausing {seconds} s in pid {os.getpid()}{_about(delivery)}")
    time.sleep(seconds)


def _hold(name: str, path: str, delivery: int | None) -> None:
    _say(f"fail point {name}: holding until {path} exists, in pid {os.getpid()}{_about(delivery)}")
    deadline = time.monotonic() + HOLD_LIMIT_SECONDS
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            _say(f"fail point {name}: no {path} after {HOLD_LIMIT_SECONDS:g} s, going on")
            return
        time.sleep(0.02)
    _say(f"fail point {name}: released{_about(delivery)}")


def _about(delivery: int | None) -> str:
    working_on = "" if delivery is None else f" (delivery {delivery})"
    return f"{working_on} at {time.time():.3f}"


def _say(line: str) -> None:
    # stderr, flushed: the process may be gone a microsecond later.
    print(line, file=sys.stderr, flush=True)


def _from_environment(environ: Mapping[str, str]) -> dict[str, Action]:
    spec = environ.get(ENVIRONMENT_VARIABLE)
    return parse(spec) if spec else {}


_ACTIONS: dict[str, Action] = _from_environment(os.environ)


def failpoint(name: str, *, delivery: int | None = None) -> None:
    """Run the action configured for ``name``, if any. Free when none is configured.

    ``delivery`` is the inbox row being worked on, named in what the action prints.
    """
    if _ACTIONS:
        action = _ACTIONS.get(name)
        if action is not None:
            action(delivery)


def armed(name: str) -> bool:
    """True when an action is configured for ``name``."""
    return name in _ACTIONS


def configure(spec: str | None) -> None:
    """Replace the configured fail points (tests of this module; ``None`` clears)."""
    global _ACTIONS
    _ACTIONS = parse(spec) if spec else {}
