"""``taskhook workspace``: add and list, for people and for scripts."""

from __future__ import annotations

import pytest

from models.db import session_scope
from models.errors import InvalidWorkspace
from models.tasks import NewTask, create_task
from models.workspaces import set_wip_limit
from tests.support.cli import as_json, refused, taskhook, usage_error
from tests.support.stores import TRUSTED, Store


def test_workspace_add_then_list_for_people_and_for_scripts(store: Store):
    added = taskhook(store, "workspace", "add", "acme", "--name", "Acme Corp", "--prefix", "ACME")
    taskhook(store, "workspace", "add", "beta", "--name", "Beta", "--prefix", "BETA", "--json")

    assert added.exit_code == 0
    assert "ACME-1" in added.stdout
    table = taskhook(store, "workspace", "list").stdout.splitlines()
    acme_id = store.scalar("SELECT id FROM workspaces WHERE slug = 'acme'")
    # ID first: what the REST routes take (/api/v1/workspaces/ID/tasks).
    assert table[0].split() == ["ID", "SLUG", "NAME", "PREFIX", "TASKS", "SOURCES", "CREATED"]
    assert table[1].startswith(f"{acme_id}   acme  Acme Corp  ACME")
    listed = as_json(taskhook(store, "workspace", "list", "--json"))["workspaces"]
    assert [(w["slug"], w["task_prefix"], w["tasks"]) for w in listed] == [
        ("acme", "ACME", 0),
        ("beta", "BETA", 0),
    ]


def test_workspace_add_sets_the_intake_wip_limit(store: Store):
    taskhook(store, "workspace", "add", "acme", "--name", "A", "--prefix", "A", "--wip-limit", "3")
    assert store.scalar("SELECT wip_limit FROM workflow_steps WHERE position = 0") == 3
    assert store.scalar("SELECT count(*) FROM workflow_steps") == 3


def test_a_duplicate_workspace_slug_is_refused(store: Store):
    store.workspace("acme")
    line = refused(taskhook(store, "workspace", "add", "acme", "--name", "A", "--prefix", "ACME"))
    assert line == "Error: a workspace with slug 'acme' already exists"


def test_workspace_wip_shows_then_sets_and_removes_a_steps_limit(store: Store):
    acme = store.workspace(intake_wip_limit=1)
    with session_scope(store.sessions) as session:
        create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=acme.id,
            new=NewTask(title="Fills the intake", external_id="jira:WIP-1"),
        )

    shown = taskhook(store, "workspace", "wip", "acme")
    raised = taskhook(store, "workspace", "wip", "acme", "--limit", "5")
    done = as_json(
        taskhook(store, "workspace", "wip", "acme", "--step", "Done", "--limit", "0", "--json")
    )
    removed = taskhook(store, "workspace", "wip", "acme", "--no-limit")

    assert shown.exit_code == 0, shown.output
    assert [line.split() for line in shown.stdout.splitlines()] == [
        ["STEP", "WIP", "LIMIT", "TASKS", "NOTE"],
        ["Inbox", "1", "1", "intake,", "FULL"],
        ["Done", "none", "0"],
    ]
    assert (
        raised.stdout.splitlines()[0] == "Step 'Inbox' of workspace acme has a WIP limit of 5 now."
    )
    assert done["steps"] == [
        {"name": "Done", "position": 1, "intake": False, "wip_limit": 0, "tasks": 0, "full": True}
    ]
    assert removed.stdout.splitlines()[0] == "Step 'Inbox' of workspace acme has no WIP limit now."
    limits = "SELECT wip_limit FROM workflow_steps WHERE name = :n"
    assert (store.scalar(limits, n="Inbox"), store.scalar(limits, n="Done")) == (None, 0)


def test_workspace_wip_refuses_bad_input_in_one_line(store: Store):
    store.workspace(intake_wip_limit=2)

    negative = usage_error(taskhook(store, "workspace", "wip", "acme", "--limit", "-1"))
    step = refused(taskhook(store, "workspace", "wip", "acme", "--step", "Review", "--limit", "3"))
    shown = refused(taskhook(store, "workspace", "wip", "acme", "--step", "Review"))
    workspace = refused(taskhook(store, "workspace", "wip", "nope", "--limit", "3"))
    both = usage_error(taskhook(store, "workspace", "wip", "acme", "--limit", "3", "--no-limit"))

    assert negative == "Error: Invalid value for '--limit': -1 is not in the range x>=0."
    assert step == "Error: no step 'Review' in the workspace (its steps: 'Inbox', 'Done')"
    assert shown == step
    assert workspace == "Error: workspace 'nope' not found"
    assert both == "Error: give --limit N or --no-limit, not both"
    assert store.scalar("SELECT wip_limit FROM workflow_steps WHERE name = 'Inbox'") == 2


def test_a_wip_limit_is_never_negative_whoever_sets_it(store: Store):
    acme = store.workspace()
    with session_scope(store.sessions) as session, pytest.raises(InvalidWorkspace):
        set_wip_limit(session=session, workspace_id=acme.id, step_name=None, wip_limit=-1)


def test_workspace_deletes_shows_then_reserves_and_lifts_deletes(store: Store):
    store.workspace("acme")

    shown = taskhook(store, "workspace", "deletes", "acme")
    reserved = taskhook(store, "workspace", "deletes", "acme", "--operators-only")
    again = as_json(taskhook(store, "workspace", "deletes", "acme", "--operators-only", "--json"))
    stored = store.scalar("SELECT deletes_need_operator FROM workspaces")
    lifted = as_json(taskhook(store, "workspace", "deletes", "acme", "--members-too", "--json"))

    assert shown.stdout == "Tasks of workspace acme may be deleted by member and operator tokens.\n"
    assert (
        reserved.stdout == "Tasks of workspace acme may be deleted by operator tokens only now.\n"
    )
    assert bool(stored) is True
    assert again == {"workspace": "acme", "changed": False, "deletes_need_operator": True}
    assert lifted == {"workspace": "acme", "changed": True, "deletes_need_operator": False}
    assert not store.scalar("SELECT deletes_need_operator FROM workspaces")


def test_workspace_deletes_of_an_unknown_workspace_is_one_line(store: Store):
    line = refused(taskhook(store, "workspace", "deletes", "nope", "--operators-only"))
    assert line == "Error: workspace 'nope' not found"
