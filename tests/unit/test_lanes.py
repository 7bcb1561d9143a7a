"""Which lane a delivery's message takes (models.broker.lanes)."""

from __future__ import annotations

import pytest

from models.broker.lanes import FloodGate, Lane, Sender, SourceLane, lane_of, lane_of_queue
from models.broker.messages import BACKGROUND_QUEUE, DELIVERIES_QUEUE


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_source_within_its_share_stays_live() -> None:
    clock = Clock()
    gate = FloodGate(rate=10, burst=5, clock=clock)
    for _ in range(100):  # 5 a second, under its rate of 10
        assert gate.lane(1) is Lane.LIVE
        clock.now += 0.2
    assert gate.flooding() == []


def test_a_flood_goes_background_past_its_burst_and_leaves_other_sources_live() -> None:
    clock = Clock()
    gate = FloodGate(rate=10, burst=5, clock=clock)
    lanes = [gate.lane(1) for _ in range(50)]  # all at once
    assert lanes == [Lane.LIVE] * 5 + [Lane.BACKGROUND] * 45
    assert gate.flooding() == [1]
    # Another source of the same workspace, or of another, is not held up.
    assert gate.lane(2) is Lane.LIVE


def test_a_flood_that_goes_on_stays_background_and_comes_back_once_calm() -> None:
    clock = Clock()
    gate = FloodGate(rate=10, burst=5, clock=clock)
    for _ in range(10):
        gate.lane(1)
    # Going on at twice its rate for a minute: never back on the live lane
    # in bursts, though the bucket earns a token every 0.1 s.
    for _ in range(1200):
        clock.now += 0.05
        assert gate.lane(1) is Lane.BACKGROUND
    # Under its rate, not yet long enough to earn its burst back: still a flood.
    clock.now += 0.3
    assert gate.lane(1) is Lane.BACKGROUND
    assert gate.flooding() == [1]
    # Calm for its whole burst's worth of time: no longer a flood, and live again.
    clock.now += 0.6
    assert gate.flooding() == []
    assert gate.lane(1) is Lane.LIVE


def test_an_operator_sends_a_source_to_the_background_lane() -> None:
    gate = FloodGate(rate=10, burst=5, clock=Clock())
    assert gate.lane(1, SourceLane.BACKGROUND) is Lane.BACKGROUND
    assert gate.lane(1, SourceLane.AUTO) is Lane.LIVE


def test_every_sender_but_the_webhook_has_one_lane() -> None:
    assert lane_of(Sender.OPERATOR_REPLAY) is Lane.LIVE
    for sender in (Sender.BULK_REPLAY, Sender.CATCH_UP, Sender.SWEEPER, Sender.RESUME):
        assert lane_of(sender) is Lane.BACKGROUND
    with pytest.raises(ValueError, match="FloodGate"):
        lane_of(Sender.WEBHOOK)


def test_a_retry_keeps_the_lane_it_came_in_on() -> None:
    assert lane_of_queue(BACKGROUND_QUEUE) is Lane.BACKGROUND
    assert lane_of_queue(DELIVERIES_QUEUE) is Lane.LIVE
    assert lane_of_queue(None) is Lane.LIVE
