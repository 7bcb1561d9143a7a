"""bench latency's ramp: which rates it tries, and what it calls a flat step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.latency import _flat, _Ramp

SIZES = SimpleNamespace(latency_ramp_start=25, latency_ramp_max=3200, latency_ramp_precision=1.05)
ANSWERED = {"errors": 0, "completed": 100, "sent": 100}


def searched(capacity: float, sizes=SIZES) -> tuple[list[int], dict]:
    """The rates a search tries against a stack flat up to ``capacity``, and its bracket."""
    ramp, tried = _Ramp(sizes), []
    while ramp.rate is not None:
        tried.append(ramp.rate)
        ramp.tell(ramp.rate <= capacity)
    return tried, ramp.bracket


@pytest.mark.parametrize("capacity", [30, 141, 238, 591, 1000])
def test_the_search_brackets_the_capacity_within_its_precision(capacity: float):
    tried, bracket = searched(capacity)

    assert bracket["highest_flat_rate"] <= capacity < bracket["lowest_rising_rate"]
    assert bracket["lowest_rising_rate"] / bracket["highest_flat_rate"] <= 1.05
    assert tried[:2] == [25, 50] and not bracket["capped"]


def test_a_stack_flat_at_every_rate_is_capped_at_the_most_tried():
    tried, bracket = searched(10_000)

    assert tried[-1] == 3200 and bracket == {
        "highest_flat_rate": 3200,
        "lowest_rising_rate": None,
        "capped": True,
    }


def backlog(rate: int, seconds: float, queued_from: float, queued_to: float):
    """Received and settled times of ``rate`` a second for ``seconds``, the
    queue growing linearly from ``queued_from`` to ``queued_to`` deliveries."""
    count = int(rate * seconds)
    received = [index / rate for index in range(count)]
    settled = []
    for index, at in enumerate(received):
        queue = queued_from + (queued_to - queued_from) * index / count
        settled.append(at + queue / rate)
    return received, settled


def test_a_short_steady_queue_is_flat():
    assert _flat(300, 5.0, *backlog(300, 5.0, 10, 10), ANSWERED)["flat"]


def test_a_growing_queue_is_not_flat():
    verdict = _flat(300, 5.0, *backlog(300, 5.0, 10, 200), ANSWERED)

    assert not verdict["flat"]
    assert verdict["backlog_last_quarter"] > verdict["backlog_second_quarter"] + verdict["bound"]


def test_a_steady_queue_of_more_than_a_quarter_seconds_arrivals_is_not_flat():
    """Held, not kept up with: every delivery waits a third of a second."""
    verdict = _flat(600, 5.0, *backlog(600, 5.0, 200, 200), ANSWERED)

    assert not verdict["flat"] and verdict["queue_bound"] == 150


def test_a_step_with_an_unanswered_request_is_not_flat():
    unanswered = {"errors": 0, "completed": 99, "sent": 100}

    assert not _flat(300, 5.0, *backlog(300, 5.0, 10, 10), unanswered)["flat"]
