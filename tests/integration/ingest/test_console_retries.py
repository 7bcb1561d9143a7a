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
