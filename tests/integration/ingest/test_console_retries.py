"""A key per console form (docs/contract.md §16), on SQLite and PostgreSQL:
each rendered form carries a key of its own, and a form sent twice -- a
double click, a browser resending after a lost answer -- acts once and shows
the first notice; the same key with another request is refused."""

from __future__ import annotations

import re

from tests.support.console import Console

RELEASED = "SELECT count(*) FROM task_events WHERE type = 'task.identity_released'"


def _task(console: Console, external_id: str) -> dict:
    created = console.client.post(
        "/api/v1/tasks",
        json={"workspace_id": console.acme, "title": "Held", "external_id": external_id},
        headers={"Authorization": f"Bearer {console.tokens['acme-operator']}"},
    )
    assert created.status_code == 200, created.text
    return created.json()


def _form_key(page: str, form_id: str, marker: str = "id") -> str:
    form = page[page.index(f'{marker}="{form_id}"') :]
    return re.search(r'name="idempotency_key" value="([0-9a-f]{32})"', form).group(1)


def _notice(page: str) -> str:
    return re.search(r'class="notice"[^>]*>(.*?)<', page, re.S).group(1).strip()


def test_every_rendered_form_carries_a_key_of_its_own(console: Console) -> None:
    _task(console, "jira:K-1")
    console.sign_in("acme-operator")
    pages = [
        console.client.get("/console/tasks?workspace=acme&external_id=jira:K-1").text
        for _ in range(2)
    ]
    keys = [_form_key(page, "release") for page in pages] + [_form_key(pages[0], "merge")]
    assert len(set(keys)) == 3


def test_a_release_form_sent_twice_releases_once(console: Console) -> None:
    held = _task(console, "jira:K-2")
    csrf = console.sign_in("acme-operator")
    page = console.client.get("/console/tasks?workspace=acme&external_id=jira:K-2").text
    form = {
        "workspace": "acme",
        "external_id": "jira:K-2",
        "reason": "abandoned",
        "expected_holder": held["identifier"],
        "confirm": "jira:K-2",
        "idempotency_key": _form_key(page, "release"),
    }
    first = console.post("/console/tasks/release", csrf, **form)
    again = console.post("/console/tasks/release", csrf, **form)
    assert (first.status_code, again.status_code) == (200, 200), again.text
    assert _notice(first.text) == _notice(again.text)
    assert _notice(again.text).startswith("Released jira:K-2")
    assert console.store.scalar("SELECT count(*) FROM identity_releases") == 1
    assert console.store.scalar(RELEASED) == 1
    other = console.post("/console/tasks/release", csrf, **(form | {"reason": "other"}))
    assert other.status_code == 409 and "first sent with a different request" in other.text


def test_a_merge_form_sent_twice_merges_once(console: Console) -> None:
    into, from_ = _task(console, "jira:K-3"), _task(console, "jira:K-4")
    csrf = console.sign_in("acme-operator")
    page = console.client.get("/console/tasks?workspace=acme&external_id=jira:K-3").text
    form = {
        "workspace": "acme",
        "external_id": "jira:K-3",
        "into": str(into["id"]),
        "from": from_["identifier"],
        "confirm": from_["identifier"],
        "reason": "one item",
        "idempotency_key": _form_key(page, "merge"),
    }
    first = console.post("/console/tasks/merge", csrf, **form)
    again = console.post("/console/tasks/merge", csrf, **form)
    assert (first.status_code, again.status_code) == (200, 200), again.text
    assert _notice(first.text) == _notice(again.text)
    assert console.store.scalar("SELECT count(*) FROM identity_merges") == 1


def test_a_replay_through_a_workspace_no_longer_seen_answers_as_a_fresh_send(
    console: Console,
) -> None:
    held = _task(console, "jira:K-5")
    csrf = console.sign_in("acme-operator")
    form = {
        "workspace": "acme",
        "external_id": "jira:K-5",
        "reason": "abandoned",
        "expected_holder": held["identifier"],
        "confirm": "jira:K-5",
        "idempotency_key": "k-console-5",
    }
    assert console.post("/console/tasks/release", csrf, **form).status_code == 200
    with console.store.engine.begin() as connection:
        connection.exec_driver_sql(
            "UPDATE api_token_workspaces SET workspace_id = "
            f"{console.globex} WHERE token_id = (SELECT id FROM api_tokens "
            "WHERE name = 'acme-operator')"
        )
    replay = console.post("/console/tasks/release", csrf, **form)
    fresh = console.post("/console/tasks/release", csrf, **(form | {"idempotency_key": ""}))
    assert replay.status_code == fresh.status_code == 404
    assert "Released" not in replay.text


def test_a_replay_form_sent_twice_replays_once(console: Console) -> None:
    delivery = console.deliver()
    console.kill(delivery)
    csrf = console.sign_in("acme-operator")
    page = console.client.get(f"/console/deliveries/{delivery}").text
    key = _form_key(page, "replay")
    path = f"/console/deliveries/{delivery}/replay"
    first = console.post(path, csrf, idempotency_key=key)
    again = console.post(path, csrf, idempotency_key=key)
    assert (first.status_code, again.status_code) == (303, 303)
    assert first.headers["location"] == again.headers["location"]
    # Without the key, the same form is a second replay, refused: it is queued already.
    assert console.post(path, csrf).status_code == 409
    assert console.status_of(delivery) == "queued"


def test_a_rotate_form_sent_twice_adds_one_secret_and_never_shows_it_again(
    console: Console,
) -> None:
    csrf = console.sign_in("acme-operator")
    key = _form_key(console.client.get("/console/sources").text, "rotate", "class")
    secrets_before = console.store.scalar("SELECT count(*) FROM source_secrets")
    path = "/console/sources/acme-github/rotate-secret"
    first = console.post(path, csrf, idempotency_key=key)
    again = console.post(path, csrf, idempotency_key=key)
    secret = re.search(r'id="new-secret">([^<]+)<', first.text).group(1)
    assert again.status_code == 409 and secret not in again.text
    assert "secret already and showed it then" in again.text
    assert console.store.scalar("SELECT count(*) FROM source_secrets") == secrets_before + 1


def test_a_bulk_replay_form_sent_twice_starts_one_run(console: Console) -> None:
    deliveries = [console.deliver(number=n) for n in range(1, 3)]
    console.kill(*deliveries)
    csrf = console.sign_in("acme-operator")
    dry = console.post("/console/replays/dry-run", csrf, status="dead")
    form = {"status": "dead", "expected": "2", "name": "after the outage"}
    form["idempotency_key"] = _form_key(dry.text, "run-replay")

    first = console.post("/console/replays", csrf, **form)
    console.kill(*deliveries)  # dead again: a second run would queue them again
    again = console.post("/console/replays", csrf, **form)
    other = console.post("/console/replays", csrf, **(form | {"name": "another run"}))

    assert (first.status_code, again.status_code) == (303, 303)
    assert console.store.scalar("SELECT count(*) FROM operations WHERE kind = 'bulk-replay'") == 1
    assert [console.status_of(d) for d in deliveries] == ["dead", "dead"]  # not queued again
    assert other.status_code == 409 and "first sent with a different request" in other.text


def test_a_finish_rotation_form_sent_twice_retires_once(console: Console) -> None:
    csrf = console.sign_in("acme-operator")
    console.post("/console/sources/acme-github/rotate-secret", csrf)
    page = console.client.get("/console/sources").text
    key = _form_key(page, "finish-rotation", "class")
    path = "/console/sources/acme-github/finish-rotation"
    first = console.post(path, csrf, confirm="acme-github", idempotency_key=key)
    retired = console.store.scalar(
        "SELECT count(*) FROM source_secrets WHERE retired_at IS NOT NULL"
    )
    # A rotation begun since: the form sent again must not finish it too.
    console.post("/console/sources/acme-github/rotate-secret", csrf)
    again = console.post(path, csrf, confirm="acme-github", idempotency_key=key)

    assert (first.status_code, again.status_code) == (303, 303)
    assert first.headers["location"] == again.headers["location"]
    assert retired == 1
    assert (
        console.store.scalar("SELECT count(*) FROM source_secrets WHERE retired_at IS NOT NULL")
        == 1
    )


def test_a_revoke_form_sent_twice_revokes_once_and_never_past_the_callers_scope(
    console: Console,
) -> None:
    csrf = console.sign_in("acme-operator")
    member = console.store.scalar("SELECT id FROM api_tokens WHERE name = 'acme-member'")
    key = _form_key(console.client.get("/console/tokens").text, "revoke", "class")
    path = f"/console/tokens/{member}/revoke"

    first = console.post(path, csrf, confirm="acme-member", idempotency_key=key)
    again = console.post(path, csrf, confirm="acme-member", idempotency_key=key)
    other = console.post(path, csrf, confirm="acme-memberx", idempotency_key=key)
    with console.store.engine.begin() as connection:
        connection.exec_driver_sql(
            f"UPDATE api_token_workspaces SET workspace_id = {console.globex} "
            f"WHERE token_id = {member}"
        )
    out_of_scope = console.post(path, csrf, confirm="acme-member", idempotency_key=key)

    assert (first.status_code, again.status_code) == (303, 303)
    assert again.headers["location"] == "/console/tokens?done=revoked"
    assert other.status_code == 409
    assert out_of_scope.status_code == 404  # as a fresh revoke of another workspace's token
    assert console.store.scalar("SELECT count(*) FROM api_tokens WHERE revoked_at IS NOT NULL") == 1


def test_an_undo_form_sent_twice_undoes_once(console: Console) -> None:
    into, from_ = _task(console, "jira:K-6"), _task(console, "jira:K-7")
    csrf = console.sign_in("acme-operator")
    merged = console.post(
        "/console/tasks/merge",
        csrf,
        workspace="acme",
        external_id="jira:K-6",
        into=str(into["id"]),
        confirm=from_["identifier"],
        reason="one item",
        **{"from": from_["identifier"]},
    )
    assert merged.status_code == 200, merged.text
    page = console.client.get("/console/tasks?workspace=acme&external_id=jira:K-6").text
    merge_id = re.search(r'action="/console/merges/(\d+)/undo"', page).group(1)
    form = {
        "workspace": "acme",
        "external_id": "jira:K-6",
        "reason": "two items after all",
        "idempotency_key": _form_key(page, f"/console/merges/{merge_id}/undo", "action"),
    }
    first = console.post(f"/console/merges/{merge_id}/undo", csrf, **form)
    again = console.post(f"/console/merges/{merge_id}/undo", csrf, **form)
    fresh = console.post(
        f"/console/merges/{merge_id}/undo", csrf, **(form | {"idempotency_key": ""})
    )

    assert (first.status_code, again.status_code) == (200, 200), again.text
    assert _notice(first.text) == _notice(again.text)
    assert _notice(first.text).startswith("Undone")
    assert fresh.status_code == 409  # undone already: a new request is refused
    assert "was undone already" in fresh.text
