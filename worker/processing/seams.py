"""Where a delivery's run lets something step in: a test, or a fail point.

A run passes five places at which a crash or a race matters (after the
lookup, after the insert, before the settlement, after it, and before the
broker's ack), and a :class:`Seams` holds what runs at each. Tests build
one with the callables they need; production runs :data:`FAILPOINTS`, whose
every seam calls its fail point (``worker.failpoints``), so no other
production code names a fail point.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from models.tables import Task
from models.tasks import CreateHooks
from worker.failpoints import (
    AFTER_INSERT,
    AFTER_LOOKUP,
    AFTER_SETTLE,
    BEFORE_ACK,
    BEFORE_SETTLE,
    armed,
    failpoint,
)


def _nothing(*_args: object) -> None:
    return None


@dataclass(frozen=True)
class Seams:
    """What runs at each seam of a delivery's run; by default nothing."""

    #: After a lookup that missed, before the insert; nothing is written yet.
    #: None: nothing runs there, so the fast path may look up and insert in
    #: one step (docs/architecture.md, "The fast path").
    after_lookup: Callable[[], None] | None = None
    #: The task's insert has committed; it has not settled.
    after_insert: Callable[[Task], None] = _nothing
    #: About to settle: the source link and the settlement come next. With
    #: the delivery's key, as are the seams below.
    before_settle: Callable[[int], None] = _nothing
    #: The task is settled and committed.
    after_settle: Callable[[int], None] = _nothing
    #: The delivery's record has committed; the broker has not had the ack.
    before_ack: Callable[[int], None] = _nothing

    def between_lookup_and_insert(self) -> Callable[[], None] | None:
        """What must run between the create's lookup and its insert, if anything."""
        return self.after_lookup

    def create_hooks(self, *, after_lookup_missed: Callable[[], None]) -> CreateHooks:
        """The seams as ``models.tasks.create_task`` takes them, with
        ``after_lookup_missed`` run first after a lookup that missed."""
        between = self.between_lookup_and_insert()

        def after_lookup() -> None:
            after_lookup_missed()
            if between is not None:
                between()

        def after_insert(task: Task) -> None:
            self.after_insert(task)
            self.before_settle(task.created_by_delivery)

        return CreateHooks(after_lookup=after_lookup, after_insert=after_insert)


class _FailPointSeams(Seams):
    """Each seam calls its fail point; the one after the lookup only while it
    is armed, so that a worker with no fail point there keeps the fast path."""

    def between_lookup_and_insert(self) -> Callable[[], None] | None:
        return self.after_lookup if armed(AFTER_LOOKUP) else None


#: The seams production runs: fail points, free while none is configured.
FAILPOINTS: Seams = _FailPointSeams(
    after_lookup=lambda: failpoint(AFTER_LOOKUP),
    after_insert=lambda task: failpoint(AFTER_INSERT, delivery=task.created_by_delivery),
    before_settle=lambda delivery: failpoint(BEFORE_SETTLE, delivery=delivery),
    after_settle=lambda delivery: failpoint(AFTER_SETTLE, delivery=delivery),
    before_ack=lambda delivery: failpoint(BEFORE_ACK, delivery=delivery),
)
