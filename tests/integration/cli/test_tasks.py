"""``taskhook task lookup`` and ``taskhook explain``: a task, who created it,
what an unfinished create is doing, and an identity's lineage."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import text, update

from models.access import Caller
from models.db import session_scope
from models.inbox import DeliveryStatus
from models.tables import Delivery, utcnow
from models.tasks import CreateHooks, NewTask, create_task, delete_task, release_external_id
from models.tokens import issue_token
from tests.support.cli import RELEASE, as_json, refused, taskhook
from tests.support.scenarios import (
    EXTERNAL_ID,
    Crash,
    a_delivery,
    a_settled_task,
    a_source,
    an_unfinished_create,
    release,
    settle_as,
)
from tests.support.stores import TRUSTED, Store


def test_task_lookup_shows_the_task_and_the_deliveries_that_touched_it(store: Store):
    task_id, first, second = a_settled_task(store)

    result = taskhook(store, "task", "lookup", "--workspace", "acme", EXTERNAL_ID)
    document = as_json(
        taskhook(store, "task", "lookup", "--workspace", "acme", EXTERNAL_ID, "--json")
    )

    assert result.exit_code == 0
    assert "ACME-1  Login page is blank" in result.stdout
    assert "settled at" in result.stdout
    assert "archived     no" in result.stdout
    rows = [
        line.split()
        for line in result.stdout.splitlines()
        if line.split()[:1] in ([str(first)], [str(second)])
    ]
    # RECEIVED is a date and a time: STATUS is the sixth word, OUTCOME the eighth.
    assert [(row[0], row[5], row[7]) for row in rows] == [
        (str(first), "done", "created"),
        (str(second), "done", "found_settled"),
    ]
    assert (
        document["task"].items()
        >= {
            "id": task_id,
            "identifier": "ACME-1",
            "external_id": EXTERNAL_ID,
            "settled": True,
            "archived": False,
        }.items()
    )
    assert [d["id"] for d in document["deliveries"]] == [first, second]


def set_creator(store: Store, creator: int, state: str) -> None:
    """Put the creating delivery in ``state``: live, expired (its worker died), queued, dead."""
    now = utcnow()
    values = {
        "live": {"status": "processing", "lease_expires_at": now + timedelta(minutes=1)},
        "expired": {"status": "processing", "lease_expires_at": now - timedelta(minutes=1)},
        "queued": {"status": "queued", "lease_expires_at": None},
        "dead": {"status": "dead", "lease_expires_at": None, "last_error": "db gone"},
    }[state]
    with session_scope(store.sessions) as session:
        session.execute(update(Delivery).where(Delivery.id == creator).values(**values))


@pytest.mark.parametrize(
    ("state", "advice"),
    [
        ("live", "delivery 1 is being processed now (attempt 1, lease until"),
        ("expired", "delivery 1's worker stopped (its lease ran out at"),
        ("queued", "delivery 1 is queued: when it runs it finishes its own create"),
        ("dead", "then `taskhook deliveries replay 1` finishes its own create"),
    ],
)
def test_task_lookup_says_what_an_unfinished_create_is_doing(store: Store, state, advice):
    _, _, creator, _ = an_unfinished_create(store)
    set_creator(store, creator, state)

    result = taskhook(store, "task", "lookup", "--workspace", "acme", EXTERNAL_ID)

    assert "NOT SETTLED: its create had not finished when looked at" in result.stdout
    assert advice in " ".join(result.stdout.split())
    assert "needs_operator" in result.stdout


def test_a_task_created_through_the_api_has_no_creator_to_wait_for(store: Store):
    acme = store.workspace()

    def client_died(_task):
        raise Crash()

    with store.sessions() as session, pytest.raises(Crash):
        create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=acme.id,
            new=NewTask(title="From a script", external_id=EXTERNAL_ID),
            hooks=CreateHooks(after_insert=client_died),
        )

    lookup = taskhook(store, "task", "lookup", "--workspace", "acme", EXTERNAL_ID)
    preview = taskhook(store, *RELEASE, "--reason", "client gone", input="n\n")

    assert "created outside the webhooks (REST API)" in " ".join(lookup.stdout.split())
    assert "No delivery touched it" in lookup.stdout
    assert "WARNING" not in preview.stdout


def test_release_warns_when_the_create_may_still_finish(store: Store, celery):
    _, _, creator, _ = an_unfinished_create(store)
    set_creator(store, creator, "live")
    live = taskhook(store, *RELEASE, "--reason", "r", input="n\n")
    set_creator(store, creator, "dead")
    dead = taskhook(store, *RELEASE, "--reason", "r", input="n\n")

    assert "WARNING: its create may still finish on its own" in live.stdout
    assert "WARNING" not in dead.stdout
    assert "creates a NEW task" in dead.stdout
    assert celery.sent == []


def test_release_of_a_settled_task_says_it_makes_a_second_task(store: Store, celery):
    a_settled_task(store)
    preview = taskhook(store, *RELEASE, "--reason", "r", input="n\n")
    assert "Its create FINISHED" in preview.stdout
    assert "SECOND task" in preview.stdout


def test_task_lookup_refuses_what_it_cannot_find_in_one_line(store: Store):
    store.workspace()
    missing = refused(taskhook(store, "task", "lookup", "--workspace", "acme", "jira:NOPE-1"))
    invalid = refused(taskhook(store, "task", "lookup", "--workspace", "acme", "jira:PROJ-1\t"))
    workspace = refused(taskhook(store, "task", "lookup", "--workspace", "nope", "jira:PROJ-1"))
    too_long = refused(taskhook(store, "task", "lookup", "--workspace", "acme", "x" * 256))

    assert missing == "Error: no task in workspace acme holds external id 'jira:NOPE-1'"
    assert invalid == (
        "Error: external_id must not contain control characters (U+0009 at position 11)"
    )
    assert workspace == "Error: workspace 'nope' not found"
    assert "at most 255 bytes" in too_long


def test_task_lookup_and_explain_take_a_task_identifier_too(store: Store):
    task_id, first, second = a_settled_task(store)

    shown = taskhook(store, "task", "lookup", "--workspace", "acme", "ACME-1")
    document = as_json(taskhook(store, "task", "lookup", "--workspace", "acme", "ACME-1", "--json"))
    explained = as_json(taskhook(store, "explain", "--workspace", "acme", "ACME-1", "--json"))

    assert shown.exit_code == 0, shown.output
    assert "ACME-1  Login page is blank" in shown.stdout
    assert f"external id  {EXTERNAL_ID}" in shown.stdout
    assert (document["external_id"], document["task"]["id"]) == (EXTERNAL_ID, task_id)
    assert [d["id"] for d in document["deliveries"]] == [first, second]
    assert (explained["external_id"], explained["holder"]["id"]) == (EXTERNAL_ID, task_id)


def test_an_external_id_wins_over_a_task_identifier_of_the_same_name(store: Store):
    a_settled_task(store)  # ACME-1 holds EXTERNAL_ID
    with session_scope(store.sessions) as session:
        create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=store.scalar("SELECT id FROM workspaces"),
            new=NewTask(title="Named like a task", external_id="ACME-1"),
        )

    document = as_json(taskhook(store, "task", "lookup", "--workspace", "acme", "ACME-1", "--json"))

    assert (document["external_id"], document["task"]["identifier"]) == ("ACME-1", "ACME-2")


def test_task_lookup_says_what_to_pass_when_an_identifier_names_no_identity(store: Store):
    workspace_id, *_ = an_unfinished_create(store)
    with session_scope(store.sessions) as session:
        release_external_id(
            session=session,
            workspace_id=workspace_id,
            external_id=EXTERNAL_ID,
            operator="alice",
            reason="worker died",
        )

    released = refused(taskhook(store, "task", "lookup", "--workspace", "acme", "ACME-1"))
    unknown = refused(taskhook(store, "task", "lookup", "--workspace", "acme", "ACME-9"))

    assert released == (
        "Error: task ACME-1 holds no external id (it was released, merged into another task, "
        "or created without one): pass the external id itself, e.g. 'jira:PROJ-12' or "
        "'gh-issue/OWNER/REPO#12'"
    )
    assert unknown == (
        "Error: no task in workspace acme holds external id 'ACME-9', and no task there is "
        "named ACME-9: pass an external id, e.g. 'jira:PROJ-12' or 'gh-issue/OWNER/REPO#12', "
        "or a task identifier"
    )


def test_task_lookup_of_a_released_identity_points_at_explain(store: Store):
    workspace_id, *_ = an_unfinished_create(store)
    with session_scope(store.sessions) as session:
        release_external_id(
            session=session,
            workspace_id=workspace_id,
            external_id=EXTERNAL_ID,
            operator="alice",
            reason="worker died",
        )
    line = refused(taskhook(store, "task", "lookup", "--workspace", "acme", EXTERNAL_ID))
    assert "released 1 time(s): taskhook explain" in line


def test_explain_prints_the_lineage_in_time_order(store: Store):
    _, _, creator, parked = an_unfinished_create(store)

    result = taskhook(store, "explain", "--workspace", "acme", EXTERNAL_ID)
    document = as_json(taskhook(store, "explain", "--workspace", "acme", EXTERNAL_ID, "--json"))

    assert result.exit_code == 0
    events = [event["what"] for event in document["events"]]
    assert events == [
        f"delivery {creator} received",
        "task ACME-1 created",
        # The insert's fence is the creator's last row update: it died after the insert.
        f"delivery {creator} processing",
        f"delivery {parked} received",
        f"delivery {parked} needs_operator",
    ]
    positions = [result.stdout.index(what) for what in events]
    assert positions == sorted(positions)
    assert "docs/runbook.md" in result.stdout
    assert document["holder"]["settled"] is False


def test_explain_of_an_identity_never_held_is_refused(store: Store):
    store.workspace()
    line = refused(taskhook(store, "explain", "--workspace", "acme", "jira:NOPE-1"))
    assert line == (
        "Error: nothing in workspace acme holds or held external id 'jira:NOPE-1', "
        "and no delivery named it"
    )


def test_explain_shows_the_deliveries_parked_before_any_task_held_the_identity(store: Store):
    acme = store.workspace()
    source_id = a_source(store, acme.id)
    parked = a_delivery(store, source_id, "d-1", external_id=EXTERNAL_ID)
    why = "workspace 1: step 'Inbox' is at its WIP limit of 0"
    settle_as(store, parked, DeliveryStatus.NEEDS_OPERATOR, reason=why)

    result = taskhook(store, "explain", "--workspace", "acme", EXTERNAL_ID)
    document = as_json(taskhook(store, "explain", "--workspace", "acme", EXTERNAL_ID, "--json"))
    lookup = refused(taskhook(store, "task", "lookup", "--workspace", "acme", EXTERNAL_ID))

    assert result.exit_code == 0, result.output
    assert "holds or held" not in result.output
    assert "Deliveries that named it and made no task:" in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith(f"{parked} "))
    assert row.split()[1:2] + row.split()[4:5] == ["d-1", "needs_operator"]
    assert why in row
    assert f"Parked: {parked}." in result.stdout
    assert f"delivery {parked} needs_operator" in result.stdout
    assert document["holder"] is None
    assert document["without_task"] == [parked]
    assert [d["external_id"] for d in document["deliveries"]] == [EXTERNAL_ID]
    assert lookup == (
        "Error: no task in workspace acme holds external id 'gh-issue/acme/api#12' "
        "(1 delivery(ies) named it and made none: "
        "taskhook explain --workspace acme 'gh-issue/acme/api#12')"
    )


def test_explain_after_a_release_keeps_the_former_holders_settlement(store: Store):
    task_id, *_ = a_settled_task(store)
    release(store, store.scalar("SELECT id FROM workspaces"))

    result = taskhook(store, "explain", "--workspace", "acme", EXTERNAL_ID)
    document = as_json(taskhook(store, "explain", "--workspace", "acme", EXTERNAL_ID, "--json"))

    assert "task ACME-1 settled" in result.stdout
    assert "identity released from ACME-1" in result.stdout
    (former,) = document["former_holders"]
    assert (former["id"], former["settled"], former["state"]) == (
        task_id,
        True,
        "settled, then released",
    )


def test_task_archive_by_identifier_or_id_makes_room_in_a_full_intake_step(store: Store):
    acme = store.workspace(intake_wip_limit=1)
    with session_scope(store.sessions) as session:
        task_id = create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=acme.id,
            new=NewTask(title="Fills the intake", external_id="jira:WIP-1"),
        ).task.id

    full = taskhook(store, "workspace", "wip", "acme")
    archived = taskhook(store, "task", "archive", "ACME-1")
    again = as_json(taskhook(store, "task", "archive", str(task_id), "--json"))
    room = taskhook(store, "workspace", "wip", "acme")

    assert "FULL" in full.stdout
    assert archived.exit_code == 0, archived.output
    assert archived.stdout.strip() == (
        "Archived ACME-1; it keeps its external id 'jira:WIP-1': a redelivery still finds it. "
        "It no longer counts against the WIP limit of step 'Inbox'."
    )
    assert (again["identifier"], again["archived_now"], again["external_id"]) == (
        "ACME-1",
        False,
        "jira:WIP-1",
    )
    assert "FULL" not in room.stdout
    assert store.scalar("SELECT archived_at IS NOT NULL FROM tasks WHERE id = :t", t=task_id)
    # The archive's event, once: the second archive changed nothing.
    assert store.scalar("SELECT count(*) FROM task_events WHERE type = 'task.archived'") == 1
    with session_scope(store.sessions) as session:
        create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=acme.id,
            new=NewTask(title="Now it fits", external_id="jira:WIP-2"),
        )


def test_task_archive_refuses_what_names_no_single_task_in_one_line(store: Store):
    acme, beta = store.workspace(), store.workspace("beta", "ACME")
    for workspace in (acme, beta):
        with session_scope(store.sessions) as session:
            create_task(
                session=session,
                caller=TRUSTED,
                workspace_id=workspace.id,
                new=NewTask(title="One each", external_id="jira:TWO-1"),
            )

    unknown = refused(taskhook(store, "task", "archive", "ACME-9"))
    no_id = refused(taskhook(store, "task", "archive", "404"))
    huge = refused(taskhook(store, "task", "archive", "99999999999999999999"))
    garbage = refused(taskhook(store, "task", "archive", "--", "-x"))
    twice = refused(taskhook(store, "task", "archive", "ACME-1"))
    elsewhere = refused(taskhook(store, "task", "archive", "ACME-9", "--workspace", "beta"))

    assert unknown == "Error: no task is named ACME-9"
    assert no_id == "Error: no task has id 404"
    assert huge == "Error: no task has id 99999999999999999999"
    assert garbage == "Error: '-x' is neither a task identifier (ACME-12) nor a task id (42)"
    assert twice == "Error: 2 tasks are named ACME-1: pass --workspace SLUG"
    assert elsewhere == "Error: no task is named ACME-9 in workspace beta"
    archived = as_json(
        taskhook(store, "task", "archive", "ACME-1", "--workspace", "beta", "--json")
    )
    assert archived["id"] == store.scalar(
        "SELECT t.id FROM tasks t JOIN workspaces w ON w.id = t.workspace_id WHERE w.slug = 'beta'"
    )
    assert store.scalar("SELECT count(*) FROM tasks WHERE archived_at IS NOT NULL") == 1


def test_task_deletions_and_explain_show_who_deleted_a_task(store: Store):
    acme = store.workspace()
    member = Caller.of_workspaces("alice-token", acme.id)
    with session_scope(store.sessions) as session:
        created = create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=acme.id,
            new=NewTask(title="Gone", external_id="jira:DEL-1"),
        )
        delete_task(session=session, caller=member, task_id=created.task.id)
    task_id = created.task.id

    listed = taskhook(store, "task", "deletions", "--workspace", "acme")
    rows = as_json(taskhook(store, "task", "deletions", "--json"))["deletions"]
    explained = taskhook(store, "explain", "--workspace", "acme", "jira:DEL-1")
    gone = as_json(taskhook(store, "explain", "--workspace", "acme", "jira:DEL-1", "--json"))

    assert listed.exit_code == 0, listed.output
    header, row = listed.stdout.splitlines()
    assert header.split() == [
        "DELETED",
        "(UTC)",
        "WORKSPACE",
        "TASK",
        "EXTERNAL",
        "ID",
        "BY",
        "ROLE",
    ]
    assert row.split()[2:] == [
        "acme",
        "ACME-1",
        f"({task_id})",
        "jira:DEL-1",
        "alice-token",
        "member",
    ]
    assert [(r["task_id"], r["operator"], r["role"], r["external_id"]) for r in rows] == [
        (task_id, "alice-token", "member", "jira:DEL-1")
    ]
    assert "deleted by alice-token (member)" in explained.stdout
    assert (gone["deleted_holders"][0]["deleted_by"], gone["deleted_holders"][0]["role"]) == (
        "alice-token",
        "member",
    )


def test_task_deletions_of_an_unknown_workspace_is_one_line(store: Store):
    line = refused(taskhook(store, "task", "deletions", "--workspace", "nope"))
    assert line == "Error: workspace 'nope' not found"


#: An issue title as a hostile sender writes it: it retitles the terminal,
#: clears the screen, and forges a line of output (C1's CSI too).
HOSTILE = "Login \x1b]0;pwned\x07 page \x1b[2J blank\r\nError: forged line \x9b31m"
#: Any control character but the newline the CLI lays its own lines out with.
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def test_no_command_prints_a_raw_control_character_from_a_title_or_a_name(store: Store):
    a_settled_task(store)
    with store.engine.begin() as connection:
        # The title as the issue gave it; a name as a store written before
        # names were checked may hold one.
        connection.execute(text("UPDATE tasks SET title = :t"), {"t": HOSTILE})
        connection.execute(text("UPDATE workspaces SET name = :t"), {"t": HOSTILE})
    with session_scope(store.sessions) as session:
        issue_token(session=session, name="ci", role="member", workspace_ids=[1])
    with store.engine.begin() as connection:
        connection.execute(text("UPDATE api_tokens SET name = :t"), {"t": HOSTILE})
    lookup = ("task", "lookup", "--workspace", "acme", EXTERNAL_ID)
    commands = [
        lookup,
        ("explain", "--workspace", "acme", EXTERNAL_ID),
        ("identities", "list", "--workspace", "acme"),
        ("deliveries", "list"),
        ("workspace", "list"),
        ("source", "list"),
        ("token", "list"),
        ("operations", "list"),
        ("task", "deletions"),
        ("stats",),
    ]
    for command in commands:
        for given in (command, (*command, "--json")):
            result = taskhook(store, *given)
            assert result.exit_code == 0, result.output
            raw = RAW_CONTROL.search(result.output)
            assert raw is None, f"taskhook {' '.join(given)} printed {raw[0]!r}"

    shown = taskhook(store, *lookup).stdout
    assert (
        r"ACME-1  Login \x1b]0;pwned\x07 page \x1b[2J blank\r\nError: forged line \x9b31m" in shown
    )
    assert not any(line.startswith("Error:") for line in shown.splitlines())
    assert as_json(taskhook(store, *lookup, "--json"))["task"]["title"] == HOSTILE
    names = taskhook(store, "token", "list").stdout + taskhook(store, "workspace", "list").stdout
    assert names.count(r"Login \x1b]0;pwned\x07") == 2
