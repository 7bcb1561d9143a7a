"""The REST surface's one mapping of domain errors (``ingest.rest.domain_error_response``):
every error, raised from the task store under any route, answers by its kind,
and only a hidden workspace takes the route's own words."""

from __future__ import annotations

import pytest

import ingest.api
from models.errors import ErrorKind, TaskNotFound, TaskStoreError, WorkspaceNotAccessible
from tests.support.domain_errors import SAMPLES
from tests.support.ingress import Api

STATUS = {
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.INVALID: 400,
    ErrorKind.CONFLICT: 409,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.MISCONFIGURED: 503,
    ErrorKind.STALE: 412,
}


def _raising(error: TaskStoreError):
    def store_call(**_arguments):
        raise error

    return store_call


@pytest.mark.parametrize("error", SAMPLES.values(), ids=lambda error: type(error).__name__)
def test_every_domain_error_answers_by_its_kind(api: Api, monkeypatch, error):
    monkeypatch.setattr(ingest.api, "get_task", _raising(error))
    response = api.client.get("/api/v1/tasks/1", headers=api.as_("acme-member"))
    assert response.status_code == STATUS[error.kind]
    if error.kind is ErrorKind.MISCONFIGURED:
        # Not the caller's to fix: the answer of any failure of the service.
        assert response.json() == {"error": "temporarily unavailable; retry later"}
        assert response.headers["Retry-After"] == str(
            api.client.app.state.runtime.settings.retry_after_seconds
        )
    elif isinstance(error, WorkspaceNotAccessible):
        assert response.json() == {"error": "task not found"}
    else:
        assert response.json() == {"error": str(error)}


def test_a_hidden_workspace_takes_the_routes_own_words(api: Api, monkeypatch):
    # From the store, after the route's own access check let it through.
    monkeypatch.setattr(ingest.api, "create_task", _raising(WorkspaceNotAccessible(api.acme)))
    monkeypatch.setattr(ingest.api, "list_tasks", _raising(WorkspaceNotAccessible(api.acme)))
    created = api.create(external_id="jira:PROJ-1")
    listed = api.client.get(f"/api/v1/workspaces/{api.acme}/tasks", headers=api.as_("acme-member"))
    assert (created.status_code, created.json()) == (404, {"error": "task not created"})
    assert (listed.status_code, listed.json()) == (404, {"error": "task not found"})


def test_a_task_deleted_during_its_create_is_not_found_not_not_created(api: Api, monkeypatch):
    monkeypatch.setattr(ingest.api, "create_task", _raising(TaskNotFound()))
    response = api.create(external_id="jira:PROJ-1")
    assert (response.status_code, response.json()) == (404, {"error": "task not found"})
