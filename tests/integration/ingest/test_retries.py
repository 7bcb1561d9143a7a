"""Retries of REST's release, archive and delete, on SQLite and PostgreSQL
(docs/contract.md, "Retries of everything that is not a create"): each
takes an ``Idempotency-Key`` and a guard; a retry gets the first answer and
changes nothing twice, another request under the key is 409, a stale guard
changes nothing, a lost answer is replayed with its event on the stream once,
and a replay answers as a fresh request where the caller's view changed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from ingest.app import create_app
from models.db import session_scope
from models.settings import Settings
from models.tokens import issue_token
from tests.support.ingress import Api

KEY = {"Idempotency-Key": "7f0c1f3e-retry-1"}


def _events(api: Api, type: str) -> int:
    return api.store.scalar("SELECT count(*) FROM task_events WHERE type = :type", type=type)


def _stream(api: Api, who: str = "acme-operator") -> list[dict]:
    response = api.client.get(
        f"/api/v1/workspaces/{api.acme}/events", params={"after": 0}, headers=api.as_(who)
    )
    assert response.status_code == 200, response.text
    return response.json()["events"]


def _release(api: Api, client=None, who="acme-operator", headers=KEY, **params):
    params = {"external_id": "jira:R-1", "reason": "abandoned"} | params
    return (client or api.client).delete(
        f"/api/v1/workspaces/{params.pop('workspace', api.acme)}/tasks/by-external-id",
        params=params,
        headers=api.as_(who) | headers,
    )


def _archive(api: Api, task_id: int, client=None, who="acme-member", headers=KEY):
    return (client or api.client).post(
        f"/api/v1/tasks/{task_id}/archive", headers=api.as_(who) | headers
    )


def _delete(api: Api, task_id: int, client=None, who="acme-member", headers=KEY):
    return (client or api.client).delete(f"/api/v1/tasks/{task_id}", headers=api.as_(who) | headers)


def _revision(api: Api, task_id: int, who="acme-member") -> str:
    return api.client.get(f"/api/v1/tasks/{task_id}", headers=api.as_(who)).headers["ETag"]


@dataclass(frozen=True)
class Mutation:
    """One change under test: how to send it (fresh or again), and the event it appends."""

    name: str
    event: str
    send: Callable[..., object]  # (api, task_id, **overrides) -> response


def _send_release(api: Api, task_id: int, **overrides):
    return _release(api, expected_task_id=task_id, **overrides)


def _send_archive(api: Api, task_id: int, **overrides):
    overrides.pop("reason", None)
    return _archive(api, overrides.pop("target", task_id), **overrides)


def _send_delete(api: Api, task_id: int, **overrides):
    overrides.pop("reason", None)
    return _delete(api, overrides.pop("target", task_id), **overrides)


MUTATIONS = [
    Mutation("release", "task.identity_released", _send_release),
    Mutation("archive", "task.archived", _send_archive),
    Mutation("delete", "task.deleted", _send_delete),
]
BY_NAME = pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda mutation: mutation.name)


def _task(api: Api, external_id: str = "jira:R-1") -> int:
    return api.create(external_id=external_id).json()["id"]


def _as_operator_for_release(mutation: Mutation) -> str:
    # A release needs an operator's token; archive and delete take a member's.
    return "acme-operator" if mutation.name == "release" else "acme-member"


@BY_NAME
def test_same_key_same_request_replays_the_first_answer_once(api: Api, mutation: Mutation):
    task_id = _task(api)
    who = _as_operator_for_release(mutation)
    first = mutation.send(api, task_id, who=who)
    again = mutation.send(api, task_id, who=who)
    assert first.status_code in (200, 204), first.text
    assert (again.status_code, again.content) == (first.status_code, first.content)
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert _events(api, mutation.event) == 1


def _other_target(api: Api) -> int:
    return _task(api, "jira:OTHER-1")


DIFFERENCES = [
    (mutation, difference)
    for mutation in MUTATIONS
    # Archive and delete take no body: their target and guard are the request.
    for difference in (["body"] if mutation.name == "release" else [])
    + ["actor", "target", "guard"]
]


def _second_operator(api: Api) -> str:
    """Another operator's token in acme: another actor that may release there."""
    with session_scope(api.store.sessions) as session:
        api.tokens["acme-operator-2"] = issue_token(
            session=session, name="acme-operator-2", role="operator", workspace_ids=[api.acme]
        ).token
    return "acme-operator-2"


@pytest.mark.parametrize(
    ("mutation", "difference"), DIFFERENCES, ids=[f"{m.name}-{d}" for m, d in DIFFERENCES]
)
def test_same_key_with_another_request_is_409_and_changes_nothing(
    api: Api, mutation: Mutation, difference: str
):
    task_id = _task(api)
    who = _as_operator_for_release(mutation)
    assert mutation.send(api, task_id, who=who).status_code in (200, 204)
    other = _other_target(api)
    releasing = mutation.name == "release"
    changed = {
        "body": {"reason": "another reason"},
        "actor": {"who": _second_operator(api) if releasing else "acme-operator"},
        "target": {"external_id": "jira:OTHER-1", "expected_task_id": other}
        if releasing
        else {"target": other},
        "guard": {"expected_task_id": other}
        if releasing
        else {"headers": KEY | {"If-Match": _revision(api, other)}},
    }[difference]
    if releasing:
        refused = _release(api, **({"who": who, "expected_task_id": task_id} | changed))
    else:
        refused = mutation.send(api, task_id, **({"who": who} | changed))
    assert refused.status_code == 409, refused.text
    assert "first sent with a different request" in refused.json()["error"]
    assert _events(api, mutation.event) == 1
    assert api.store.scalar("SELECT external_id FROM tasks WHERE id = :id", id=other) == (
        "jira:OTHER-1"
    )


@pytest.mark.parametrize("mutation", MUTATIONS[1:], ids=lambda mutation: mutation.name)
def test_a_stale_revision_is_412_and_changes_nothing(api: Api, mutation: Mutation):
    task_id = _task(api)
    seen = _revision(api, task_id)
    edited = api.client.patch(
        f"/api/v1/tasks/{task_id}", json={"title": "Renamed"}, headers=api.as_("acme-member")
    )
    assert edited.status_code == 200
    stale = mutation.send(api, task_id, headers=KEY | {"If-Match": seen})
    assert stale.status_code == 412, stale.text
    assert "changed since revision" in stale.json()["error"]
    assert _events(api, mutation.event) == 0
    # The current revision passes, under the same key (a refusal keeps no key).
    fresh = mutation.send(api, task_id, headers=KEY | {"If-Match": _revision(api, task_id)})
    assert fresh.status_code in (200, 204), fresh.text
    assert _events(api, mutation.event) == 1


def test_an_if_match_that_is_no_revision_is_400(api: Api):
    task_id = _task(api)
    answer = _archive(api, task_id, headers={"If-Match": "r1-not-quoted"})
    assert answer.status_code == 400
    assert answer.json() == {"error": "If-Match must be * or a quoted revision (as ETag gives it)"}


def test_a_stale_holder_is_409_for_a_release(api: Api):
    first = _task(api)
    assert _release(api, expected_task_id=first + 1).status_code == 409
    assert _events(api, "task.identity_released") == 0


class LosesFirstAnswer:
    """The app behind a connection that drops the first answer to a change:
    the server committed, the client saw a 502 (a proxy's answer)."""

    def __init__(self, app) -> None:
        self.app = app
        self.lost = False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] == "GET" or self.lost:
            return await self.app(scope, receive, send)
        if scope["path"] == "/api/v1/tasks" and scope["method"] == "POST":
            return await self.app(scope, receive, send)
        self.lost = True

        async def swallow(message) -> None:
            pass

        await self.app(scope, receive, swallow)
        await send({"type": "http.response.start", "status": 502, "headers": []})
        await send({"type": "http.response.body", "body": b"bad gateway"})


@BY_NAME
def test_a_lost_answer_is_replayed_and_its_event_is_on_the_stream_once(
    api: Api, mutation: Mutation
):
    task_id = _task(api)
    who = _as_operator_for_release(mutation)
    lossy = LosesFirstAnswer(
        create_app(Settings(database_url=api.store.url), publish=lambda *a: None)
    )
    with TestClient(lossy) as client:
        lost = mutation.send(api, task_id, who=who, client=client)
        assert lost.status_code == 502 and lossy.lost
        retried = mutation.send(api, task_id, who=who, client=client)
    assert retried.status_code in (200, 204), retried.text
    assert retried.headers["Idempotent-Replayed"] == "true"
    types = [event["type"] for event in _stream(api)]
    assert types.count(mutation.event) == 1


@BY_NAME
def test_two_concurrent_retries_make_one_change(api: Api, mutation: Mutation):
    task_id = _task(api)
    who = _as_operator_for_release(mutation)
    start = threading.Barrier(2, timeout=30)

    def send():
        start.wait()
        return mutation.send(api, task_id, who=who)

    with ThreadPoolExecutor(2) as pool:
        answers = [future.result(timeout=60) for future in [pool.submit(send), pool.submit(send)]]
    assert [answer.status_code for answer in answers] == [answers[0].status_code] * 2
    assert answers[0].status_code in (200, 204)
    replays = sorted("Idempotent-Replayed" in answer.headers for answer in answers)
    assert replays == [False, True]
    assert _events(api, mutation.event) == 1


def _lose_the_workspace(api: Api, who: str) -> None:
    with api.store.engine.begin() as connection:
        connection.exec_driver_sql(
            "UPDATE api_token_workspaces SET workspace_id = ? WHERE token_id = "
            "(SELECT id FROM api_tokens WHERE name = ?)"
            if api.store.dialect == "sqlite"
            else "UPDATE api_token_workspaces SET workspace_id = %s WHERE token_id = "
            "(SELECT id FROM api_tokens WHERE name = %s)",
            (api.globex, who),
        )


@BY_NAME
def test_a_replay_the_caller_may_no_longer_see_answers_as_a_fresh_request(
    api: Api, mutation: Mutation
):
    task_id = _task(api)
    who = _as_operator_for_release(mutation)
    assert mutation.send(api, task_id, who=who).status_code in (200, 204)
    _lose_the_workspace(api, who)
    replay = mutation.send(api, task_id, who=who)
    fresh = mutation.send(api, task_id, who=who, headers={})
    assert (replay.status_code, replay.json()) == (fresh.status_code, fresh.json())
    assert replay.status_code == 404
    assert "Idempotent-Replayed" not in replay.headers


def test_an_archive_replayed_after_a_delete_answers_404(api: Api):
    task_id = _task(api)
    assert _archive(api, task_id).status_code == 200
    assert _delete(api, task_id, headers={}).status_code == 204
    assert _archive(api, task_id).status_code == 404


def _expire_keys(api: Api) -> None:
    with api.store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE idempotency_keys SET expires_at = created_at")


@BY_NAME
def test_a_key_reused_after_its_window_is_a_new_request(api: Api, mutation: Mutation):
    first = _task(api)
    who = _as_operator_for_release(mutation)
    assert mutation.send(api, first, who=who).status_code in (200, 204)
    _expire_keys(api)
    # Another request under the old key: past the window, a new one, never a 500.
    second = _task(api, "jira:R-1") if mutation.name == "release" else _task(api, "jira:R-2")
    again = mutation.send(
        api, second, who=who, **({} if mutation.name == "release" else {"target": second})
    )
    assert again.status_code in (200, 204), again.text
    assert "Idempotent-Replayed" not in again.headers
    assert _events(api, mutation.event) == 2


def test_a_release_retried_after_the_identity_was_claimed_again_replays(api: Api):
    first = _task(api)
    assert _release(api, expected_task_id=first).status_code == 204
    second = _task(api)  # the freed identity, claimed by a new task
    again = _release(api, expected_task_id=first, external_id="  jira:R-1 ")
    assert again.status_code == 204 and again.headers["Idempotent-Replayed"] == "true"
    assert api.lookup("jira:R-1").json()["id"] == second


def test_a_key_no_row_can_keep_is_400(api: Api):
    task_id = _task(api)
    answer = _archive(api, task_id, headers={"Idempotency-Key": "x" * 256})
    assert answer.status_code == 400
    assert answer.json() == {"error": "Idempotency-Key must be 1 to 255 characters"}


def test_the_openapi_document_names_the_headers_and_the_refusals(api: Api):
    paths = api.client.get("/openapi.json").json()["paths"]
    for path, method, statuses in [
        ("/api/v1/tasks/{task_id}/archive", "post", {"409", "412"}),
        ("/api/v1/tasks/{task_id}", "delete", {"409", "412"}),
        ("/api/v1/workspaces/{workspace_id}/tasks/by-external-id", "delete", {"409"}),
    ]:
        operation = paths[path][method]
        headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
        assert "Idempotency-Key" in headers, path
        assert statuses <= set(operation["responses"]), path
        if statuses == {"409", "412"}:
            assert "If-Match" in headers
