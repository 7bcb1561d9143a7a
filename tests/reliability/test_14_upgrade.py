"""Scenario 14: an upgrade and a rollback with traffic in flight, one release
back, both ways (docs/deploy.md, "Upgrades").

The release before this code (tests/support/releases.py: 0.1.0) is laid
out from this clone's history and run from its own folder, with this
virtualenv's Python but its own modules. On PostgreSQL and a Redis of the
scenario's own, under a steady stream of signed Jira deliveries (new issues,
second deliveries for an issue, exact redeliveries), posted to whichever
ingresses a load balancer would send them to:

- **upgrade**: the old release migrates an empty database and runs (ingress,
  worker with beat); this code migrates to its head; its ingress joins the
  rotation (its messages reach the old worker), then its worker (which takes
  the old ingress's messages); the old ingress leaves the rotation and both
  old processes are stopped (SIGTERM); traffic goes on.
- **rollback**: this code on its schema; the old release's ingress and worker
  start beside it, on the newer schema; this code's are stopped.

Each direction: every delivery answered 2xx became exactly one task per
issue (none lost, none twice), every delivery reached its final state, and
no process of either release logged a message it could not read or a task
that failed. ``TASKHOOK_UPGRADE_SOAK=<seconds>`` holds each stage that long
instead of a few seconds.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import select

from models.tables import Workspace
from tests.support.invariants import assert_invariants
from tests.support.processes import ROOT, Ingress, WorkerProcess
from tests.support.releases import PREVIOUS, current_version, lay_out
from tests.support.services import ThrowawayDatabase
from tests.support.stack import (
    Stack,
    database_view,
    outcomes,
    swept_in,
    taskhook,
    tasks_by_external_id,
    wait_drained,
)
from tests.support.traffic import JIRA_SITE, Delivery
from tests.support.upgrades import DeliveryStream, imported_from, unreadable_lines

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

SCENARIO = f"14. upgrade {PREVIOUS.version} -> {current_version()} and back, traffic in flight"

#: How long each stage holds while the traffic flows.
HOLD = float(os.environ.get("TASKHOOK_UPGRADE_SOAK", "1.5"))
#: Deliveries a second, from four senders.
RATE = 25.0


@pytest.fixture(scope="module")
def previous_code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lay_out(PREVIOUS, tmp_path_factory.mktemp("previous-release") / PREVIOUS.version)


@pytest.fixture(scope="module")
def shared() -> dict[str, str]:
    """What every process of both releases shares: one key file for the
    sealed secrets (the old code's folder has none of its own)."""
    key_file = ROOT / "var" / "encryption.key"  # made by tests/conftest.py
    assert key_file.exists()
    return {"TASKHOOK_ENCRYPTION_KEY_FILE": str(key_file)}


class Tenant:
    """A workspace with one Jira source, made through a release's own CLI,
    and the deliveries one direction's stream posts to it, for issues
    ``{keys}-N``: a new issue mostly, every 5th a second delivery for an
    issue two before, every 7th an exact redelivery of the delivery three
    before."""

    def __init__(self, slug: str, secret: str, keys: str) -> None:
        self.slug, self.secret, self.keys = slug, secret, keys
        self.source = f"{slug}-jira"
        self.prefix = slug.upper().replace("-", "")
        self._made: dict[int, Delivery] = {}
        self._lock = threading.Lock()

    def create(self, database_url: str, broker_url: str, log: Path, root: Path, env) -> None:
        for args in (
            ("workspace", "add", self.slug, "--name", self.slug, "--prefix", self.prefix),
            (
                "source",
                "add",
                "jira",
                "--workspace",
                self.slug,
                "--name",
                self.source,
                "--secret",
                self.secret,
                "--site",
                JIRA_SITE,
            ),
        ):
            done = taskhook(
                database_url, broker_url, log, *args, root=root, hidden=(self.secret,), **env
            )
            assert done.returncode == 0, done.stderr

    def issue_of(self, index: int) -> int:
        return self.issue_of(index - 2) if index % 5 == 4 else index

    def delivery(self, index: int) -> Delivery:
        with self._lock:
            if index in self._made:
                return self._made[index]
        if index % 7 == 6:
            made = self.delivery(index - 3)
        else:
            made = Delivery.jira(self.source, self.secret, f"{self.keys}-{self.issue_of(index)}")
        with self._lock:
            return self._made.setdefault(index, made)


@pytest.fixture(scope="module")
def empty_database() -> Iterator[ThrowawayDatabase]:
    """A database with no schema: the old release migrates it."""
    database = ThrowawayDatabase("upgrade", migrated=False)
    try:
        yield database
    finally:
        database.drop()


@dataclass
class Running:
    """One release's ingress and worker (with beat), as they run now."""

    stack: Stack
    ingress: Ingress
    worker: WorkerProcess

    @classmethod
    def start(cls, stack: Stack, name: str) -> Running:
        return cls(stack, stack.ingress(), stack.worker(name, beat=True))

    def stop(self) -> dict[str, int | None]:
        """SIGTERM, as a deploy stops them: the warm shutdown's exit codes."""
        self.stack.stop(self.ingress.process)
        self.stack.stop(self.worker)
        return {
            "ingress": self.ingress.process.process.returncode,
            "worker": self.worker.process.returncode,
        }


def roll(
    stream: DeliveryStream,
    departing: Running,
    arriving: Stack,
    *,
    name: str,
    before_arrival=lambda: None,
) -> tuple[Running, dict]:
    """Traffic to ``departing``; ``before_arrival`` (the migration); the
    arriving release's ingress joins the rotation, then its worker; the
    departing ingress leaves it and both departing processes are stopped."""
    started = time.monotonic()
    stream.route_to(departing.ingress.url)
    stream.start()
    time.sleep(HOLD)
    before_arrival()
    # The arriving ingress first: for a while its messages reach only the
    # departing release's worker. Then its worker, which takes the
    # departing ingress's messages too.
    ingress = arriving.ingress()
    stream.route_to(departing.ingress.url, ingress.url)
    time.sleep(HOLD)
    worker_from = time.time()
    arrived = Running(arriving, ingress, arriving.worker(name, beat=True))
    time.sleep(HOLD)
    stream.route_to(ingress.url)  # the load balancer drains the departing ingress
    exits = departing.stop()
    time.sleep(HOLD)
    stream.stop()
    # Stored by the arriving ingress while the departing worker was the only
    # one: read by the other release's worker, every one of them.
    crossed = sum(
        1
        for url, answer in stream.answered_by
        if url == ingress.url and answer.sent_at < worker_from and answer.accepted
    )
    assert crossed > 0, "no message of the arriving release reached the departing worker"
    # uvicorn ends its graceful shutdown by raising the SIGTERM again (-15).
    assert "Finished server process" in departing.ingress.process.text()
    return arrived, {
        "seconds": round(time.monotonic() - started, 1),
        "read by the other release's worker alone": crossed,
        "exit codes after SIGTERM": exits,
    }


def check(tenant: Tenant, stream: DeliveryStream, sessions, engine, expected_rows: int) -> dict:
    """Every delivery answered 2xx in the end; each issue one task; every
    delivery in its final state. The figures of one direction."""
    answers = stream.answers
    drained = wait_drained(sessions, expected=expected_rows)
    assert len(answers.accepted()) == len(answers), Counter(a.status for a in answers.answers)
    issues = {a.delivery.external_id for a in answers.accepted()}
    with sessions() as session:
        workspace_id = session.scalar(select(Workspace.id).where(Workspace.slug == tenant.slug))
    mine = f"jira:{tenant.keys}-"
    tasks = {
        external_id: count
        for external_id, count in tasks_by_external_id(sessions, workspace_id).items()
        if external_id.startswith(mine)
    }
    lost = sorted(issues - set(tasks))
    twice = sorted(external_id for external_id, count in tasks.items() if count > 1)
    unfinished = {
        key: count
        for key, count in outcomes(sessions, workspace_id).items()
        if key[0] in ("queued", "processing")
    }
    assert (lost, twice, unfinished) == ([], [], {})
    assert set(tasks) == issues
    assert_invariants(engine)
    return {
        "deliveries": len(answers),
        "answered": dict(answers.results()),
        "reposted after a refusal": len(stream.refused),
        "issues": len(issues),
        "tasks": sum(tasks.values()),
        "lost": len(lost),
        "duplicate tasks": len(twice),
        "drain after the stream, s": round(drained, 1),
    }


def test_upgrade_then_rollback_with_traffic_in_flight(
    previous_code: Path,
    empty_database: ThrowawayDatabase,
    private_redis,
    stack_on,
    module_logs: Path,
    secret_book,
    shared: dict[str, str],
    figures,
):
    url, broker = empty_database.url, private_redis.url
    cli_log = module_logs / "taskhook-cli.log"

    # What runs from the old folder is the old code, not this checkout's
    # (which the virtualenv has installed): 0.1.0 had no message versions.
    found = imported_from(previous_code, url, broker)
    assert all(
        Path(found[package]).is_relative_to(previous_code)
        for package in ("ingest", "migrations", "models", "worker")
    ), found
    assert found["models.broker.versions"] is False, found

    migrated = taskhook(url, broker, cli_log, "db", "upgrade", root=previous_code, **shared)
    assert migrated.returncode == 0, migrated.stderr
    old_schema = migrated.stdout.strip().rsplit(" ", 1)[-1].rstrip(".")
    # One workspace, made by the old release's CLI; each direction's issues.
    forward = Tenant("upgrade", secret_book.new("upgrade-jira-secret"), keys="UP")
    back = Tenant("upgrade", forward.secret, keys="BACK")
    forward.create(url, broker, cli_log, previous_code, shared)

    old = stack_on(url, broker, root=previous_code, **shared)
    new = stack_on(url, broker, **shared)
    engine, sessions = database_view(url)
    try:
        running_old = Running.start(old, f"v{PREVIOUS.version}")

        def migrate() -> None:
            done = taskhook(url, broker, cli_log, "db", "upgrade", **shared)
            assert done.returncode == 0, done.stderr
            _FOUND["schema"] = f"{old_schema} -> {done.stdout.strip().rsplit(' ', 1)[-1][:-1]}"

        stream = DeliveryStream(forward.delivery, rate=RATE)
        running_new, timing = roll(
            stream, running_old, new, name=f"v{current_version()}", before_arrival=migrate
        )
        upgrade = check(forward, stream, sessions, engine, len(_rows(stream)))

        rollback_stream = DeliveryStream(back.delivery, rate=RATE)
        _, rollback_timing = roll(
            rollback_stream, running_new, old, name=f"v{PREVIOUS.version}-again"
        )
        rows = len(_rows(stream)) + len(_rows(rollback_stream))
        rollback = check(back, rollback_stream, sessions, engine, rows)
    finally:
        engine.dispose()
        old.stop_all()
        new.stop_all()

    swept = sum(swept_in(process.text()) for process in (*old.workers, *new.workers))
    unreadable = {
        process.name: lines
        for process in (*old.processes, *new.processes)
        if (lines := unreadable_lines(process.text()))
    }
    figures.record(
        SCENARIO,
        **_FOUND,
        upgrade=upgrade | timing,
        rollback=rollback | rollback_timing,
        unreadable_log_lines=sum(len(lines) for lines in unreadable.values()),
        resent_by_the_sweeper=swept,
    )
    assert unreadable == {}


_FOUND: dict[str, object] = {}


def _rows(stream: DeliveryStream) -> set[str]:
    """The delivery ids the ingress stored: each is one row."""
    return {answer.delivery.delivery_id for answer in stream.answers.accepted()}
