"""Deleting a task over REST, on SQLite and PostgreSQL: every delete is
audited as a release is (who, when, which identity), in the delete's own
transaction, and a workspace may reserve deletes to operators
(docs/contract.md §3 and §11, "Delete")."""

from __future__ import annotations

from sqlalchemy import select

from models.db import session_scope
from models.reports import get_workspace
from models.tables import TaskDeletion, utcnow
from models.workspaces import reserve_deletes
from tests.support.ingress import Api

AUDIT = "SELECT operator || '/' || role || '/' || identifier || '/' || {} FROM task_deletions"


def _reserve(api: Api, to_operators: bool = True) -> None:
    with session_scope(api.store.sessions) as session:
        workspace = get_workspace(session=session, slug="acme")
        reserve_deletes(session=session, workspace=workspace, to_operators=to_operators)


def _delete(api: Api, task_id: int, who: str):
    return api.client.delete(f"/api/v1/tasks/{task_id}", headers=api.as_(who))


def test_a_members_delete_is_audited_with_who_when_and_the_identity(api: Api):
    task = api.create(external_id="jira:DEL-1").json()
    before = utcnow()

    assert _delete(api, task["id"], "acme-member").status_code == 204

    assert api.store.scalar(AUDIT.format("external_id")) == ("acme-member/member/ACME-1/jira:DEL-1")
    with api.store.sessions() as session:
        audit = session.scalars(select(TaskDeletion)).one()
    assert (audit.task_id, audit.workspace_id) == (task["id"], api.acme)
    assert before <= audit.deleted_at <= utcnow()
    assert api.count_tasks() == 0


def test_an_operators_delete_is_audited_as_the_operators(api: Api):
    task = api.create(external_id="jira:DEL-2").json()
    assert _delete(api, task["id"], "acme-operator").status_code == 204
    assert api.store.scalar(AUDIT.format("external_id")) == (
        "acme-operator/operator/ACME-1/jira:DEL-2"
    )


def test_a_task_without_an_external_id_is_audited_without_one(api: Api):
    task = api.create().json()
    assert _delete(api, task["id"], "acme-member").status_code == 204
    assert api.store.scalar("SELECT count(*) FROM task_deletions WHERE external_id IS NULL") == 1


def test_a_refused_or_hidden_delete_writes_no_audit(api: Api):
    task = api.create(external_id="jira:DEL-3").json()
    assert _delete(api, task["id"], "globex-operator").status_code == 404
    assert _delete(api, 999_999, "acme-member").status_code == 404
    assert api.store.scalar("SELECT count(*) FROM task_deletions") == 0
    assert api.count_tasks() == 1


def test_a_workspace_reserving_deletes_answers_a_member_403_and_changes_nothing(api: Api):
    task = api.create(external_id="jira:DEL-4").json()
    events = api.store.scalar("SELECT count(*) FROM task_events")
    _reserve(api)

    refused = _delete(api, task["id"], "acme-member")

    assert refused.status_code == 403
    assert refused.json() == {
        "error": "workspace acme reserves deleting tasks to operators: "
        "ask one, or archive the task instead"
    }
    assert api.store.scalar("SELECT count(*) FROM task_deletions") == 0
    assert api.store.scalar("SELECT count(*) FROM task_events") == events
    assert api.store.scalar("SELECT count(*) FROM identities") == 0
    # The identity is still held: a retried create finds the same task.
    again = api.create(external_id="jira:DEL-4").json()
    assert (again["id"], again["deduplicated"]) == (task["id"], True)


def test_with_deletes_reserved_an_operator_still_deletes_and_the_identity_is_free(api: Api):
    task = api.create(external_id="jira:DEL-5").json()
    _reserve(api)

    assert _delete(api, task["id"], "acme-operator").status_code == 204

    assert api.store.scalar(AUDIT.format("external_id")) == (
        "acme-operator/operator/ACME-1/jira:DEL-5"
    )
    again = api.create(external_id="jira:DEL-5").json()
    assert again["deduplicated"] is False and again["id"] != task["id"]


def test_a_workspace_reserving_deletes_still_hides_from_other_tenants(api: Api):
    # Access before role: a member of another workspace learns nothing.
    task = api.create(external_id="jira:DEL-6").json()
    _reserve(api)
    answer = _delete(api, task["id"], "globex-member")
    assert (answer.status_code, answer.json()) == (404, {"error": "task not found"})


def test_lifting_the_reservation_lets_members_delete_again(api: Api):
    task = api.create(external_id="jira:DEL-7").json()
    _reserve(api)
    assert _delete(api, task["id"], "acme-member").status_code == 403
    _reserve(api, to_operators=False)
    assert _delete(api, task["id"], "acme-member").status_code == 204
    assert api.store.scalar("SELECT role FROM task_deletions") == "member"
