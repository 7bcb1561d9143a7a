"""The stretch a process answered deliveries 503: from its first refusal to
the next delivery it stored, kept until the heartbeat has recorded it."""

from __future__ import annotations

from ingest.refusals import Refusals


def test_a_stretch_runs_from_the_first_refusal_to_the_next_delivery_stored():
    refusals = Refusals()
    refusals.stored()  # storing all along: nothing to record
    assert refusals.pending() == [] and not refusals.changed.is_set()

    refusals.refused()
    first = refusals.since
    refusals.refused()  # later refusals do not move its start
    assert refusals.since == first and refusals.pending() == []

    refusals.stored()
    ((since, until),) = refusals.pending()
    assert since == first and until >= since
    assert refusals.since is None and refusals.changed.is_set()


def test_a_stretch_is_kept_until_recorded():
    refusals = Refusals()
    refusals.refused()
    refusals.stored()
    assert len(refusals.pending()) == 1  # a failed write asks again
    assert len(refusals.pending()) == 1
    refusals.recorded(1)
    assert refusals.pending() == [] and not refusals.changed.is_set()
