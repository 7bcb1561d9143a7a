"""``taskhook deliveries`` (list, show, replay, replay-matching), the
operations history and ``taskhook stats``."""

from __future__ import annotations

import importlib
import io
import json
import os
import pty
import re
import subprocess
from datetime import timedelta

import pytest
from sqlalchemy import update

from models.broker.messages import (
    BACKGROUND_QUEUE,
    DELIVERIES_QUEUE,
    PROCESS_DELIVERIES,
    PROCESS_DELIVERY,
)
from models.db import session_scope
from models.inbox import DeliveryStatus, IncomingDelivery, record_delivery
from models.tables import Delivery, utcnow
from models.tasks import NewTask, create_task
from tests.support.cli import (
    BIN,
    ROOT,
    as_json,
    process_env,
    refused,
    taskhook,
    usage_error,
)
from tests.support.feeds import make_feed, store_fixture
from tests.support.runs import a_create_deleted_before_it_settled, run
from tests.support.scenarios import (
    EXTERNAL_ID,
    a_backlog,
    a_delivery,
    a_settled_task,
    a_source,
    an_unfinished_create,
    settle_as,
)
from tests.support.stores import TRUSTED, Store


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
        ("deliveries", "replay-matching", "--recreate", "{id}", "--dry-run"),
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
    # From a script, a replay that undoes nothing goes ahead without asking,
    # as it always did; it still says what it does.
    assert f"  replaying    {EXTERNAL_ID!r} is held by ACME-1, whose create has not settled" in (
        result.stdout
    )
    assert "Replay it?" not in result.output


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


# --- a task deleted before its creation settled ------------------------------------


def parked_after_a_delete(store: Store) -> tuple[int, int, int]:
    """Jira's TES-41: its create was parked after its task was deleted before
    it settled; and a GitHub create that died of database errors. The
    parked delivery, its deleted task's id and the dead delivery."""
    feed = make_feed(store.sessions)
    parked, deleted = a_create_deleted_before_it_settled(store, feed)
    dead = store_fixture(store.sessions, feed, "github", "issues__opened")
    settle_as(store, dead, DeliveryStatus.DEAD, reason="database errors, 2 retries spent")
    return parked, deleted, dead


def test_replay_matching_counts_apart_and_leaves_out_what_was_deleted_before_it_settled(
    store: Store, celery
):
    parked, _, dead = parked_after_a_delete(store)

    dry = taskhook(store, "deliveries", "replay-matching", "--dry-run")
    listed = as_json(taskhook(store, "deliveries", "replay-matching", "--dry-run", "--json"))
    ran = as_json(taskhook(store, "deliveries", "replay-matching", "--name", "fix", "--json"))
    people = taskhook(store, "deliveries", "replay-matching", "--name", "again").stdout

    assert dry.stdout.splitlines() == [
        "Dry run: 1 deliveries would be queued again.",
        "1 parked because their task was deleted before its creation settled: left out; name "
        f"them to replay (--recreate ID each; replaying creates the task again): {parked}.",
        "To run it: the same options, without --dry-run, with --name NAME --expect 1.",
    ]
    assert (listed["replayable"], listed["task_deleted"], listed["task_deleted_ids"]) == (
        1,
        1,
        [parked],
    )
    assert celery.sent == [(PROCESS_DELIVERY, [dead], BACKGROUND_QUEUE)]
    assert (ran["operation"]["done"], ran["operation"]["criteria"]) == (1, {})
    assert (ran["task_deleted"], ran["task_deleted_ids"]) == (1, [parked])
    assert people.splitlines()[1] == (
        "Left out: 1 parked because their task was deleted before its creation settled; name "
        f"one to replay it (--recreate ID): {parked}."
    )
    assert statuses(store, [parked, dead]) == ["needs_operator", "queued"]


def test_replay_matching_replays_a_named_one_and_creates_its_task_again(store: Store, celery):
    parked, deleted, dead = parked_after_a_delete(store)
    named = ("--recreate", str(parked))

    dry = taskhook(store, "deliveries", "replay-matching", *named, "--dry-run")
    ran = as_json(
        taskhook(store, "deliveries", "replay-matching", *named, "--name", "TES-41", "--json")
    )
    history = taskhook(store, "operations", "list").stdout
    again = run(store, parked)

    assert dry.stdout.splitlines() == [
        "Dry run: 2 deliveries would be queued again.",
        "Among them, 1 named with --recreate: their task, deleted before its creation settled, "
        "is created again.",
        f"To run it: the same options --recreate {parked}, without --dry-run, with --name NAME "
        "--expect 2.",
    ]
    assert celery.sent == [(PROCESS_DELIVERIES, [[parked, dead]], BACKGROUND_QUEUE)]
    assert ran["operation"]["criteria"] == {"recreate": [parked]}
    assert f"recreate=[{parked}]" in history
    assert (again.status, again.outcome) == (DeliveryStatus.DONE, "created")
    assert again.task_id != deleted


def test_replay_matching_refuses_a_named_delivery_it_would_not_leave_out(store: Store, celery):
    parked, _, dead = parked_after_a_delete(store)

    line = refused(
        taskhook(store, "deliveries", "replay-matching", "--recreate", str(dead), "--name", "x")
    )
    outside = refused(
        taskhook(
            store,
            "deliveries",
            "replay-matching",
            "--status",
            "dead",
            "--recreate",
            str(parked),
            "--dry-run",
        )
    )

    assert line == (
        "Error: a named delivery must be one this replay leaves out because its task was "
        f"deleted before its creation settled; not so: {dead}"
    )
    assert outside.endswith(f"not so: {parked}")
    assert celery.sent == []
    assert statuses(store, [parked, dead]) == ["needs_operator", "dead"]
    assert store.scalar("SELECT count(*) FROM operations") == 0


def test_replay_shows_its_plan_and_asks_before_creating_a_deleted_task_again(store: Store, celery):
    parked, deleted, _ = parked_after_a_delete(store)
    command = ("deliveries", "replay", str(parked))

    unanswered = taskhook(store, *command)
    declined = taskhook(store, *command, input="n\n")
    planned = as_json(taskhook(store, *command, "--dry-run", "--json"))
    assert statuses(store, [parked]) == ["needs_operator"] and celery.sent == []
    accepted = taskhook(store, *command, input="y\n")

    assert "pass --yes to replay without asking" in usage_error(unanswered)
    assert declined.exit_code == 1 and "Aborted!" in declined.stderr
    lines = accepted.stdout.splitlines()
    assert lines[0] == (
        f"Replay delivery {parked} (jira id {planned['plan']['delivery_id']}, "
        "jira:issue_created, workspace acme):"
    )
    assert lines[1] == "  status       needs_operator"
    assert lines[2].startswith("  reason       the task for 'jira:TES-41' was deleted before its")
    assert lines[3] == "  external id  jira:TES-41"
    assert re.fullmatch(
        f"  replaying    its task \\(id {deleted}\\) was deleted on [0-9: -]+ UTC before its "
        "creation settled: replaying creates a new task for 'jira:TES-41'",
        lines[4],
    )
    assert lines[5] == ("WARNING: someone deleted that task: replay only if the task should exist.")
    assert lines[6].startswith("Replay it? [y/N]: ")
    assert celery.sent == [(PROCESS_DELIVERY, [parked], DELIVERIES_QUEUE)]
    assert planned["plan"]["needs_consent"] is True
    assert planned["plan"]["will"] == lines[4].removeprefix("  replaying    ")
    assert run(store, parked).outcome == "created"


def test_replay_with_yes_asks_nothing_and_json_keeps_the_plan_off_stdout(store: Store, celery):
    parked, _, _ = parked_after_a_delete(store)

    result = taskhook(store, "deliveries", "replay", str(parked), "--yes", "--json")

    document = as_json(result)
    assert document["plan"]["status"] == "needs_operator" and document["enqueued"] is True
    assert "WARNING: someone deleted that task" in result.stderr
    assert "Replay it?" not in result.output
    assert statuses(store, [parked]) == ["queued"]


def test_replay_dry_run_changes_nothing(store: Store, celery):
    _, _, _, parked = an_unfinished_create(store)

    result = taskhook(store, "deliveries", "replay", str(parked), "--dry-run")

    assert result.exit_code == 0
    assert result.stdout.splitlines()[-1] == (
        f"Dry run: nothing changed. To replay it: taskhook deliveries replay {parked}"
    )
    assert statuses(store, [parked]) == ["needs_operator"] and celery.sent == []
    assert refused(taskhook(store, "deliveries", "replay", "999", "--dry-run")) == (
        "Error: delivery 999 not found"
    )


def stored_as_replay(store: Store, source_id: int, first: int) -> int:
    """Delivery ``first``'s very body, resent under another delivery id: a replay."""
    with store.sessions() as session:
        body = session.get(Delivery, first).body
    incoming = IncomingDelivery(
        source_id=source_id,
        delivery_id="d-resent",
        body=body,
        event="issues.opened",
        action="opened",
        headers={"X-GitHub-Event": "issues"},
        content_type="application/json",
    )
    with session_scope(store.sessions) as session:
        recorded = record_delivery(session=session, incoming=incoming)
    assert recorded.status is DeliveryStatus.REPLAY
    return recorded.pk


def test_replay_of_a_resent_body_asks_first(store: Store, celery):
    source_id = a_source(store, store.workspace().id)
    first = a_delivery(store, source_id, "d-1")
    resent = stored_as_replay(store, source_id, first)

    unanswered = taskhook(store, "deliveries", "replay", str(resent))
    shown = taskhook(store, "deliveries", "replay", str(resent), "--dry-run").stdout

    assert "pass --yes to replay without asking" in usage_error(unanswered)
    assert (
        "WARNING: it is the very body of an earlier delivery, resent under another id (status "
        "replay): replay it only if you know its sender is genuine." in shown
    )
    assert statuses(store, [resent]) == ["replay"] and celery.sent == []


def test_replay_refuses_when_what_it_does_changed_after_its_plan_was_shown(store: Store, celery):
    parked, _, _ = parked_after_a_delete(store)
    acme = store.scalar("SELECT id FROM workspaces WHERE slug = 'acme'")

    class CreatedMeanwhile(io.BytesIO):
        """The answer, typed while a REST caller creates the task again."""

        def __init__(self) -> None:
            super().__init__(b"y\n")

        def read1(self, size: int = -1) -> bytes:
            if self.tell() == 0:  # the command reads the answer: the question is out
                with session_scope(store.sessions) as session:
                    create_task(
                        session=session,
                        caller=TRUSTED,
                        workspace_id=acme,
                        new=NewTask(title="TES-41 again", external_id="jira:TES-41"),
                    )
            return super().read1(size)

    line = refused(taskhook(store, "deliveries", "replay", str(parked), input=CreatedMeanwhile()))
    now = taskhook(store, "deliveries", "replay", str(parked), "--dry-run").stdout

    assert line == (
        f"Error: delivery {parked} changed since its plan was shown; nothing was replayed: look "
        f"again (taskhook deliveries replay {parked} --dry-run)"
    )
    assert statuses(store, [parked]) == ["needs_operator"] and celery.sent == []
    assert "'jira:TES-41' is held by ACME-2 now: replaying finds it, no new task" in now
    assert "WARNING" not in now


def test_replay_asks_a_person_at_a_terminal_even_when_nothing_is_undone(store: Store):
    _, _, _, parked = an_unfinished_create(store)
    main, terminal = pty.openpty()
    try:
        with subprocess.Popen(
            [str(BIN / "taskhook"), "deliveries", "replay", str(parked)],
            cwd=ROOT,
            env=process_env(store),
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as process:
            os.write(main, b"n\n")
            out, err = process.communicate(timeout=120)
    finally:
        os.close(terminal)
        os.close(main)

    assert process.returncode == 1, err
    assert "Replay it? [y/N]: " in out and "Aborted!" in err
    assert statuses(store, [parked]) == ["needs_operator"]


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
        "recreate": [],
        "replayable": 3,
        "bodies_dropped": 0,
        "task_deleted": 0,
        "task_deleted_ids": [],
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

    assert celery.sent == [(PROCESS_DELIVERIES, [dead], BACKGROUND_QUEUE)]
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


def test_stats_list_the_backed_up_workspaces_largest_first(store: Store, monkeypatch):
    now = utcnow()
    for slug, queued, processing, minutes in (
        ("acme", 2, 1, 3),
        ("beta", 5, 0, 1),
        ("gamma", 1, 0, 9),
        ("delta", 0, 1, 0),
    ):
        source = a_source(store, store.workspace(slug, slug.upper()).id, f"{slug}-github")
        a_backlog(store, source, queued=queued, received_at=now - timedelta(minutes=minutes))
        a_backlog(store, source, processing=processing, finished=2)
    store.workspace("idle", "IDLE")

    table = taskhook(store, "stats").stdout
    document = as_json(taskhook(store, "stats", "--json"))
    # The module, not the command group worker.cli names "deliveries" too.
    commands = importlib.import_module("worker.cli.deliveries")
    monkeypatch.setattr(commands, "LISTED_BACKLOGS", 2)
    folded = taskhook(store, "stats").stdout

    rows = re.findall(r"^(\w+) +(\d+) +(.+)$", table.split("OLDEST QUEUED")[1], re.M)
    assert rows == [
        ("beta", "5", "1m"),
        ("acme", "3", "3m"),
        ("gamma", "1", "9m"),
        ("delta", "1", "none queued"),
    ]
    assert "idle" not in table and "more workspace" not in table
    assert [(w["slug"], w["backlog"]) for w in document["backlogs"]["largest"]] == [
        ("beta", 5),
        ("acme", 3),
        ("gamma", 1),
        ("delta", 1),
    ]
    assert document["backlogs"]["largest"][3]["oldest_queued_age_seconds"] is None
    assert "And 2 more workspaces: 2 deliveries, the oldest queued waiting 9m." in folded


def test_stats_say_when_no_workspace_is_backed_up(store: Store):
    source = a_source(store, store.workspace().id)
    a_backlog(store, source, finished=3)
    keys = a_backlog(store, source, queued=1)
    with session_scope(store.sessions) as session:
        session.execute(
            update(Delivery).where(Delivery.id.in_(keys)).values(status=DeliveryStatus.DEAD.value)
        )

    table = taskhook(store, "stats").stdout
    document = as_json(taskhook(store, "stats", "--json"))

    assert "No workspace is backed up." in table
    assert document["backlogs"] == {
        "largest": [],
        "rest_workspaces": 0,
        "rest_backlog": 0,
        "rest_oldest_queued_at": None,
        "rest_oldest_queued_age_seconds": None,
    }
