"""The inbox's one decision of how a delivery is stored
(``models.inbox.recording_steps``), driven step by step with the rows each
statement would return: every driver -- the session's, the event loop's --
runs exactly these steps."""

from __future__ import annotations

import dataclasses
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

INSERT, STORED, STORED_BODY, COUNT_MISMATCH = InboxStatement

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


def driven(
    *rows: tuple | None, incoming: IncomingDelivery = INCOMING
) -> tuple[list[InboxStep], Recorded]:
    """The steps taken when each returns the next of ``rows``, and the answer."""
    steps, taken = recording_steps(incoming), []
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
    taken, recorded = driven(None, (3, SAME_BODY, "done"))
    assert [step.statement for step in taken] == [INSERT, STORED]
    assert taken[0].parameters is taken[1].parameters
    assert recorded == Recorded(pk=3, is_new=False, status=DeliveryStatus.DONE)


def test_a_row_deleted_before_the_read_is_inserted_again():
    taken, recorded = driven(None, None, (8, "queued"))
    assert [step.statement for step in taken] == [INSERT, STORED, INSERT]
    assert recorded == Recorded(pk=8, is_new=True, status=DeliveryStatus.QUEUED)


def test_a_row_deleted_and_stored_again_meanwhile_is_read_again():
    taken, recorded = driven(None, None, None, (9, SAME_BODY, "queued"))
    assert [step.statement for step in taken] == [INSERT, STORED, INSERT, STORED]
    assert recorded == Recorded(pk=9, is_new=False, status=DeliveryStatus.QUEUED)


def test_a_row_gone_twice_is_an_error_not_an_answer():
    with pytest.raises(NoResultFound):
        driven(None, None, None, None)


OTHER_BODY = (b'{"action": "closed"}', "application/json")


def test_another_body_is_read_counted_on_the_stored_row_and_a_create_kept_apart_queued():
    taken, recorded = driven(None, (3, "another sha", "done"), OTHER_BODY, (4, "queued"))
    assert [step.statement for step in taken] == [
        INSERT,
        STORED,
        STORED_BODY,
        COUNT_MISMATCH,
        INSERT,
    ]
    assert taken[2].parameters == taken[3].parameters == {"pk": 3}
    assert taken[4].parameters["delivery_id"] == f"d-1#{SAME_BODY[:16]}"
    # A create goes through on its own record, whatever the stored row made.
    assert taken[4].parameters["status"] == "queued"
    assert recorded == Recorded(
        pk=4, is_new=True, status=DeliveryStatus.QUEUED, payload_mismatch=True
    )


def test_another_body_that_is_no_create_is_kept_apart_as_a_mismatch():
    ignored = dataclasses.replace(INCOMING, status=DeliveryStatus.IGNORED)
    taken, recorded = driven(
        None, (3, "another sha", "done"), OTHER_BODY, (4, "mismatch"), incoming=ignored
    )
    assert [step.statement for step in taken] == [
        INSERT,
        STORED,
        STORED_BODY,
        COUNT_MISMATCH,
        INSERT,
    ]
    assert taken[4].parameters["status"] == "mismatch"
    assert recorded == Recorded(
        pk=4, is_new=True, status=DeliveryStatus.MISMATCH, payload_mismatch=True
    )


@pytest.mark.parametrize(
    "stored_body",
    [
        b'{ "action" : "opened" }',  # other spacing
        b'{"action":"\\u006fpened"}',  # another escape of the same text
    ],
)
def test_other_bytes_of_the_same_payload_are_a_duplicate(stored_body):
    taken, recorded = driven(None, (3, "another sha", "done"), (stored_body, "application/json"))
    assert [step.statement for step in taken] == [INSERT, STORED, STORED_BODY]
    assert recorded == Recorded(pk=3, is_new=False, status=DeliveryStatus.DONE)


@pytest.mark.parametrize(
    "stored",
    [
        (b'{"action": "opened", "n": 1}', "application/json"),
        (b"", "application/json"),  # dropped by the retention policy
        (b"not json", "application/json"),
        None,  # deleted since it was read
    ],
)
def test_a_payload_that_differs_or_cannot_be_read_is_a_mismatch(stored):
    taken, recorded = driven(None, (3, "another sha", "done"), stored, (4, "queued"))
    assert [step.statement for step in taken] == [
        INSERT,
        STORED,
        STORED_BODY,
        COUNT_MISMATCH,
        INSERT,
    ]
    assert recorded.payload_mismatch is True


def test_numbers_and_booleans_that_compare_equal_in_python_are_other_payloads():
    one = dataclasses.replace(INCOMING, body=b'{"action": 1}', body_sha256="")
    _, recorded = driven(
        None,
        (3, "another sha", "done"),
        (b'{"action": true}', "application/json"),
        (4, "queued"),
        incoming=one,
    )
    assert recorded.payload_mismatch is True


def test_a_body_is_read_as_its_provider_reads_it():
    """GitHub's form encoding, against the JSON a catch-up copy is stored as."""
    form = dataclasses.replace(
        INCOMING,
        body=b"payload=%7B%22action%22%3A+%22opened%22%7D",
        body_sha256="",
        content_type="application/x-www-form-urlencoded",
        provider="github",
    )
    taken, recorded = driven(
        None, (3, "another sha", "done"), (BODY, "application/json"), incoming=form
    )
    assert [step.statement for step in taken] == [INSERT, STORED, STORED_BODY]
    assert recorded.payload_mismatch is False
