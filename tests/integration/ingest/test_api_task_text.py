"""The task store's text limits over REST: a title or description it will not
keep is a 400 naming the rule, and nothing is written (docs/contract.md,
"Validation and normalization", and "The create sequence", step 4)."""

from __future__ import annotations

import json

import pytest

from models.tasks import MAX_DESCRIPTION_LENGTH, MAX_TITLE_LENGTH
from tests.support.ingress import Api

#: Text no database stores: PostgreSQL text holds no NUL, and a lone surrogate
#: has no UTF-8 encoding. JSON can carry both as escapes.
UNSTORABLE = {"nul": "a\u0000b", "lone-surrogate": "a\ud800b"}


def post_raw(api: Api, body: dict, path: str = "/api/v1/tasks", method: str = "POST"):
    """Send ``body`` as JSON with ASCII escapes: httpx's own encoding cannot
    carry a lone surrogate, a JSON escape can."""
    return api.client.request(
        method,
        path,
        content=json.dumps(body).encode(),
        headers={**api.as_("acme-member"), "Content-Type": "application/json"},
    )


def assert_nothing_written(api: Api) -> None:
    assert api.count_tasks() == 0
    assert api.store.scalar("SELECT task_sequence FROM workspaces WHERE id = :w", w=api.acme) == 0


def test_a_title_over_the_limit_is_400_naming_the_limit_and_its_length(api: Api):
    response = api.create(title="x" * (MAX_TITLE_LENGTH + 1), external_id="jira:PROJ-1")

    assert response.status_code == 400
    assert response.json() == {
        "error": f"title must be at most {MAX_TITLE_LENGTH} characters (got {MAX_TITLE_LENGTH + 1})"
    }
    assert_nothing_written(api)


def test_a_description_over_the_limit_is_400_naming_the_limit_and_its_length(api: Api):
    too_long = MAX_DESCRIPTION_LENGTH + 1
    response = api.create(description="d" * too_long, external_id="jira:PROJ-1")

    assert response.status_code == 400
    assert response.json() == {
        "error": f"description must be at most {MAX_DESCRIPTION_LENGTH} characters (got {too_long})"
    }
    assert_nothing_written(api)


def test_a_title_and_a_description_of_exactly_the_limits_are_kept_whole(api: Api):
    title, description = "t" * MAX_TITLE_LENGTH, "d" * MAX_DESCRIPTION_LENGTH

    response = api.create(title=title, description=description, external_id="jira:PROJ-1")

    assert response.status_code == 200
    assert (response.json()["title"], response.json()["description"]) == (title, description)


@pytest.mark.parametrize("field", ["title", "description"])
@pytest.mark.parametrize("text", UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_text_no_database_stores_is_400_naming_the_field_and_position(
    api: Api, field: str, text: str
):
    body = {"workspace_id": api.acme, "title": "Fix the login page", field: text}

    response = post_raw(api, body)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error.startswith(f"{field} holds text no database stores"), error
    assert "at position 1" in error
    assert_nothing_written(api)


@pytest.mark.parametrize("field", ["title", "description"])
@pytest.mark.parametrize("text", UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_an_edit_with_text_no_database_stores_is_400_and_changes_nothing(
    api: Api, field: str, text: str
):
    task = api.create(description="as it was").json()

    response = post_raw(api, {field: text}, path=f"/api/v1/tasks/{task['id']}", method="PATCH")

    assert response.status_code == 400
    assert response.json()["error"].startswith(f"{field} holds text no database stores")
    stored = api.client.get(f"/api/v1/tasks/{task['id']}", headers=api.as_("acme-member")).json()
    assert (stored["title"], stored["description"]) == ("Fix the login page", "as it was")


def test_an_edit_with_a_description_over_the_limit_is_400(api: Api):
    task = api.create().json()

    response = api.client.patch(
        f"/api/v1/tasks/{task['id']}",
        json={"description": "d" * (MAX_DESCRIPTION_LENGTH + 1)},
        headers=api.as_("acme-member"),
    )

    assert response.status_code == 400
    assert "at most" in response.json()["error"]
