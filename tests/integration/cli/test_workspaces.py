"""``taskhook workspace``: add and list, for people and for scripts."""

from __future__ import annotations

from tests.support.cli import as_json, refused, taskhook
from tests.support.stores import Store


def test_workspace_add_then_list_for_people_and_for_scripts(store: Store):
    added = taskhook(store, "workspace", "add", "acme", "--name", "Acme Corp", "--prefix", "ACME")
    taskhook(store, "workspace", "add", "beta", "--name", "Beta", "--prefix", "BETA", "--json")

    assert added.exit_code == 0
    assert "ACME-1" in added.stdout
    table = taskhook(store, "workspace", "list").stdout.splitlines()
    assert table[0].split() == ["SLUG", "NAME", "PREFIX", "TASKS", "SOURCES", "CREATED"]
    assert table[1].startswith("acme  Acme Corp  ACME")
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
