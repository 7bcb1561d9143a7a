"""On SQLite the ingress stores the deliveries that arrive together in one
commit (``ingest.group_commit``), and answers each after that commit; a
group that fails is rolled back whole and each of its deliveries written
again alone, so one delivery's error is never its neighbours'."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, select
from sqlalchemy import exc as sa_exc

import ingest.runtime
from ingest.app import create_app
from ingest.group_commit import MAX_GROUP, GroupCommitInbox
from ingest.runtime import IngressRuntime, StoreUnavailable
from models.db import session_scope
from models.inbox import IncomingDelivery, Recorded
from models.sources import add_source
from models.tables import Delivery
from tests.support.deliveries import fixture, sample_headers
from tests.support.ingress import GITHUB_SECRET, settings_for, wait_until
from tests.support.stores import Store

pytestmark = pytest.mark.parametrize("store", ["sqlite"], indirect=True)

#: Long enough for the posts of a test to arrive while another holds the
#: write lock; short enough that a lock held past it fails the test quickly.
BUSY_TIMEOUT_MS = 1500


class InboxCommits:
    """Counts the commits on ``engine`` that stored inbox rows (not the
    heartbeat's, nor the reads' of the source)."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        #: Inbox INSERTs begun, counted before SQLite runs them (or waits for its lock).
        self.inserts = 0
        #: While set, a commit that would store inbox rows fails instead.
        self.failing = False
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)
        event.listen(engine, "rollback", self._rollback)

    def _statement(self, connection, _cursor, statement: str, *_) -> None:
        if statement.startswith("INSERT INTO deliveries"):
            self.inserts += 1
            connection.info["inbox_rows"] = True

    def _commit(self, connection) -> None:
        if connection.info.get("inbox_rows") and self.failing:
            error = sqlite3.OperationalError("disk I/O error")
            raise sa_exc.OperationalError("COMMIT", None, error)
        if connection.info.pop("inbox_rows", False):
            self.count += 1

    def _rollback(self, connection) -> None:
        connection.info.pop("inbox_rows", None)


@dataclass
class Grouped:
    client: TestClient
    store: Store
    runtime: IngressRuntime
    commits: InboxCommits
    source_id: int

    @property
    def inbox(self) -> GroupCommitInbox:
        assert isinstance(self.runtime.inbox, GroupCommitInbox)
        return self.runtime.inbox

    def record_all(self, incomings: list[IncomingDelivery]) -> list[Recorded | BaseException]:
        """Hand every delivery to the ingress's inbox in the same turn of its
        event loop, as concurrent requests do, and wait for every answer."""

        async def together() -> list[Recorded | BaseException]:
            recording = (self.runtime.record_delivery(incoming) for incoming in incomings)
            return await asyncio.gather(*recording, return_exceptions=True)

        return self.client.portal.call(together)

    def incoming(self, delivery_id: str, body: bytes | None = None) -> IncomingDelivery:
        return IncomingDelivery(
            source_id=self.source_id,
            delivery_id=delivery_id,
            body=body if body is not None else f'{{"delivery": "{delivery_id}"}}'.encode(),
            event="issues",
            action="opened",
            headers={},
            content_type="application/json",
        )

    def post(self, delivery_id: str, number: int):
        """The GitHub fixture ``issues__opened`` as issue ``number`` (a body of
        its own: the same body under another id would be a replay)."""
        document = json.loads(fixture("github", "issues__opened"))
        document["issue"]["number"] = number
        body = json.dumps(document).encode()
        headers = sample_headers("github", "issues__opened", body, GITHUB_SECRET)
        headers["X-GitHub-Delivery"] = delivery_id
        return self.client.post("/webhooks/github/acme-github", content=body, headers=headers)

    def stored(self) -> list[str]:
        with self.store.sessions() as session:
            return list(session.scalars(select(Delivery.delivery_id).order_by(Delivery.id)))


@pytest.fixture
def grouped(store: Store) -> Iterator[Grouped]:
    workspace = store.workspace()
    with session_scope(store.sessions) as session:
        source_id = add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug="acme-github",
            secret=GITHUB_SECRET,
            create_events=["issues.opened"],
        ).id
    settings = settings_for(store.url, sqlite_busy_timeout_ms=BUSY_TIMEOUT_MS)
    app = create_app(settings, publish=lambda keys, lane: None)
    with TestClient(app) as client:
        runtime: IngressRuntime = app.state.runtime
        yield Grouped(client, store, runtime, InboxCommits(runtime.sessions.kw["bind"]), source_id)


@contextlib.contextmanager
def write_lock_held(store: Store) -> Iterator[None]:
    """SQLite's write lock, taken by a connection of another program."""
    connection = sqlite3.connect(store.url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        yield
        connection.execute("ROLLBACK")
    finally:
        connection.close()


def deliveries_per_commit(client: TestClient) -> tuple[float, float]:
    """The commits the metrics counted, and the deliveries they stored."""
    lines = client.get("/metrics").text.splitlines()
    count, total = (
        float(line.split()[-1])
        for name in ("_count ", "_sum ")
        for line in lines
        if line.startswith(f"taskhook_ingress_deliveries_per_commit{name}")
    )
    return count, total


# --- one commit for the deliveries that arrive together ------------------------------


def test_deliveries_that_arrive_together_are_stored_in_one_commit(grouped: Grouped):
    incomings = [grouped.incoming(f"d-{n}") for n in range(20)]

    answers = grouped.record_all(incomings)

    assert [answer.is_new for answer in answers] == [True] * 20
    assert len({answer.pk for answer in answers}) == 20
    assert grouped.commits.count == 1
    assert grouped.stored() == [f"d-{n}" for n in range(20)]
    assert deliveries_per_commit(grouped.client) == (1, 20)


def test_a_group_stores_at_most_max_group_deliveries(grouped: Grouped):
    incomings = [grouped.incoming(f"d-{n}") for n in range(MAX_GROUP + 6)]

    answers = grouped.record_all(incomings)

    assert all(answer.is_new for answer in answers)
    assert grouped.commits.count == 2
    assert deliveries_per_commit(grouped.client) == (2, MAX_GROUP + 6)


def test_a_lone_delivery_is_committed_alone(grouped: Grouped):
    (answer,) = grouped.record_all([grouped.incoming("d-1")])

    assert answer.is_new
    assert grouped.commits.count == 1
    assert grouped.stored() == ["d-1"]


def test_concurrent_posts_share_commits_and_each_is_answered_once(grouped: Grouped):
    """Posts through the app while the first one's write waits for SQLite's
    lock: the others arrive during it and go in the next commit together."""
    posts = 8
    with ThreadPoolExecutor(posts) as pool, write_lock_held(grouped.store):
        first = pool.submit(grouped.post, "d-0", 1)
        # Its group is being written: its INSERT waits for the lock.
        wait_until(lambda: grouped.commits.inserts == 1)
        rest = [pool.submit(grouped.post, f"d-{n}", n + 1) for n in range(1, posts)]
        wait_until(lambda: grouped.inbox.waiting == posts - 1)
    answers = [first.result(timeout=10), *(future.result(timeout=10) for future in rest)]

    assert [answer.status_code for answer in answers] == [202] * posts
    assert [answer.json()["status"] for answer in answers] == ["queued"] * posts
    assert len({answer.json()["delivery"] for answer in answers}) == posts
    assert grouped.commits.count == 2  # the first alone, then the seven together
    assert sorted(grouped.stored()) == sorted(f"d-{n}" for n in range(posts))


# --- duplicates in one group -----------------------------------------------------------


def test_a_delivery_twice_in_one_group_is_stored_once_and_answered_duplicate(grouped: Grouped):
    twice = grouped.incoming("d-1")

    first, again, other = grouped.record_all([twice, twice, grouped.incoming("d-2")])

    assert (first.is_new, again.is_new, again.pk) == (True, False, first.pk)
    assert other.is_new
    assert grouped.commits.count == 1
    assert grouped.stored() == ["d-1", "d-2"]


def test_a_post_twice_in_one_group_is_answered_duplicate_and_remembered(grouped: Grouped):
    with ThreadPoolExecutor(3) as pool, write_lock_held(grouped.store):
        first = pool.submit(grouped.post, "d-0", 1)
        wait_until(lambda: grouped.commits.inserts == 1)
        twice = [pool.submit(grouped.post, "d-1", 2) for _ in range(2)]
        wait_until(lambda: grouped.inbox.waiting == 2)
    assert first.result(timeout=10).json()["status"] == "queued"
    statuses = sorted(future.result(timeout=10).json()["status"] for future in twice)

    assert statuses == ["duplicate", "queued"]
    assert grouped.stored().count("d-1") == 1
    # Remembered once committed: a redelivery is answered without the database.
    grouped.commits.count = 0
    assert grouped.post("d-1", 2).json() == {"status": "duplicate"}
    assert grouped.commits.count == 0


# --- a group that fails ------------------------------------------------------------------


def test_a_delivery_whose_write_fails_fails_alone(grouped: Grouped, monkeypatch):
    real = ingest.runtime.record_delivery

    def record_delivery(*, session, incoming):
        if incoming.delivery_id == "d-bad":
            raise sa_exc.OperationalError("INSERT", None, sqlite3.OperationalError("disk I/O"))
        return real(session=session, incoming=incoming)

    monkeypatch.setattr(ingest.runtime, "record_delivery", record_delivery)
    names = ["d-1", "d-2", "d-bad", "d-3", "d-4"]

    answers = grouped.record_all([grouped.incoming(name) for name in names])

    by_name = dict(zip(names, answers, strict=True))
    assert isinstance(by_name.pop("d-bad"), StoreUnavailable)
    assert all(answer.is_new for answer in by_name.values())
    # Written again alone, all at once, in whatever order they commit.
    assert sorted(grouped.stored()) == ["d-1", "d-2", "d-3", "d-4"]
    # The group's commit never came; each of the others committed alone.
    assert grouped.commits.count == 4


def test_a_group_failing_once_is_stored_by_each_alone_never_twice(grouped: Grouped, monkeypatch):
    real = ingest.runtime.record_delivery
    failed: list[str] = []

    def record_delivery(*, session, incoming):
        if incoming.delivery_id == "d-3" and not failed:
            failed.append(incoming.delivery_id)
            raise sa_exc.OperationalError("INSERT", None, sqlite3.OperationalError("locked"))
        return real(session=session, incoming=incoming)

    monkeypatch.setattr(ingest.runtime, "record_delivery", record_delivery)

    answers = grouped.record_all([grouped.incoming(f"d-{n}") for n in range(5)])

    # The rows the group wrote before d-3 were rolled back: none is a duplicate now.
    assert [answer.is_new for answer in answers] == [True] * 5
    assert sorted(grouped.stored()) == [f"d-{n}" for n in range(5)]


def test_a_failing_commit_stores_nothing_and_answers_every_one_an_error(grouped: Grouped):
    grouped.commits.failing = True

    answers = grouped.record_all([grouped.incoming(f"d-{n}") for n in range(5)])

    assert all(isinstance(answer, StoreUnavailable) for answer in answers)
    assert grouped.stored() == []

    grouped.commits.failing = False
    answers = grouped.record_all([grouped.incoming(f"d-{n}") for n in range(5)])
    assert all(answer.is_new for answer in answers)
    assert grouped.stored() == [f"d-{n}" for n in range(5)]
    assert grouped.commits.count == 1


def test_a_write_lock_held_past_the_busy_timeout_is_a_503_for_each(grouped: Grouped):
    with ThreadPoolExecutor(4) as pool, write_lock_held(grouped.store):
        first = pool.submit(grouped.post, "d-0", 1)
        wait_until(lambda: grouped.commits.inserts == 1)
        rest = [pool.submit(grouped.post, f"d-{n}", n + 1) for n in range(1, 4)]
        # Held until every post has failed: the group's write, then each alone.
        answers = [first.result(timeout=30), *(future.result(timeout=30) for future in rest)]

    assert [answer.status_code for answer in answers] == [503] * 4
    assert grouped.stored() == []
    assert [grouped.post(f"d-{n}", n + 1).status_code for n in range(4)] == [202] * 4
    assert grouped.stored() == ["d-0", "d-1", "d-2", "d-3"]


# --- shutdown -------------------------------------------------------------------------


def test_closing_answers_every_delivery_handed_to_it(grouped: Grouped):
    inbox = grouped.inbox

    async def record_then_close() -> list[Recorded]:
        tasks = [asyncio.create_task(inbox.record(grouped.incoming(f"d-{n}"))) for n in range(10)]
        await asyncio.sleep(0)  # every one handed over
        await inbox.close()
        assert all(task.done() for task in tasks)
        return [task.result() for task in tasks]

    answers = grouped.client.portal.call(record_then_close)

    assert all(answer.is_new for answer in answers)
    assert grouped.stored() == [f"d-{n}" for n in range(10)]
