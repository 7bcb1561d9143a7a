"""Live event streams on a real server: woken by PostgreSQL's LISTEN/NOTIFY,
falling back to polling while the listener is down, and polling on SQLite.

The app runs in uvicorn in a thread of the test (so the test can look at its
listener); the streams are read over real HTTP. Where a test must tell a
notification from a poll, it sets the poll interval far past its deadline.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager, suppress
from dataclasses import dataclass

import httpx
import psycopg
import pytest
import uvicorn
from fastapi import FastAPI

from ingest import notifications
from ingest.app import create_app
from models.db import session_scope
from models.events import EVENTS_CHANNEL, EventType, append_event
from models.settings import Settings
from models.tables import Task
from models.tasks import NewTask, create_task
from models.tokens import issue_token
from tests.support.stores import TRUSTED, Store, libpq

#: Far longer than any wait below: a stream that waited for its poll would miss them.
NEVER = 60.0


@dataclass
class Server:
    app: FastAPI
    url: str
    headers: dict[str, str]
    workspace: int

    @property
    def listener(self) -> notifications.EventListener | None:
        return self.app.state.runtime.listener


def _free_port() -> int:
    with closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def serving(store: Store, **settings: object) -> Iterator[Server]:
    """The ingress on ``store`` in uvicorn, with a token for a fresh workspace."""
    workspace = store.workspace()
    with session_scope(store.sessions) as session:
        token = issue_token(
            session=session, name="reader", role="member", workspace_ids=[workspace.id]
        ).token
    app = create_app(Settings(database_url=store.url, **settings), publish=lambda keys, lane: None)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield Server(
            app, f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}, workspace.id
        )
    finally:
        server.should_exit = True
        thread.join(30)


class Stream:
    """An SSE stream read in a thread of its own; its events land in a queue."""

    def __init__(self, server: Server, after: int = 0) -> None:
        self.events: queue.Queue[dict] = queue.Queue()
        self.opened = threading.Event()
        self._response: httpx.Response | None = None
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=NEVER * 2))
        self._thread = threading.Thread(target=self._read, args=(server, after), daemon=True)
        self._thread.start()
        assert self.opened.wait(10), "the stream did not open"

    def _read(self, server: Server, after: int) -> None:
        headers = server.headers | {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
        url = f"{server.url}/api/v1/workspaces/{server.workspace}/events"
        try:
            with self._client.stream("GET", url, params={"timeout": 120}, headers=headers) as r:
                assert r.status_code == 200, r.read()
                self._response = r
                for line in r.iter_lines():
                    self.opened.set()
                    if line.startswith("data: "):
                        self.events.put(json.loads(line.removeprefix("data: ")))
        except httpx.HTTPError:
            pass  # closed by the test

    def next(self, within: float) -> dict:
        try:
            return self.events.get(timeout=within)
        except queue.Empty:
            raise AssertionError(f"no event within {within} s") from None

    def nothing_for(self, seconds: float) -> None:
        with pytest.raises(queue.Empty):
            self.events.get(timeout=seconds)

    def close(self) -> None:
        if self._response is not None:
            # Hang up under the reading thread, which is blocked in a read.
            sock = self._response.extensions["network_stream"].get_extra_info("socket")
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        assert not self._thread.is_alive(), "the stream's reader did not stop"
        self._client.close()


@contextmanager
def streaming(server: Server, after: int = 0) -> Iterator[Stream]:
    stream = Stream(server, after)
    try:
        yield stream
    finally:
        stream.close()


def create(store: Store, workspace: int, external_id: str) -> int:
    with store.sessions() as session:
        return create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=workspace,
            new=NewTask(title="t", external_id=external_id),
        ).task.id


def wait_for(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def postgres_server(postgres_store: Store) -> Iterator[Server]:
    """On PostgreSQL, streams that would not poll in the tests' time."""
    with serving(postgres_store, stream_poll_seconds=NEVER) as server:
        wait_for(lambda: server.listener.listening, 10, "the listener")
        yield server


@pytest.mark.postgres
def test_a_committed_create_wakes_a_stream_without_waiting_for_a_poll(
    postgres_store: Store, postgres_server: Server
):
    first = create(postgres_store, postgres_server.workspace, "jira:A-1")
    with streaming(postgres_server) as stream:
        assert stream.next(within=10)["task_id"] == first  # the catch-up read
        for n in range(2, 5):
            task = create(postgres_store, postgres_server.workspace, f"jira:A-{n}")
            event = stream.next(within=5)
            assert (event["id"], event["type"], event["task_id"]) == (n, "task.created", task)


@pytest.mark.postgres
def test_many_streams_of_one_workspace_share_one_read_per_notification(
    postgres_store: Store, postgres_server: Server, monkeypatch: pytest.MonkeyPatch
):
    reads: list[tuple[int, int]] = []
    listener = postgres_server.listener
    read = listener._read

    async def counted(workspace: int, after: int, limit: int) -> list[dict]:
        reads.append((workspace, after))
        return await read(workspace, after, limit)

    monkeypatch.setattr(listener, "_read", counted)
    with ExitStack() as stack:
        streams = [stack.enter_context(streaming(postgres_server)) for _ in range(3)]
        feed = listener.feed(postgres_server.workspace)
        wait_for(lambda: feed.head is not None, 10, "the feed to learn its position")
        task = create(postgres_store, postgres_server.workspace, "jira:B-1")
        for stream in streams:
            assert stream.next(within=5)["task_id"] == task
        # One notification, one read by the feed -- not one per stream.
        assert reads == [(postgres_server.workspace, 0)]


@pytest.mark.postgres
def test_a_rolled_back_append_notifies_nothing_and_wakes_no_stream(
    postgres_store: Store, postgres_server: Server
):
    task_id = create(postgres_store, postgres_server.workspace, "jira:C-1")
    with closing(psycopg.connect(libpq(postgres_store.url), autocommit=True)) as watcher:
        watcher.execute(f"LISTEN {EVENTS_CHANNEL}")
        with streaming(postgres_server, after=1) as stream:
            with postgres_store.sessions() as session:
                task = session.get(Task, task_id)
                append_event(session=session, type=EventType.ARCHIVED, task=task)
                session.rollback()
            assert list(watcher.notifies(timeout=1.0)) == []
            stream.nothing_for(0.5)
            # The next committed one arrives, at the position the rollback did not take.
            second = create(postgres_store, postgres_server.workspace, "jira:C-2")
            event = stream.next(within=5)
            assert (event["id"], event["task_id"]) == (2, second)
            assert [n.payload for n in watcher.notifies(timeout=1.0)] == [
                str(postgres_server.workspace)
            ]


@pytest.mark.postgres
def test_a_killed_listener_leaves_streams_polling_until_it_reconnects(
    postgres_store: Store, monkeypatch: pytest.MonkeyPatch
):
    # The first retry waits long enough to see the streams poll meanwhile.
    monkeypatch.setattr(notifications, "FIRST_RETRY_SECONDS", 3.0)
    with (
        serving(postgres_store, stream_poll_seconds=0.2) as server,
        streaming(server) as stream,
    ):
        wait_for(lambda: server.listener.listening, 10, "the listener")
        with closing(psycopg.connect(libpq(postgres_store.url), autocommit=True)) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND datname = current_database()",
                (notifications.LISTENER_APPLICATION_NAME,),
            ).fetchall()
        assert killed == [(True,)]
        wait_for(lambda: not server.listener.listening, 10, "the listener to notice")
        task = create(postgres_store, server.workspace, "jira:D-1")
        assert stream.next(within=5)["task_id"] == task  # by polling
        assert server.listener.connects == 1  # still down when it arrived
        wait_for(lambda: server.listener.listening, 30, "the listener to reconnect")
        assert server.listener.connects == 2
        feed = server.listener.feed(server.workspace)
        wait_for(lambda: feed.head == 1, 10, "the feed to read what it missed")
        task = create(postgres_store, server.workspace, "jira:D-2")
        event = stream.next(within=5)
        assert (event["id"], event["task_id"]) == (2, task)
        # Read by the feed, woken by the listener's notification (streams
        # polling on their own never feed it).
        wait_for(lambda: feed.head == 2, 5, "the listener to deliver the notification")


@pytest.mark.postgres
def test_with_the_listener_turned_off_streams_poll_on_postgresql(postgres_store: Store):
    with serving(postgres_store, stream_listener=False) as server, streaming(server) as stream:
        assert server.listener is None
        task = create(postgres_store, server.workspace, "jira:F-1")
        assert stream.next(within=5)["task_id"] == task


def test_on_sqlite_a_stream_polls_and_still_delivers(tmp_path, request: pytest.FixtureRequest):
    from tests.support.stores import open_store

    stores = open_store(request, tmp_path, "sqlite")
    store = next(stores)
    try:
        with serving(store) as server:
            assert server.listener is None
            with streaming(server) as stream:
                task = create(store, server.workspace, "jira:E-1")
                assert stream.next(within=5)["task_id"] == task
                task = create(store, server.workspace, "jira:E-2")
                assert stream.next(within=5)["task_id"] == task
    finally:
        stores.close()


def test_a_burst_arrives_on_every_stream_in_order_without_gaps_and_resumes_after_it(
    store: Store,
):
    """However a burst's events are batched into writes -- streams woken late
    in a feed's fan-out send several notifications' events at once -- each
    stream sees each event once, in order, and resumes right after its last."""
    burst = 25
    with serving(store, stream_poll_seconds=0.2) as server, ExitStack() as stack:
        if store.dialect == "postgresql":
            wait_for(lambda: server.listener.listening, 10, "the listener")
        streams = [stack.enter_context(streaming(server)) for _ in range(3)]
        tasks = [create(store, server.workspace, f"jira:G-{n}") for n in range(1, burst + 1)]
        for stream in streams:
            events = [stream.next(within=10) for _ in tasks]
            assert [(event["id"], event["task_id"]) for event in events] == list(
                zip(range(1, burst + 1), tasks, strict=True)
            )
            stream.nothing_for(0.3)
        with streaming(server, after=burst - 5) as resumed:
            assert [resumed.next(within=10)["id"] for _ in range(5)] == list(
                range(burst - 4, burst + 1)
            )
            resumed.nothing_for(0.3)
