"""Which lane a delivery's message takes: live, or background.

The broker's queue is first in, first out for everyone: 3,000 deliveries of
one workspace's flood stood in front of another workspace's ten, whose wait
went from 44 ms to 11.6 s. So there are two queues, and every deliveries
worker consumes both, taking from each in turn (kombu rotates a worker's
queues after each message it takes, on Redis and on the embedded broker; on
RabbitMQ each queue has its own consumer and its own prefetch):

- the **live lane** (``deliveries``): what a sender or an operator waits for
  -- webhook deliveries of a source that is not flooding, one delivery an
  operator replays;
- the **background lane** (``deliveries.background``): a source's flood past
  its share (:class:`FloodGate`), a source an operator sent there, a
  catch-up, a bulk replay, the sweeper's resends, a paused source's backlog
  when it resumes.

However long the background lane, a live delivery waits for one message of
it at most, not for all of it; and the background lane is never starved, as
strict priorities would starve it under steady live traffic.

Every way a delivery's message is sent asks :func:`lane_of` (or, for a
webhook, the ingress's :class:`FloodGate`), so no entrance picks its own
lane. The inbox stays the queue of record: a lane is only where the message
goes, and the sweeper recovers a lost one from either. Order within one
identity holds as before: a redelivery of a delivery is the same inbox row,
and the create is idempotent by external id whichever message comes first
(docs/architecture.md, "Fair share").
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

from models.broker.messages import BACKGROUND_QUEUE, DELIVERIES_QUEUE
from models.settings import Settings


class Lane(enum.StrEnum):
    """A lane is the queue its messages go to."""

    LIVE = DELIVERIES_QUEUE
    BACKGROUND = BACKGROUND_QUEUE


class SourceLane(enum.StrEnum):
    """An operator's choice of lane for one source (``webhook_sources.lane``)."""

    #: Live, unless it floods (:class:`FloodGate`).
    AUTO = "auto"
    #: Always background: its deliveries wait behind everyone's live ones.
    BACKGROUND = "background"


class Sender(enum.Enum):
    """Who sends a delivery's message."""

    #: The ingress, for a delivery its sender just posted: the source's lane
    #: and its share decide (:meth:`FloodGate.lane`).
    WEBHOOK = "webhook"
    #: An operator replaying one delivery they named: they are waiting for it.
    OPERATOR_REPLAY = "operator_replay"
    #: A bulk replay of many deliveries (the CLI, the console).
    BULK_REPLAY = "bulk_replay"
    #: A catch-up recovering what a sender failed to deliver.
    CATCH_UP = "catch_up"
    #: The sweeper resending what the broker lost or whose worker died.
    SWEEPER = "sweeper"
    #: An operator resuming a paused source: its backlog.
    RESUME = "resume"


_LANE_OF_SENDER = {
    Sender.OPERATOR_REPLAY: Lane.LIVE,
    Sender.BULK_REPLAY: Lane.BACKGROUND,
    Sender.CATCH_UP: Lane.BACKGROUND,
    Sender.SWEEPER: Lane.BACKGROUND,
    Sender.RESUME: Lane.BACKGROUND,
}


def lane_of(sender: Sender) -> Lane:
    """The lane of every message ``sender`` sends; a webhook's is the
    ingress's :class:`FloodGate`'s to choose, per source."""
    if sender is Sender.WEBHOOK:
        raise ValueError("a webhook delivery's lane is its source's: FloodGate.lane")
    return _LANE_OF_SENDER[sender]


def keys_per_message(settings: Settings, lane: Lane) -> int:
    """The most keys one message on ``lane`` holds. Fewer on the background
    lane: a worker thread runs a message's keys one after the other, so a
    live delivery arriving meanwhile waits for the thread's message to end."""
    if lane is Lane.BACKGROUND:
        return settings.background_keys_per_message
    return settings.relay_keys_per_message


def lane_of_queue(queue: str | None) -> Lane:
    """The lane a message came in on, by its queue (its routing key): a
    retry goes back to its own lane. Anything unknown is live, as before
    there were lanes."""
    return Lane.BACKGROUND if queue == BACKGROUND_QUEUE else Lane.LIVE


@dataclass
class _Share:
    """One source's share of the live lane: a token bucket."""

    tokens: float
    at: float
    flooding: bool = False


class FloodGate:
    """Each source's share of the live lane, in one ingress process.

    A token bucket per source: ``burst`` deliveries at once, ``rate`` a
    second sustained. A delivery past its source's share starts a flood, and
    the source's deliveries go to the background lane until it has kept
    under ``rate`` long enough to earn its whole burst again -- every
    delivery of a flood spends a token too, so a flood that goes on never
    comes back to the live lane in bursts. Per source, not per workspace: one
    source's flood leaves the workspace's other sources live.

    Per process: with several ingress processes behind a balancer, each sees
    its share of a flood, and a source floods at about ``rate`` times their
    number. Called on the event loop only, so it takes no lock.
    """

    def __init__(
        self, *, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._shares: dict[int, _Share] = {}

    def lane(self, source_id: int, source_lane: SourceLane = SourceLane.AUTO) -> Lane:
        """The lane for a delivery of ``source_id`` posted now."""
        if source_lane is SourceLane.BACKGROUND:
            return Lane.BACKGROUND
        now = self._clock()
        share = self._shares.get(source_id)
        if share is None:
            share = self._shares[source_id] = _Share(tokens=self._burst, at=now)
        share.tokens = min(self._burst, share.tokens + (now - share.at) * self._rate)
        share.at = now
        if share.flooding and share.tokens >= self._burst:
            share.flooding = False  # calm again: it earned its whole burst back
        if not share.flooding and share.tokens >= 1:
            share.tokens -= 1
            return Lane.LIVE
        share.flooding = True
        share.tokens = max(0.0, share.tokens - 1)
        return Lane.BACKGROUND

    def flooding(self) -> list[int]:
        """The sources flooding now: a source calm long enough to have earned
        its burst back is not, though it sent nothing since."""
        now = self._clock()
        return sorted(
            source
            for source, share in self._shares.items()
            if share.flooding and share.tokens + (now - share.at) * self._rate < self._burst
        )
