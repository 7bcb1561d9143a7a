"""The inbox's one decision of how a delivery is stored
(``models.inbox.recording_steps``), driven step by step with the rows each
statement would return: every driver -- the session's, the event loop's --
runs exactly these steps."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy.exc import NoResultFound

from models.inbox import (
    DeliveryStatus,
    InboxStatement,
    InboxStep,
    IncomingDelivery,
    Recorded,
    next_step,
    recording_steps,
)

INSERT, STORED, COUNT_MISMATCH = InboxStatement

BODY = b'{"action": "opened"}'
INCOMING = IncomingDelivery(
    source_id=1,
    delivery_id="d-1",
    body=BODY,
    event="issues.opened",
    action="opened",
    headers={},
    content_type="application/json",
)
SAME_BODY = hashlib.sha256(BODY).hexdigest()


def driven(*rows: tuple | None) -> tuple[list[InboxStep], Recorded]:
    """The steps taken when each returns the next of ``rows``, and the answer."""
    steps, taken = recording_steps(INCOMING), []
    outcome = next_step(steps, None)
    answers = iter(rows)
    while isinstance(outcome, InboxStep):
        taken.append(outcome)
        outcome = next_step(steps, next(answers) if outcome.reads_row else None)
    assert next(answers, "none left") == "none left", "a row was never asked for"
    return taken, outcome


def test_a_new_delivery_is_one_insert():
    taken, recorded = driven((7, "queued"))
    assert [step.statement for step in taken] == [INSERT]
    assert recorded == Recorded(pk=7, is_new=True, status=DeliveryStatus.QUEUED)


def test_a_stored_one_is_read_and_answered_as_stored():
    taken, recorded = driven(None, (3, SAME_BODY, "done", "webhook"))
    assert [step.statement for step in taken] == [INSERT, STORED]
    assert taken[0].parameters is taken[1].parameters
    assert recorded == Recorded(pk=3, is_new=False, status=DeliveryStatus.DONE)


def test_a_row_deleted_before_the_read_is_inserted_again():
    taken, recorded = driven(None, None, (8, "queued"))
    assert [step.statement for step in taken] == [INSERT, STORED, INSERT]
    assert recorded == Recorded(pk=8, is_new=True, status=DeliveryStatus.QUEUED)


def test_a_row_deleted_and_stored_again_meanwhile_is_read_again():
    taken, recorded = driven(None, None, None, (9, SAME_BODY, "queued", "webhook"))
    assert [step.statement for step in taken] == [INSERT, STORED, INSERT, STORED]
    assert recorded == Recorded(pk=9, is_new=False, status=DeliveryStatus.QUEUED)


def test_a_row_gone_twice_is_an_error_not_an_answer():
    with pytest.raises(NoResultFound):
        driven(None, None, None, None)


def test_another_body_is_counted_on_the_stored_row_and_kept_apart():
    taken, recorded = driven(None, (3, "another body", "done", "webhook"), (4, "mismatch"))
    assert [step.statement for step in taken] == [INSERT, STORED, COUNT_MISMATCH, INSERT]
    assert taken[2].parameters == {"pk": 3}
    assert taken[3].parameters["delivery_id"] == f"d-1#{SAME_BODY[:16]}"
    assert recorded == Recorded(
        pk=4, is_new=True, status=DeliveryStatus.MISMATCH, payload_mismatch=True
    )
