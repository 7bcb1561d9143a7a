"""Task events: appended with the change they report, never for a create that
did not happen, and resumable without gaps or repeats. SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError

from ingest.app import create_app
from models.db import make_engine, make_session_factory, session_scope
from models.events import events_after
from models.settings import Settings
from models.tasks import (
    CreateHooks,
    NewTask,
    archive_task,
    create_task,
    delete_task,
    release_external_id,
)
from models.tokens import issue_token
from tests.support.feeds import make_feed, store_fixture
from tests.support.stores import TRUSTED, Store
from worker.processing import process_delivery


def create(store: Store, workspace_id: int, external_id: str | None, **hooks):
    with store.sessions() as session:
        return create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=workspace_id,
            new=NewTask(title="t", external_id=external_id),
            hooks=CreateHooks(**hooks),
        )


def stream(store: Store, workspace_id: int, after: int = 0) -> list[tuple[int, str, int, str]]:
    with store.sessions() as session:
        return [
            (e.position, e.type, e.task_id, e.external_id)
            for e in events_after(session=session, workspace_id=workspace_id, after=after)
        ]


def test_a_create_appends_task_created_with_its_external_id_and_a_found_appends_nothing(
    store: Store,
):
    workspace = store.workspace()
    task = create(store, workspace.id, "jira:PROJ-1").task
    create(store, workspace.id, "jira:PROJ-1")  # found settled
    with store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE tasks SET external_id_settled_at = NULL")
    create(store, workspace.id, "jira:PROJ-1")  # found unsettled

    assert stream(store, workspace.id) == [(1, "task.created", task.id, "jira:PROJ-1")]


def test_events_belong_to_their_workspaces_stream_and_go_with_the_workspace(store: Store):
    workspace, other = store.workspace(), store.workspace("other", "OTH")
    create(store, workspace.id, "jira:PROJ-1")
    create(store, other.id, "jira:PROJ-1")
    with store.engine.begin() as connection:
        # No event outside a stream.
        with pytest.raises(IntegrityError), connection.begin_nested():
            connection.exec_driver_sql(
                "INSERT INTO task_events (workspace_id, position, type, task_id, occurred_at)"
                " VALUES (999, 1, 'task.created', 1, CURRENT_TIMESTAMP)"
            )
        connection.exec_driver_sql(f"DELETE FROM workspaces WHERE id = {workspace.id}")

    assert store.scalar("SELECT count(*) FROM event_streams") == 1
    assert stream(store, workspace.id) == []
    assert [event[1] for event in stream(store, other.id)] == ["task.created"]


def test_archive_delete_and_release_append_their_events(store: Store):
    workspace = store.workspace()
    first = create(store, workspace.id, "jira:PROJ-1").task
    second = create(store, workspace.id, None).task
    with session_scope(store.sessions) as session:
        archive_task(session=session, caller=TRUSTED, task_id=first.id)
        archive_task(session=session, caller=TRUSTED, task_id=first.id)  # already: no event
    with session_scope(store.sessions) as session:
        release_external_id(
            session=session,
            workspace_id=workspace.id,
            external_id="jira:PROJ-1",
            operator="ops",
            reason="recreated",
        )
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=second.id)

    assert stream(store, workspace.id) == [
        (1, "task.created", first.id, "jira:PROJ-1"),
        (2, "task.created", second.id, None),
        (3, "task.archived", first.id, "jira:PROJ-1"),
        (4, "task.identity_released", first.id, "jira:PROJ-1"),
        (5, "task.deleted", second.id, None),
    ]
    assert stream(store, workspace.id, after=3) == stream(store, workspace.id)[3:]


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path-on", "fast-path-off"])
def test_a_delivery_redelivered_five_times_yields_exactly_one_created_event(
    store: Store, fast_path: bool
):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    settings = Settings(database_url=store.url, worker_fast_path=fast_path)
    paths = set()
    for _ in range(5):
        with store.engine.begin() as connection:  # hand the same row over again
            connection.exec_driver_sql("UPDATE deliveries SET status = 'queued'")
        with session_scope(store.sessions) as session:
            paths.add(process_delivery(session=session, delivery_pk=pk, settings=settings).path)

    events = stream(store, feed.workspace_id)
    assert [(kind, external_id) for _, kind, _, external_id in events] == [
        ("task.created", "jira:TES-41")
    ]
    assert ("fast" in paths) == fast_path  # the first run's create; the others find it


def test_concurrent_appends_number_a_workspace_gaplessly(store: Store):
    workspace = store.workspace()
    engine = make_engine(store.url, pool_size=8, max_overflow=0)
    sessions = make_session_factory(engine)
    start = threading.Barrier(8)

    def one(n: int) -> None:
        start.wait()
        with sessions() as session:
            create_task(
                session=session,
                caller=TRUSTED,
                workspace_id=workspace.id,
                new=NewTask(title="t", external_id=f"jira:PROJ-{n}"),
            )

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(8)))
    finally:
        engine.dispose()
    assert [position for position, *_ in stream(store, workspace.id)] == list(range(1, 9))


# --- through HTTP --------------------------------------------------------------------------


@pytest.fixture
def client(store: Store) -> Iterator[tuple[TestClient, dict, int]]:
    acme, globex = store.workspace("acme", "ACME"), store.workspace("globex", "GLX")
    with session_scope(store.sessions) as session:
        token = issue_token(
            session=session, name="reader", role="member", workspace_ids=[acme.id]
        ).token
    create(store, acme.id, "jira:PROJ-1")
    create(store, acme.id, "jira:PROJ-2")
    create(store, globex.id, "jira:PROJ-9")
    app = create_app(Settings(database_url=store.url), publish=lambda keys, lane: None)
    with TestClient(app) as test_client:
        yield test_client, {"Authorization": f"Bearer {token}"}, acme.id


def sse_events(text: str) -> list[dict]:
    """The data of every event in an SSE body."""
    found = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in fields:
            assert fields["id"] == str(json.loads(fields["data"])["id"])
            found.append(json.loads(fields["data"]))
    return found


def test_the_json_page_form_pages_by_after(client):
    test_client, headers, acme = client
    url = f"/api/v1/workspaces/{acme}/events"
    page = test_client.get(url, params={"limit": 1}, headers=headers).json()
    assert [(e["id"], e["type"], e["external_id"]) for e in page["events"]] == [
        (1, "task.created", "jira:PROJ-1")
    ]
    rest = test_client.get(url, params={"after": page["next_after"]}, headers=headers).json()
    assert [e["external_id"] for e in rest["events"]] == ["jira:PROJ-2"]


def test_sse_resumes_after_last_event_id_missing_nothing_and_repeating_nothing(client, store):
    test_client, headers, acme = client
    url = f"/api/v1/workspaces/{acme}/events"
    sse = headers | {"Accept": "text/event-stream"}

    first = test_client.get(url, params={"timeout": 0.2}, headers=sse)
    assert first.headers["content-type"].startswith("text/event-stream")
    seen = sse_events(first.text)
    assert [e["id"] for e in seen] == [1, 2]

    create(store, acme, "jira:PROJ-3")
    create(store, acme, "jira:PROJ-4")
    again = test_client.get(
        url, params={"timeout": 0.2}, headers=sse | {"Last-Event-ID": str(seen[-1]["id"])}
    )
    resumed = sse_events(again.text)
    assert [e["external_id"] for e in resumed] == ["jira:PROJ-3", "jira:PROJ-4"]
    assert [e["id"] for e in seen + resumed] == [1, 2, 3, 4]


def test_events_are_scoped_to_the_token_and_validated(client):
    test_client, headers, acme = client
    other = test_client.get(f"/api/v1/workspaces/{acme + 1}/events", headers=headers)
    assert (other.status_code, other.json()) == (404, {"error": "task not found"})
    assert test_client.get(f"/api/v1/workspaces/{acme}/events").status_code == 401
    bad = test_client.get(
        f"/api/v1/workspaces/{acme}/events", headers=headers | {"Last-Event-ID": "nope"}
    )
    assert bad.status_code == 400


# --- every task that was inserted has its task.created first (docs/contract.md, "Task events")


class Died(BaseException):
    """The create's process died after its insert: nothing after it ran."""


def die(_task) -> None:
    raise Died()


def inserted_unsettled(store: Store, workspace_id: int, external_id: str) -> int:
    with pytest.raises(Died):
        create(store, workspace_id, external_id, after_insert=die)
    return store.scalar("SELECT id FROM tasks WHERE external_id = :e", e=external_id)


def test_a_task_deleted_before_its_create_settled_gets_task_created_then_task_deleted(
    store: Store,
):
    workspace = store.workspace()
    task_id = inserted_unsettled(store, workspace.id, "jira:PROJ-1")
    assert stream(store, workspace.id) == []  # a create that has not settled says nothing yet

    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=task_id)

    assert stream(store, workspace.id) == [
        (1, "task.created", task_id, "jira:PROJ-1"),
        (2, "task.deleted", task_id, "jira:PROJ-1"),
    ]


def test_a_create_whose_identity_was_released_before_it_settled_has_task_created_first(
    store: Store,
):
    workspace = store.workspace()

    def released_meanwhile(task) -> None:
        with session_scope(store.sessions) as session:
            release_external_id(
                session=session,
                workspace_id=workspace.id,
                external_id="jira:PROJ-1",
                operator="ops",
                reason="abandoned",
            )

    result = create(store, workspace.id, "jira:PROJ-1", after_insert=released_meanwhile)

    assert result.outcome.value == "created_identity_lost"
    assert stream(store, workspace.id) == [
        (1, "task.created", result.task.id, "jira:PROJ-1"),
        (2, "task.identity_released", result.task.id, "jira:PROJ-1"),
    ]


def test_a_settled_task_deleted_or_released_has_one_task_created(store: Store):
    workspace = store.workspace()
    deleted = create(store, workspace.id, "jira:PROJ-1").task
    released = create(store, workspace.id, "jira:PROJ-2").task
    plain = create(store, workspace.id, None).task
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=deleted.id)
        delete_task(session=session, caller=TRUSTED, task_id=plain.id)
        release_external_id(
            session=session,
            workspace_id=workspace.id,
            external_id="jira:PROJ-2",
            operator="ops",
            reason="abandoned",
        )
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=released.id)

    assert [(kind, task) for _, kind, task, _ in stream(store, workspace.id)] == [
        ("task.created", deleted.id),
        ("task.created", released.id),
        ("task.created", plain.id),
        ("task.deleted", deleted.id),
        ("task.deleted", plain.id),
        ("task.identity_released", released.id),
        ("task.deleted", released.id),
    ]
