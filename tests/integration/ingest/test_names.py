"""A task's names over REST, MCP and the console, and the console's merge
and undo, on SQLite and PostgreSQL (docs/contract.md §15, items 9 and 10).
The merge rules themselves: tests/integration/test_names_and_merges.py."""

from __future__ import annotations

from sqlalchemy import select

from ingest.mcp import _create as mcp_create
from models.db import session_scope
from models.merges import merge
from models.tables import IdentityMerge, Task
from models.tasks import NewTask
from models.tokens import authenticate
from tests.support.console import Console
from tests.support.ingress import Api
from tests.support.stores import TRUSTED, Store

OLD_SITE = "jira:OPS-7"
NEW_SITE = "jira:OPS2-7"
OWN = {"kind": "external", "name": OLD_SITE, "state": "held", "alias": False}
ALIAS = {"kind": "external", "name": NEW_SITE, "state": "held", "alias": True}


def _merged(store: Store, into: int, from_: int) -> int:
    with session_scope(store.sessions) as session:
        return merge(
            session=session,
            caller=TRUSTED,
            into_task_id=into,
            from_task_id=from_,
            operator="ops",
            reason="the Jira site migration",
        ).id


# --- REST -------------------------------------------------------------------------------------


def test_every_task_answer_carries_its_names(api: Api):
    created = api.create(external_id=OLD_SITE).json()
    assert created["names"] == [OWN]
    nameless = api.create().json()
    assert nameless["names"] == []
    headers = api.as_("acme-member")

    read = api.client.get(f"/api/v1/tasks/{created['id']}", headers=headers).json()
    page = api.client.get(f"/api/v1/workspaces/{api.acme}/tasks", headers=headers).json()
    found = api.lookup(OLD_SITE).json()

    assert read["names"] == page["tasks"][0]["names"] == found["names"] == [OWN]
    # Additive: every field the task had before is there, unchanged.
    assert {"id", "identifier", "external_id", "creation_complete"} <= found.keys()


def test_a_lookup_by_a_merged_name_finds_the_task_and_a_create_under_it_is_found(api: Api):
    into = api.create(external_id=OLD_SITE).json()
    from_ = api.create(external_id=NEW_SITE).json()
    _merged(api.store, into["id"], from_["id"])

    found = api.lookup(NEW_SITE)
    again = api.create(external_id=NEW_SITE)

    assert found.status_code == 200
    assert (found.json()["id"], found.json()["external_id"]) == (into["id"], OLD_SITE)
    assert found.json()["names"] == [OWN, ALIAS]
    assert (again.json()["id"], again.json()["deduplicated"]) == (into["id"], True)
    # Another workspace's token learns nothing of the alias.
    assert api.lookup(NEW_SITE, who="globex-member").status_code == 404
    # The released or merged-from task answers no more to the name.
    merged_from = api.client.get(
        f"/api/v1/tasks/{from_['id']}", headers=api.as_("acme-member")
    ).json()
    assert "external_id" not in merged_from and merged_from["archived_at"] is not None
    assert merged_from["names"] == []


def test_a_release_frees_the_aliases_with_the_identity(api: Api):
    into = api.create(external_id=OLD_SITE).json()
    from_ = api.create(external_id=NEW_SITE).json()
    _merged(api.store, into["id"], from_["id"])

    assert api.release(OLD_SITE, expected=into["id"]).status_code == 204

    assert api.lookup(NEW_SITE).status_code == 404
    created = api.create(external_id=NEW_SITE).json()
    assert created["deduplicated"] is False and created["id"] not in (into["id"], from_["id"])


# --- MCP --------------------------------------------------------------------------------------


def test_the_mcp_create_answers_with_the_names_and_is_found_under_an_alias(api: Api):
    into = api.create(external_id=OLD_SITE).json()
    from_ = api.create(external_id=NEW_SITE).json()
    _merged(api.store, into["id"], from_["id"])
    with api.store.sessions() as session:
        principal = authenticate(session=session, token=api.tokens["acme-member"])

    answer = mcp_create(
        api.store.sessions, principal, api.acme, NewTask(title="again", external_id=NEW_SITE)
    )

    assert (answer["id"], answer["deduplicated"]) == (into["id"], True)
    assert answer["names"] == [OWN, ALIAS]


# --- the console ------------------------------------------------------------------------------


def _two_tasks(console: Console) -> tuple[dict, dict]:
    made = []
    for external_id in (OLD_SITE, NEW_SITE):
        created = console.client.post(
            "/api/v1/tasks",
            json={"workspace_id": console.acme, "title": external_id, "external_id": external_id},
            headers={"Authorization": f"Bearer {console.tokens['acme-operator']}"},
        )
        assert created.status_code == 200, created.text
        made.append(created.json())
    return made[0], made[1]


def _merge_form(into: dict, **fields: str) -> dict[str, str]:
    return {
        "workspace": "acme",
        "external_id": OLD_SITE,
        "into": str(into["id"]),
        "from": "ACME-2",
        "confirm": "ACME-2",
        "reason": "site migration",
    } | fields


def _merges(console: Console) -> list[IdentityMerge]:
    with console.store.sessions() as session:
        return list(session.scalars(select(IdentityMerge)))


def test_the_task_view_lists_names_and_finds_a_task_by_an_alias(console: Console):
    into, from_ = _two_tasks(console)
    _merged(console.store, into["id"], from_["id"])
    console.sign_in("acme-member")

    page = console.client.get(f"/console/tasks?workspace=acme&external_id={NEW_SITE}")

    assert page.status_code == 200
    assert 'id="alias-of"' in page.text and 'id="names"' in page.text
    assert f'<td class="name">{OLD_SITE}</td>' in page.text
    assert f'<td class="name">{NEW_SITE}</td>' in page.text
    # A member reads the merge's audit, and sees no merge, undo or release form.
    assert "the Jira site migration" in page.text
    for action in ('id="merge"', 'class="undo-merge"', 'id="release"'):
        assert action not in page.text


def test_an_operator_merges_from_the_task_view_and_undoes_it(console: Console):
    into, from_ = _two_tasks(console)
    csrf = console.sign_in("acme-operator")
    shown = console.client.get(f"/console/tasks?workspace=acme&external_id={OLD_SITE}")
    assert 'id="merge"' in shown.text

    merged = console.post("/console/tasks/merge", csrf, **_merge_form(into))

    assert merged.status_code == 200 and 'class="notice"' in merged.text, merged.text
    (audit,) = _merges(console)
    assert (audit.into_task_id, audit.from_task_id, audit.operator) == (
        into["id"],
        from_["id"],
        "acme-operator",
    )
    assert 'class="undo-merge"' in merged.text
    # On the page of the alias, the merge form, but no release: an alias is
    # freed by releasing the identity it is an alias of.
    alias_page = console.client.get(f"/console/tasks?workspace=acme&external_id={NEW_SITE}")
    assert 'id="merge"' in alias_page.text and 'id="release"' not in alias_page.text
    assert (
        'id="release"'
        in console.client.get(f"/console/tasks?workspace=acme&external_id={OLD_SITE}").text
    )

    undone = console.post(
        f"/console/merges/{audit.id}/undo",
        csrf,
        workspace="acme",
        external_id=OLD_SITE,
        reason="two items after all",
    )

    assert undone.status_code == 200 and 'class="notice"' in undone.text, undone.text
    with console.store.sessions() as session:
        assert session.get(Task, from_["id"]).external_id == NEW_SITE
        assert session.get(IdentityMerge, audit.id).undone_by == "acme-operator"
    again = console.post(
        f"/console/merges/{audit.id}/undo", csrf, workspace="acme", external_id=OLD_SITE, reason="x"
    )
    assert again.status_code == 409 and "undone already" in again.text


def test_a_merge_needs_the_typed_identifier_a_reason_and_the_same_workspace(console: Console):
    into, _ = _two_tasks(console)
    csrf = console.sign_in("acme-operator")
    untyped = console.post("/console/tasks/merge", csrf, **_merge_form(into, confirm="ACME-9"))
    unknown = console.post(
        "/console/tasks/merge", csrf, **_merge_form(into, confirm="ACME-9", **{"from": "ACME-9"})
    )
    itself = console.post(
        "/console/tasks/merge", csrf, **_merge_form(into, confirm="ACME-1", **{"from": "ACME-1"})
    )
    no_reason = console.post("/console/tasks/merge", csrf, **_merge_form(into, reason=" "))

    assert untyped.status_code == 400 and "to confirm" in untyped.text
    assert unknown.status_code == 400 and "No task" in unknown.text
    assert itself.status_code == 400 and "into itself" in itself.text
    assert no_reason.status_code == 400 and "reason" in no_reason.text
    assert _merges(console) == []


def test_merge_and_undo_are_an_operators_with_the_sessions_csrf(console: Console):
    into, from_ = _two_tasks(console)
    audit = _merged(console.store, into["id"], from_["id"])
    member = console.sign_in("acme-member")
    assert console.post("/console/tasks/merge", member, **_merge_form(into)).status_code == 403
    undo = {"workspace": "acme", "external_id": OLD_SITE, "reason": "x"}
    assert console.post(f"/console/merges/{audit}/undo", member, **undo).status_code == 403
    console.sign_in("acme-operator")
    for csrf in (None, "forged"):
        assert console.post(f"/console/merges/{audit}/undo", csrf, **undo).status_code == 403
        assert console.post("/console/tasks/merge", csrf, **_merge_form(into)).status_code == 403
    # Another workspace's operator: the merge answers as one that does not exist.
    outsider = console.sign_in("globex-operator")
    answer = console.post(f"/console/merges/{audit}/undo", outsider, **undo)
    assert answer.status_code == 404
    with console.store.sessions() as session:
        assert session.get(IdentityMerge, audit).undone_at is None
