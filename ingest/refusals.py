"""When this process answered deliveries 503 because it could not store them.

GitHub never sends a delivery again by itself: one answered 503 is the
catch-up's to recover. The webhook route says :meth:`Refusals.refused` on
each such answer and :meth:`Refusals.stored` on each stored delivery; a
stretch from the first refusal to the next delivery stored is handed to the
heartbeat (``ingest.heartbeat``), which records it for ``taskhook stats``
(``models.uptime.ingress_refused``). Both run on the event loop: no lock.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from models.tables import utcnow


class Refusals:
    def __init__(self) -> None:
        #: The first refusal of the stretch under way; None while storing.
        self.since: datetime | None = None
        #: Stretches over, not yet recorded: (first refusal, next stored).
        self.ended: list[tuple[datetime, datetime]] = []
        #: Set when a stretch ends, so the heartbeat records it at once.
        self.changed = asyncio.Event()

    def refused(self) -> None:
        if self.since is None:
            self.since = utcnow()

    def stored(self) -> None:
        if self.since is not None:
            self.ended.append((self.since, utcnow()))
            self.since = None
            self.changed.set()

    def pending(self) -> list[tuple[datetime, datetime]]:
        """The stretches over, not yet recorded; kept until :meth:`recorded`."""
        return list(self.ended)

    def recorded(self, count: int) -> None:
        del self.ended[:count]
        if not self.ended:
            self.changed.clear()
