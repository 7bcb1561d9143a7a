"""``taskhook deliveries`` (list, show, replay, replay-matching), the
operations history and ``taskhook stats``."""

from __future__ import annotations

import json

import pytest

from models.broker.messages import DELIVERIES_QUEUE, PROCESS_DELIVERIES, PROCESS_DELIVERY
from models.inbox import DeliveryStatus
from tests.support.cli import as_json, refused, taskhook, usage_error
from tests.support.scenarios import (
    EXTERNAL_ID,
    a_delivery,
    a_settled_task,
    a_source,
    an_unfinished_create,
    settle_as,
)
from tests.support.stores import Store


def test_deliveries_list_filters_and_pages(store: Store):
    source_id = a_source(store, store.workspace().id)
    pks = [a_delivery(store, source_id, f"d-{n}") for n in range(3)]
    settle_as(store, pks[0], DeliveryStatus.DEAD, error="payload has no issue")

    table = taskhook(store, "deliveries", "list")
    dead = taskhook(store, "deliveries", "list", "--status", "dead")
    first_page = as_json(taskhook(store, "deliveries", "list", "--limit", "2", "--json"))
    before = str(first_page["next_before"])
    second_page = as_json(
        taskhook(store, "deliveries", "list", "--limit", "2", "--before", before, "--json")
    )

    assert [line.split()[0] for line in table.stdout.splitlines()] == [
        "ID",
        str(pks[2]),
        str(pks[1]),
        str(pks[0]),
    ]
    assert "payload has no issue" in dead.stdout
    assert len(dead.stdout.splitlines()) == 2
    assert [d["id"] for d in first_page["deliveries"]] == [pks[2], pks[1]]
    assert [d["id"] for d in second_page["deliveries"]] == [pks[0]]
    assert second_page["next_before"] is None
    assert (
        "More: taskhook deliveries list --before"
        in taskhook(store, "deliveries", "list", "--limit", "1").stdout
    )
    assert taskhook(store, "deliveries", "list", "--status", "lost").exit_code == 2


def test_deliveries_show_never_shows_a_signature(store: Store):
    source_id = a_source(store, store.workspace().id)
    pk = a_delivery(
        store,
        source_id,
        "d-1",
        headers={"X-GitHub-Event": "issues", "X-Hub-Signature-256": "sha256=0123abcd"},
    )

    shown = taskhook(store, "deliveries", "show", str(pk))
    document = as_json(taskhook(store, "deliveries", "show", str(pk), "--json"))

    assert "X-GitHub-Event" in shown.stdout
    assert "0123abcd" not in shown.output + json.dumps(document)
    assert document["summary"]["delivery_id"] == "d-1"
    assert refused(taskhook(store, "deliveries", "show", "999")) == "Error: delivery 999 not found"
    assert taskhook(store, "deliveries", "show", "one").exit_code == 2


def test_deliveries_list_shows_why_a_delivery_is_dead(store: Store):
    source_id = a_source(store, store.workspace().id)
    unsupported = a_delivery(store, source_id, "d-1")
    settle_as(store, unsupported, DeliveryStatus.DEAD, reason="unsupported payload: no issue")
    crashed = a_delivery(store, source_id, "d-2")
    settle_as(
        store,
        crashed,
        DeliveryStatus.DEAD,
        reason="database errors, 3 retries spent",
        error="OperationalError: gone",
    )

    rows = {
        line.split()[0]: line
        for line in taskhook(store, "deliveries", "list", "--status", "dead").stdout.splitlines()
    }

    assert "unsupported payload: no issue" in rows[str(unsupported)]
    assert "database errors, 3 retries spent; OperationalError: gone" in rows[str(crashed)]


def test_deliveries_show_names_the_external_id_of_its_task(store: Store):
    _, first, _ = a_settled_task(store)

    shown = taskhook(store, "deliveries", "show", str(first)).stdout
    document = as_json(taskhook(store, "deliveries", "show", str(first), "--json"))

    assert f"external id   {EXTERNAL_ID}" in shown
    assert "task          ACME-1" in shown
    listed = taskhook(store, "deliveries", "list").stdout
    assert f"ACME-1  {EXTERNAL_ID}" in listed
    assert document["summary"]["external_id"] == EXTERNAL_ID


@pytest.mark.parametrize(
    "command",
    [
        ("deliveries", "show", "{id}"),
        ("deliveries", "replay", "{id}"),
        ("deliveries", "list", "--before", "{id}"),
        ("token", "revoke", "{id}"),
    ],
)
# 2**31 fits SQLite's keys but not PostgreSQL's INTEGER; 2**63 fits neither.
@pytest.mark.parametrize("number", ["0", str(2**31), str(2**63), "99999999999999999999"])
def test_an_id_no_row_can_have_is_a_usage_error(store: Store, celery, command, number):
    source_id = a_source(store, store.workspace().id)
    settle_as(store, a_delivery(store, source_id, "d-1"), DeliveryStatus.DEAD, error="x")

    line = usage_error(taskhook(store, *(part.format(id=number) for part in command)))

    assert line.startswith("Error: Invalid value for ")
    assert f"{number} is not in the range 1<=x<=2147483647" in line
    assert celery.sent == []


def test_replay_commits_then_sends_the_delivery_to_the_worker(store: Store, celery):
    _, _, _, parked = an_unfinished_create(store)
    seen_at_send: list[object] = []
    celery.answer = lambda *args: None
    original_send = celery.send_task

    def send_after_checking(name, *, args, queue):
        # Another connection sees the row queued: the replay was committed first.
        seen_at_send.append(store.scalar("SELECT status FROM deliveries WHERE id = :p", p=parked))
        return original_send(name, args=args, queue=queue)

    celery.send_task = send_after_checking
    result = taskhook(store, "deliveries", "replay", str(parked))

    assert result.exit_code == 0
    assert celery.sent == [(PROCESS_DELIVERY, [parked], DELIVERIES_QUEUE)]
    assert seen_at_send == ["queued"]


def test_replay_refuses_a_delivery_that_is_not_parked_or_dead(store: Store, celery):
    _, first, _ = a_settled_task(store)
    line = refused(taskhook(store, "deliveries", "replay", str(first)))
    assert line == (
        f"Error: delivery {first} is done; only dead, mismatch, needs_operator or replay "
        "deliveries can be replayed"
    )
    assert (
        refused(taskhook(store, "deliveries", "replay", "999")) == "Error: delivery 999 not found"
    )
    assert celery.sent == []


def test_replay_with_the_broker_down_leaves_the_sweeper_to_send_it(store: Store, celery):
    source_id = a_source(store, store.workspace().id)
    dead = a_delivery(store, source_id, "d-1")
    settle_as(store, dead, DeliveryStatus.DEAD, error="database went away")
    celery.broker_down = True

    result = taskhook(store, "deliveries", "replay", str(dead), "--json")

    assert (
        as_json(result).items() >= {"delivery": dead, "status": "queued", "enqueued": False}.items()
    )
    assert store.scalar("SELECT status FROM deliveries WHERE id = :p", p=dead) == "queued"


def some_dead(store: Store, count: int) -> list[int]:
    source_id = a_source(store, store.workspace().id)
    dead = [a_delivery(store, source_id, f"d-dead-{n}") for n in range(count)]
    for pk in dead:
        settle_as(store, pk, DeliveryStatus.DEAD, error="database went away")
    a_delivery(store, source_id, "d-queued")
    return dead


def statuses(store: Store, pks: list[int]) -> list[str]:
    return [store.scalar("SELECT status FROM deliveries WHERE id = :p", p=pk) for pk in pks]


def test_replay_matching_dry_run_counts_and_changes_nothing(store: Store, celery):
    dead = some_dead(store, 3)

    table = taskhook(store, "deliveries", "replay-matching", "--status", "dead", "--dry-run")
    listed = as_json(
        taskhook(
            store,
            "deliveries",
            "replay-matching",
            "--since",
            "2020-01-01T00:00",
            "--dry-run",
            "--json",
        )
    )

    assert table.exit_code == 0
    assert table.stdout.splitlines() == [
        "Dry run: 3 deliveries would be queued again.",
        "To run it: the same options, without --dry-run, with --name NAME --expect 3.",
    ]
    # A time without an offset is UTC.
    assert listed == {
        "dry_run": True,
        "criteria": {"received_from": "2020-01-01T00:00:00+00:00"},
        "replayable": 3,
        "bodies_dropped": 0,
    }
    assert statuses(store, dead) == ["dead"] * 3
    assert celery.sent == []
    assert store.scalar("SELECT count(*) FROM operations") == 0


def test_replay_matching_queues_sends_and_keeps_the_run_in_the_history(store: Store, celery):
    dead = some_dead(store, 3)

    ran = as_json(
        taskhook(
            store,
            "deliveries",
            "replay-matching",
            "--status",
            "dead",
            "--name",
            " after the database fix ",
            "--expect",
            "3",
            "--operator",
            "alice",
            "--json",
        )
    )
    table = taskhook(store, "operations", "list")
    (listed,) = as_json(taskhook(store, "operations", "list", "--json"))["operations"]

    assert celery.sent == [(PROCESS_DELIVERIES, [dead], DELIVERIES_QUEUE)]
    assert statuses(store, dead) == ["queued"] * 3
    assert ran["not_sent"] == 0
    assert listed == ran["operation"]
    assert {key: listed[key] for key in ("kind", "name", "operator", "criteria")} == {
        "kind": "bulk-replay",
        "name": "after the database fix",
        "operator": "alice",
        "criteria": {"status": "dead"},
    }
    assert (listed["expected"], listed["matched"], listed["done"], listed["error"]) == (
        3,
        3,
        3,
        None,
    )
    assert table.stdout.splitlines()[0].split() == [
        "ID",
        "STARTED",
        "FINISHED",
        "KIND",
        "NAME",
        "OPERATOR",
        "EXPECTED",
        "MATCHED",
        "DONE",
        "CRITERIA",
        "ERROR",
    ]
    assert "after the database fix" in table.stdout and "status=dead" in table.stdout
    people = taskhook(store, "deliveries", "replay-matching", "--status", "dead", "--name", "again")
    assert people.stdout.splitlines()[0] == (
        f"Operation {listed['id'] + 1} (again): 0 deliveries queued again and sent to the worker."
    )


def test_replay_matching_with_the_broker_down_leaves_the_sweeper_to_send_them(store: Store, celery):
    dead = some_dead(store, 2)
    celery.broker_down = True

    result = taskhook(store, "deliveries", "replay-matching", "--name", "retry")

    assert result.exit_code == 0
    assert "2 of them are queued but not sent: the sweeper sends them" in result.stdout
    assert "The broker did not take a message ([Errno 111] Connection refused)." in result.stderr
    assert statuses(store, dead) == ["queued"] * 2


def test_replay_matching_mistakes_are_clear_and_change_nothing(store: Store, celery):
    dead = some_dead(store, 1)
    command = ("deliveries", "replay-matching")

    assert "--name is required" in usage_error(taskhook(store, *command))
    assert "a bulk replay needs a name" in usage_error(taskhook(store, *command, "--name", " "))
    assert "not an ISO 8601 date or time" in usage_error(
        taskhook(store, *command, "--since", "yesterday", "--dry-run")
    )
    assert "--since must be before --until" in usage_error(
        taskhook(store, *command, "--since", "2026-12-02", "--until", "2026-12-01", "--dry-run")
    )
    assert refused(taskhook(store, *command, "--status", "done", "--name", "x")) == (
        "Error: done deliveries cannot be replayed in bulk: only dead or needs_operator "
        "deliveries can be replayed that way (a replay or mismatch delivery is replayed on "
        "its own, once its sender is known to be genuine)"
    )
    assert "search must be at most 300 characters" in refused(
        taskhook(store, *command, "--search", "x" * 301, "--dry-run")
    )
    assert statuses(store, dead) == ["dead"]
    assert celery.sent == []
    assert store.scalar("SELECT count(*) FROM operations") == 0


def test_operations_list_of_an_empty_history(store: Store):
    assert taskhook(store, "operations", "list").stdout.startswith("No operations yet")
    assert as_json(taskhook(store, "operations", "list", "--json")) == {"operations": []}


def test_stats_for_people_and_for_scripts(store: Store):
    source_id = a_source(store, store.workspace().id)
    a_delivery(store, source_id, "d-1")
    settle_as(store, a_delivery(store, source_id, "d-2"), DeliveryStatus.DEAD, error="x")

    table = taskhook(store, "stats").stdout
    document = as_json(taskhook(store, "stats", "--json"))

    assert "queued          1" in table
    assert "dead            1" in table
    assert "Oldest queued: received" in table
    assert document["counts"]["queued"] == 1
    assert document["oldest_queued_age_seconds"] >= 0
