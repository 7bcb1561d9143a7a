"""The REST surface through HTTP on SQLite and PostgreSQL: every outcome tuple,
the order of checks, and two tenants who cannot see each other."""

from __future__ import annotations

import importlib.metadata

import pytest

import ingest.api
from models.db import session_scope
from models.tasks import CreateHooks, create_task, release_external_id
from models.tokens import revoke_token
from tests.support.ingress import Api


def outcome_tuple(response) -> tuple:
    body = response.json()
    return (
        response.status_code,
        body["deduplicated"],
        body["creation_complete"],
        "external_id" in body,
    )


# --- the four outcomes -------------------------------------------------------------------


def test_created(api: Api):
    response = api.create(external_id="jira:PROJ-1")
    assert outcome_tuple(response) == (200, False, True, True)
    body = response.json()
    assert (body["external_id"], body["identifier"], body["workspace_id"]) == (
        "jira:PROJ-1",
        "ACME-1",
        api.acme,
    )


def test_found_settled(api: Api):
    first = api.create(external_id="jira:PROJ-1").json()
    again = api.create(external_id="jira:PROJ-1", title="another title")
    assert outcome_tuple(again) == (200, True, True, True)
    assert again.json()["id"] == first["id"]
    assert api.count_tasks() == 1


def test_found_unsettled(api: Api):
    first = api.create(external_id="jira:PROJ-1").json()
    with api.store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE tasks SET external_id_settled_at = NULL")
    again = api.create(external_id="jira:PROJ-1")
    assert outcome_tuple(again) == (200, True, False, True)
    assert again.json()["id"] == first["id"]


def test_created_identity_lost(api: Api, monkeypatch):
    def released_before_settle(task):
        with session_scope(api.store.sessions) as session:
            release_external_id(
                session=session,
                workspace_id=task.workspace_id,
                external_id=task.external_id,
                operator="someone else",
                reason="race",
            )

    def create_with_race(**arguments):
        return create_task(**arguments, hooks=CreateHooks(after_insert=released_before_settle))

    monkeypatch.setattr(ingest.api, "create_task", create_with_race)
    response = api.create(external_id="jira:PROJ-1")
    assert outcome_tuple(response) == (200, False, True, False)


def test_a_create_without_an_external_id_omits_it(api: Api):
    for external_id in (None, "   "):
        response = api.create(external_id=external_id)
        assert outcome_tuple(response) == (200, False, True, False)


@pytest.mark.parametrize(
    ("external_id", "reason"),
    [
        ("jira:PROJ-1\n", "control characters"),
        ("x" * 256, "at most 255 bytes"),
        (42, "external_id"),
    ],
)
def test_an_invalid_external_id_is_400_with_its_reason(api: Api, external_id, reason):
    response = api.create(external_id=external_id)
    assert response.status_code == 400
    assert reason in response.json()["error"]
    assert api.count_tasks() == 0


@pytest.mark.parametrize(
    "body",
    [{"title": "no workspace"}, {"workspace_id": "1", "title": "t"}, {"workspace_id": 1}],
)
def test_a_malformed_create_is_400(api: Api, body):
    response = api.client.post("/api/v1/tasks", json=body, headers=api.as_("acme-member"))
    assert response.status_code == 400
    assert "error" in response.json()


def test_a_body_that_is_not_json_is_400(api: Api):
    response = api.client.post("/api/v1/tasks", content=b"{nope", headers=api.as_("acme-member"))
    assert response.status_code == 400


def test_a_full_wip_step_is_409_but_a_retry_is_found(api: Api):
    with api.store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE workflow_steps SET wip_limit = 1 WHERE position = 0")
    assert api.create(external_id="jira:PROJ-1").status_code == 200
    assert outcome_tuple(api.create(external_id="jira:PROJ-1")) == (200, True, True, True)
    full = api.create(external_id="jira:PROJ-2")
    assert full.status_code == 409
    assert "WIP limit" in full.json()["error"]


# --- order of checks ------------------------------------------------------------------------


def test_no_token_or_a_bad_token_is_401(api: Api):
    body = {"workspace_id": api.acme, "title": "t"}
    assert api.client.post("/api/v1/tasks", json=body).status_code == 401
    bad = {"Authorization": "Bearer th_not-a-token"}
    response = api.client.post("/api/v1/tasks", json=body, headers=bad)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_a_revoked_token_is_401(api: Api):
    with session_scope(api.store.sessions) as session:
        revoke_token(session=session, token_id=1)
    assert api.create().status_code == 401


def test_authorization_precedes_validation_and_lookup(api: Api):
    api.create(external_id="jira:PROJ-1")
    for external_id in ("jira:PROJ-1", "invalid\n", "jira:PROJ-404"):
        response = api.create(who="globex-member", external_id=external_id)
        assert (response.status_code, response.json()) == (404, {"error": "task not created"})
        lookup = api.lookup(external_id, who="globex-member")
        assert (lookup.status_code, lookup.json()) == (404, {"error": "task not found"})
        assert api.release(external_id, who="globex-operator").status_code == 404
    assert api.count_tasks() == 1


def test_a_workspace_that_does_not_exist_answers_like_one_without_access(api: Api):
    missing = api.create(workspace_id=9999, external_id="invalid\n")
    assert (missing.status_code, missing.json()) == (404, {"error": "task not created"})


# --- lookup ------------------------------------------------------------------------------------


def test_lookup_returns_the_holder_with_creation_complete(api: Api):
    created = api.create(external_id="jira:PROJ-1").json()
    response = api.lookup("jira:PROJ-1")
    assert response.status_code == 200
    assert response.json()["id"] == created["id"]
    assert response.json()["creation_complete"] is True
    assert "deduplicated" not in response.json()


def test_lookup_includes_archived_and_unsettled_tasks(api: Api):
    task_id = api.create(external_id="jira:PROJ-1").json()["id"]
    api.client.post(f"/api/v1/tasks/{task_id}/archive", headers=api.as_("acme-member"))
    with api.store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE tasks SET external_id_settled_at = NULL")
    body = api.lookup("jira:PROJ-1").json()
    assert (body["id"], body["creation_complete"]) == (task_id, False)
    assert body["archived_at"] is not None


def test_lookup_misses_and_bad_values(api: Api):
    assert api.lookup("jira:PROJ-404").json() == {"error": "task not found"}
    assert api.lookup("jira:PROJ-404").status_code == 404
    assert api.lookup(None).status_code == 400
    assert api.lookup("bad\x7f").status_code == 400
    assert api.lookup("  ").status_code == 400
    assert api.count_tasks() == 0


# --- release ------------------------------------------------------------------------------------


def test_release_by_a_member_is_refused(api: Api):
    api.create(external_id="jira:PROJ-1")
    response = api.release("jira:PROJ-1", who="acme-member")
    assert response.status_code == 403
    assert api.lookup("jira:PROJ-1").status_code == 200


def test_release_by_an_operator_frees_the_identity_and_is_audited(api: Api):
    first = api.create(external_id="jira:PROJ-1").json()

    response = api.release("jira:PROJ-1", reason="the issue was recreated in Jira")

    assert response.status_code == 204
    assert api.lookup("jira:PROJ-1").status_code == 404
    kept = api.client.get(f"/api/v1/tasks/{first['id']}", headers=api.as_("acme-member")).json()
    assert "external_id" not in kept
    audit = api.store.scalar("SELECT operator || ' / ' || reason FROM identity_releases")
    assert audit == "acme-operator / the issue was recreated in Jira"
    again = api.create(external_id="jira:PROJ-1")
    assert outcome_tuple(again) == (200, False, True, True)
    assert again.json()["id"] != first["id"]


def test_release_answers_404_and_400_as_the_contract_says(api: Api):
    assert api.release("jira:PROJ-404").status_code == 404
    assert api.release("bad\n").status_code == 400
    api.create(external_id="jira:PROJ-1")
    assert api.release("jira:PROJ-1", reason=None).status_code == 400
    assert api.release("jira:PROJ-1", reason="  ").status_code == 400
    assert api.store.scalar("SELECT count(*) FROM identity_releases") == 0


def test_a_reason_the_audit_cannot_keep_as_given_is_400_and_nothing_is_released(api: Api):
    api.create(external_id="jira:PROJ-1")
    for reason, why in [
        ("x" * 5_000, "at most 1000 characters"),
        ("line one\nline two", "control characters"),
        ("bell \x07", "control characters"),
        ("csi \x9b2J", "control characters"),
    ]:
        response = api.release("jira:PROJ-1", reason=reason)
        assert response.status_code == 400, reason[:20]
        assert why in response.json()["error"]
    assert api.store.scalar("SELECT count(*) FROM identity_releases") == 0
    assert api.lookup("jira:PROJ-1").status_code == 200


def test_a_release_naming_a_holder_that_changed_is_409_naming_the_holder(api: Api):
    first = api.create(external_id="jira:PROJ-1").json()
    api.client.delete(f"/api/v1/tasks/{first['id']}", headers=api.as_("acme-member"))
    second = api.create(external_id="jira:PROJ-1").json()  # the identity's new holder

    response = api.release("jira:PROJ-1", expected=first["id"])

    assert response.status_code == 409
    error = response.json()["error"]
    assert f"held by task {second['identifier']} (id {second['id']})" in error
    assert "nothing was released" in error
    assert api.lookup("jira:PROJ-1").json()["id"] == second["id"]
    assert api.store.scalar("SELECT count(*) FROM identity_releases") == 0


def test_a_release_naming_the_holder_releases_it_and_the_audit_keeps_both_ids(api: Api):
    task = api.create(external_id="jira:PROJ-1").json()

    assert api.release("jira:PROJ-1", expected=task["id"]).status_code == 204

    audit = api.store.scalar("SELECT task_id || '/' || expected_task_id FROM identity_releases")
    assert audit == f"{task['id']}/{task['id']}"
    assert api.release("jira:PROJ-1", expected=0).status_code == 400  # not an id


# --- plain task routes and two tenants --------------------------------------------------------


def test_task_reads_do_not_carry_creation_complete(api: Api):
    task_id = api.create(external_id="jira:PROJ-1").json()["id"]
    body = api.client.get(f"/api/v1/tasks/{task_id}", headers=api.as_("acme-member")).json()
    assert body["external_id"] == "jira:PROJ-1"
    assert "creation_complete" not in body and "deduplicated" not in body


def test_listing_is_paginated(api: Api):
    ids = [api.create(title=f"task {n}").json()["id"] for n in range(5)]
    url = f"/api/v1/workspaces/{api.acme}/tasks"
    first = api.client.get(url, params={"limit": 2}, headers=api.as_("acme-member")).json()
    assert [t["id"] for t in first["tasks"]] == ids[:2]
    rest = api.client.get(
        url, params={"limit": 10, "after": first["next_after"]}, headers=api.as_("acme-member")
    ).json()
    assert [t["id"] for t in rest["tasks"]] == ids[2:]
    assert rest["next_after"] is None


def test_patch_edits_title_and_description_but_never_the_external_id(api: Api):
    task_id = api.create(external_id="jira:PROJ-1").json()["id"]
    url = f"/api/v1/tasks/{task_id}"
    headers = api.as_("acme-member")

    edited = api.client.patch(url, json={"title": "New title", "description": "d"}, headers=headers)
    assert (edited.json()["title"], edited.json()["description"]) == ("New title", "d")
    refused = api.client.patch(url, json={"external_id": "jira:PROJ-2"}, headers=headers)
    assert refused.status_code == 400
    assert "external_id" in refused.json()["error"]
    assert api.client.patch(url, json={"colour": "red"}, headers=headers).status_code == 400
    assert api.client.patch(url, json={"title": " "}, headers=headers).status_code == 400
    assert api.lookup("jira:PROJ-1").json()["title"] == "New title"


def test_archive_keeps_and_delete_frees_the_identity(api: Api):
    headers = api.as_("acme-member")
    task_id = api.create(external_id="jira:PROJ-1").json()["id"]
    archived = api.client.post(f"/api/v1/tasks/{task_id}/archive", headers=headers)
    assert archived.status_code == 200 and archived.json()["archived_at"]
    assert outcome_tuple(api.create(external_id="jira:PROJ-1"))[1] is True

    assert api.client.delete(f"/api/v1/tasks/{task_id}", headers=headers).status_code == 204
    assert api.client.get(f"/api/v1/tasks/{task_id}", headers=headers).status_code == 404
    assert outcome_tuple(api.create(external_id="jira:PROJ-1")) == (200, False, True, True)


def test_another_tenant_gets_what_a_missing_object_gets_on_every_route(api: Api):
    task_id = api.create(external_id="jira:PROJ-1").json()["id"]
    outsider = api.as_("globex-operator")
    missing_task = 999_999
    for target in (task_id, missing_task):
        answers = [
            api.client.get(f"/api/v1/tasks/{target}", headers=outsider),
            api.client.patch(f"/api/v1/tasks/{target}", json={"title": "x"}, headers=outsider),
            api.client.post(f"/api/v1/tasks/{target}/archive", headers=outsider),
            api.client.delete(f"/api/v1/tasks/{target}", headers=outsider),
        ]
        assert [(r.status_code, r.json()) for r in answers] == [
            (404, {"error": "task not found"})
        ] * 4
    for workspace in (api.acme, 9999):
        listing = api.client.get(f"/api/v1/workspaces/{workspace}/tasks", headers=outsider)
        assert (listing.status_code, listing.json()) == (404, {"error": "task not found"})
    task = api.client.get(f"/api/v1/tasks/{task_id}", headers=api.as_("acme-member")).json()
    assert (task["title"], task["archived_at"]) == ("Fix the login page", None)


def test_the_openapi_document_names_every_provider_and_the_installed_version(api: Api):
    info = api.client.get("/openapi.json").json()["info"]

    assert info["summary"].startswith("GitHub, Jira and GitLab webhooks in")
    assert info["version"] == importlib.metadata.version("taskhook")


def test_the_openapi_document_describes_every_route_and_the_narrow_meanings(api: Api):
    spec = api.client.get("/openapi.json").json()
    assert {
        "/api/v1/tasks",
        "/api/v1/tasks/{task_id}",
        "/api/v1/tasks/{task_id}/archive",
        "/api/v1/workspaces/{workspace_id}/tasks",
        "/api/v1/workspaces/{workspace_id}/tasks/by-external-id",
    } <= set(spec["paths"])
    by_external_id = spec["paths"]["/api/v1/workspaces/{workspace_id}/tasks/by-external-id"]

    def required(method: str) -> dict[str, bool]:
        return {
            parameter["name"]: parameter.get("required", False)
            for parameter in by_external_id[method]["parameters"]
            if parameter["in"] == "query"
        }

    # What the server answers 400 without is required in the document too.
    assert required("get") == {"external_id": True}
    assert required("delete") == {"external_id": True, "reason": True, "expected_task_id": False}
    assert "409" in by_external_id["delete"]["responses"]
    created = spec["components"]["schemas"]["CreatedTask"]["properties"]
    assert "does not mean the task is done" in created["creation_complete"]["description"]
    assert "created nothing" in created["deduplicated"]["description"]
