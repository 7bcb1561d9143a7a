"""Named fail points: places where a test can make a worker die or stall.

The end-to-end tests prove that a crash at any step of a delivery's create
loses nothing and duplicates nothing. They set ``TASKHOOK_FAILPOINT`` for the
worker process they start::

    TASKHOOK_FAILPOINT=after_insert:kill             # SIGKILL itself there
    TASKHOOK_FAILPOINT=after_settle:pause=2.5        # sleep 2.5 s there
    TASKHOOK_FAILPOINT=after_insert:pause=1,before_ack:kill

Kill with ``--pool solo``: under prefork only the pool child dies, its message
is rejected back to the queue (``task_reject_on_worker_lost``), and the next
child dies at the same point, over and over.

The variable is read once, when this module is imported; unset (production),
:func:`failpoint` is a test of an empty dict and nothing more. A name or an
action this module does not know is an error at import, so a typo cannot make
a crash test pass by never crashing.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Mapping

ENVIRONMENT_VARIABLE = "TASKHOOK_FAILPOINT"

#: The task row's insert has committed; the create has not settled (``CreateHooks.after_insert``).
AFTER_INSERT = "after_insert"
#: About to settle: the source link and the settle UPDATE come next. Reached by a
#: first create (right after AFTER_INSERT) and by a redelivery finishing its own create.
BEFORE_SETTLE = "before_settle"
#: The task is settled and committed; the inbox row is not marked done yet.
AFTER_SETTLE = "after_settle"
#: The inbox row's final state has committed; the broker has not had the ack yet.
BEFORE_ACK = "before_ack"

NAMES = frozenset({AFTER_INSERT, BEFORE_SETTLE, AFTER_SETTLE, BEFORE_ACK})

Action = Callable[[], None]


def parse(spec: str) -> dict[str, Action]:
    """``name:kill`` or ``name:pause=SECONDS``, comma-separated, to actions by name."""
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


def _action(name: str, action: str) -> Action:
    if action == "kill":
        return lambda: _kill(name)
    kind, _, seconds = action.partition("=")
    if kind == "pause":
        try:
            delay = float(seconds)
        except ValueError:
            delay = -1.0
        if delay >= 0:
            return lambda: _pause(name, delay)
    raise ValueError(
        f"{ENVIRONMENT_VARIABLE}: {name} needs 'kill' or 'pause=SECONDS', not {action!r}"
    )


def _kill(name: str) -> None:
    _say(f"fail point {name}: SIGKILL to pid {os.getpid()}")
    os.kill(os.getpid(), signal.SIGKILL)


def _pause(name: str, seconds: float) -> None:
    _say(f"fail point {name}: pausing {seconds} s")
    time.sleep(seconds)


def _say(line: str) -> None:
    # stderr, flushed: the process may be gone a microsecond later.
    print(line, file=sys.stderr, flush=True)


def _from_environment(environ: Mapping[str, str]) -> dict[str, Action]:
    spec = environ.get(ENVIRONMENT_VARIABLE)
    return parse(spec) if spec else {}


_ACTIONS: dict[str, Action] = _from_environment(os.environ)


def failpoint(name: str) -> None:
    """Run the action configured for ``name``, if any. Free when none is configured."""
    if _ACTIONS:
        action = _ACTIONS.get(name)
        if action is not None:
            action()


def configure(spec: str | None) -> None:
    """Replace the configured fail points (tests of this module; ``None`` clears)."""
    global _ACTIONS
    _ACTIONS = parse(spec) if spec else {}
