"""``taskhook identities`` (list, merges, merge, unmerge), and the names
``task lookup`` and ``explain`` show: an alias finds its task
(docs/contract.md §15, items 9 and 10)."""

from __future__ import annotations

from sqlalchemy import select

from models.db import session_scope
from models.tables import IdentityMerge, Task
from models.tasks import NewTask, create_task
from tests.support.cli import as_json, refused, taskhook, usage_error
from tests.support.stores import TRUSTED, Store

OLD_SITE = "jira:OPS-7"
NEW_SITE = "jira:OPS2-7"
MERGE = ("identities", "merge", "--into", "ACME-1", "--from", "ACME-2", "--operator", "ana")


def _two_tasks(store: Store) -> tuple[int, int]:
    workspace = store.workspace()
    ids = []
    with session_scope(store.sessions) as session:
        for external_id in (OLD_SITE, NEW_SITE):
            created = create_task(
                session=session,
                caller=TRUSTED,
                workspace_id=workspace.id,
                new=NewTask(title=f"Issue {external_id}", external_id=external_id),
            )
            ids.append(created.task.id)
    return ids[0], ids[1]


def _merges(store: Store) -> list[IdentityMerge]:
    with store.sessions() as session:
        return list(session.scalars(select(IdentityMerge)))


def test_merge_shows_what_it_will_do_asks_and_merges(store: Store):
    into, from_ = _two_tasks(store)

    declined = taskhook(store, *MERGE, "--reason", "site migration", input="n\n")
    assert declined.exit_code == 1 and _merges(store) == []
    assert "ACME-1 (id 1)" in declined.output and "ACME-2 (id 2)" in declined.output
    assert f"{NEW_SITE} (held) become aliases of ACME-1" in declined.output
    assert "ACME-2 gives up its external id and is archived; it is not deleted" in declined.output

    done = taskhook(store, *MERGE, "--reason", "site migration", input="y\n")

    assert done.exit_code == 0, done.output
    (audit,) = _merges(store)
    assert (audit.into_task_id, audit.from_task_id, audit.operator, audit.reason) == (
        into,
        from_,
        "ana",
        "site migration",
    )
    assert done.stdout.splitlines()[-1] == (
        f"Merged ACME-2 into ACME-1: merge {audit.id}, operator ana. "
        f"Undo: taskhook identities unmerge {audit.id} --reason TEXT"
    )

    undone = taskhook(store, "identities", "unmerge", str(audit.id), "--reason", "two items")

    assert undone.exit_code == 0, undone.output
    assert undone.stdout.strip().startswith(
        f"Undid merge {audit.id}: {NEW_SITE} are ACME-2's again"
    )


def test_merge_without_a_terminal_needs_yes(store: Store):
    _two_tasks(store)
    message = usage_error(taskhook(store, *MERGE, "--reason", "site migration"))
    assert "pass --yes" in message
    assert _merges(store) == []


def test_merge_and_unmerge_print_json_and_lookup_follows(store: Store):
    into, from_ = _two_tasks(store)

    merged = as_json(taskhook(store, *MERGE, "--reason", "site migration", "--yes", "--json"))

    assert (merged["into_task_id"], merged["from_task_id"], merged["undone"]) == (
        into,
        from_,
        False,
    )
    found = as_json(taskhook(store, "task", "lookup", "--workspace", "acme", NEW_SITE, "--json"))
    assert found["task"]["id"] == into
    assert found["task"]["names"] == [
        {"kind": "external", "name": OLD_SITE, "state": "held", "alias": False},
        {"kind": "external", "name": NEW_SITE, "state": "held", "alias": True},
    ]
    listed = as_json(taskhook(store, "identities", "list", "--task", str(into), "--json"))
    assert [(n["name"], n["merge_id"]) for n in listed["names"]] == [
        (OLD_SITE, None),
        (NEW_SITE, merged["id"]),
    ]
    assert [m["id"] for m in listed["merges"]] == [merged["id"]]

    undone = as_json(
        taskhook(
            store,
            "identities",
            "unmerge",
            str(merged["id"]),
            "--operator",
            "bo",
            "--reason",
            "two items after all",
            "--json",
        )
    )

    assert (undone["undone"], undone["undone_by"]) == (True, "bo")
    again = as_json(taskhook(store, "task", "lookup", "--workspace", "acme", NEW_SITE, "--json"))
    assert again["task"]["id"] == from_


def test_lookup_and_explain_of_an_alias_name_the_task_and_all_its_names(store: Store):
    _two_tasks(store)
    assert taskhook(store, *MERGE, "--reason", "site migration", "--yes").exit_code == 0

    lookup = taskhook(store, "task", "lookup", "--workspace", "acme", NEW_SITE)
    explain = taskhook(store, "explain", "--workspace", "acme", NEW_SITE)

    assert lookup.exit_code == 0, lookup.output
    assert "ACME-1  Issue jira:OPS-7" in lookup.output
    assert f"names        {OLD_SITE} (held), {NEW_SITE} (held, alias)" in lookup.output
    assert explain.exit_code == 0, explain.output
    assert f"Now: an alias of ACME-1 (task 1), which answers to {OLD_SITE}" in explain.output


def test_release_of_an_alias_points_at_the_identity_that_frees_it(store: Store):
    _two_tasks(store)
    taskhook(store, *MERGE, "--reason", "site migration", "--yes")
    message = refused(
        taskhook(store, "release", "--workspace", "acme", NEW_SITE, "--reason", "x", "--yes")
    )
    assert message == (
        f"Error: {NEW_SITE!r} is an alias of ACME-1, which holds {OLD_SITE!r}: release that "
        "(its aliases are freed with it)"
    )


def test_identities_list_of_a_workspace_and_the_merges_audit(store: Store):
    _two_tasks(store)
    listed = taskhook(store, "identities", "list", "--workspace", "acme")
    assert listed.exit_code == 0, listed.output
    assert OLD_SITE in listed.output and NEW_SITE in listed.output
    assert "OPERATOR" not in listed.output  # no merge yet, so no merges table
    taskhook(store, *MERGE, "--reason", "site migration", "--yes")

    audit = taskhook(store, "identities", "merges", "--workspace", "acme")

    assert audit.exit_code == 0, audit.output
    assert "site migration" in audit.output and "ana" in audit.output


def test_refusals_are_one_line(store: Store):
    _, from_ = _two_tasks(store)
    assert usage_error(taskhook(store, "identities", "list")) == (
        "Error: name a workspace (--workspace SLUG) or a task (--task ID)"
    )
    assert refused(
        taskhook(store, "identities", "merge", "--into", "1", "--from", "1", "--reason", "x")
    ) == ("Error: task ACME-1 cannot be merged into itself")
    assert refused(
        taskhook(store, "identities", "merge", "--into", "1", "--from", "77", "--reason", "x")
    ) == ("Error: task 77 not found")
    assert refused(
        taskhook(store, "identities", "merge", "--into", "1", "--from", "ACME-9", "--reason", "x")
    ) == ("Error: no task is named ACME-9: pass the task id (--from 42)")
    assert "neither a task id" in usage_error(
        taskhook(store, "identities", "merge", "--into", "x y", "--from", "2", "--reason", "x")
    )
    assert "a merge must give a reason" in usage_error(
        taskhook(store, "identities", "merge", "--into", "1", "--from", "2", "--reason", " ")
    )
    assert refused(taskhook(store, "identities", "unmerge", "5", "--reason", "x")) == (
        "Error: merge 5 not found"
    )
    merged = as_json(taskhook(store, *MERGE, "--reason", "site migration", "--yes", "--json"))
    undo = ("identities", "unmerge", str(merged["id"]), "--reason", "wrong")
    assert taskhook(store, *undo).exit_code == 0
    assert "was undone already" in refused(taskhook(store, *undo))
    with store.sessions() as session:
        assert session.get(Task, from_).external_id == NEW_SITE
