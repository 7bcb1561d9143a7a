"""The processes of one scenario -- uvicorn, Celery workers, beat -- on one database
and one broker, each stopped by its pid when the scenario ends.

Built on the end-to-end helpers (tests/support/processes.py): the same
``WorkerProcess`` (its own process group, warm shutdown then SIGKILL to the
group), the same environment (short timings in ``FAST``), the same ``Ingress``.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from models.broker.messages import DELIVERY_QUEUES
from models.db import make_engine, make_session_factory, session_scope
from models.sources import add_source
from models.tables import Delivery as DeliveryRow
from models.tables import Task, WebhookSource
from models.workspaces import create_workspace
from tests.support.invariants import assert_invariants
from tests.support.processes import (
    READY_TIMEOUT,
    ROOT,
    Ingress,
    WorkerProcess,
    worker_environment,
)
from tests.support.traffic import JIRA_SITE, Delivery

#: Counts in the scenarios are multiplied by this (at least the issue's numbers).
SCALE = max(1.0, float(os.environ.get("TASKHOOK_RELIABILITY_SCALE", "1")))


def scaled(count: int) -> int:
    """``count`` times the run's scale (TASKHOOK_RELIABILITY_SCALE), rounded up."""
    return math.ceil(count * SCALE)


#: A fail point's line:
#: ``fail point after_insert: SIGKILL to pid 412 (delivery 37) at 1732890000.125``.
KILL_LINE = re.compile(
    r"fail point (?P<point>\w+): SIGKILL to pid (?P<pid>\d+)"
    r"(?: \(delivery (?P<delivery>\d+)\))? at (?P<at>[\d.]+)"
)
BACKSTOP_LINE = re.compile(r"delivery (?P<delivery>\d+): the lookup missed .* the insert backstop")
SWEEP_LINE = re.compile(r"Task taskhook\.sweep\[[^\]]+\] succeeded in [\d.]+s: \{'sent': (\d+)\}")


class Stack:
    """``root``: where the processes' code is -- this checkout, or another
    release's laid out beside it (tests/support/releases.py), imported first."""

    def __init__(
        self, folder: Path, database_url: str, broker_url: str, *, root: Path = ROOT, **env: str
    ) -> None:
        self.folder, self.database_url, self.broker_url = folder, database_url, broker_url
        self.root = root
        self.env = env if root == ROOT else {"PYTHONPATH": str(root), **env}
        self.processes: list[WorkerProcess] = []
        self.workers: list[WorkerProcess] = []
        self.ingresses: list[Ingress] = []

    def _environment(self, env: dict[str, str]) -> dict[str, str]:
        return worker_environment(self.database_url, self.broker_url, **(self.env | env))

    def worker(
        self,
        name: str,
        *,
        pool: str | None = None,
        concurrency: int | None = None,
        queues: str = ",".join(DELIVERY_QUEUES),
        beat: bool = False,
        wait: bool = True,
        **env: str,
    ) -> WorkerProcess:
        """``celery -A worker worker`` with its own log; ready when it returns."""
        unique = f"{name}-{uuid.uuid4().hex[:6]}"
        args = [sys.executable, "-m", "celery", "-A", "worker", "worker", "-Q", queues]
        args += ["-n", f"{unique}@%h", "-l", "INFO"]
        # Without a pool or a concurrency, the shape taskhook ships: the threads
        # pool, TASKHOOK_WORKER_CONCURRENCY threads (models.settings).
        args += [] if pool is None else ["--pool", pool]
        args += [] if concurrency is None else ["-c", str(concurrency)]
        args += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        if beat:
            args += ["-B", "-s", str(self.folder / f"{unique}-beat-schedule")]
        process = WorkerProcess(
            unique, self.folder / f"{unique}.log", args, self._environment(env), cwd=self.root
        )
        self.processes.append(process)
        self.workers.append(process)
        if wait:
            process.wait_ready()
        return process

    def beat(self, **env: str) -> WorkerProcess:
        """``celery -A worker beat``: the sweeper's clock, as the Procfile runs it."""
        unique = f"beat-{uuid.uuid4().hex[:6]}"
        args = [sys.executable, "-m", "celery", "-A", "worker", "beat", "-l", "INFO"]
        args += ["-s", str(self.folder / f"{unique}-schedule")]
        process = WorkerProcess(
            unique, self.folder / f"{unique}.log", args, self._environment(env), cwd=self.root
        )
        self.processes.append(process)
        self.workers.append(process)
        wait_for_text(process, "beat: Starting...")
        return process

    def ingress(self, **env: str) -> Ingress:
        merged = self.env | env
        ingress = Ingress(self.folder, self.database_url, self.broker_url, cwd=self.root, **merged)
        self.ingresses.append(ingress)
        self.processes.append(ingress.process)
        return ingress

    def stop(self, process: WorkerProcess) -> None:
        process.stop()

    def stop_all_workers(self) -> None:
        """Stop every worker and beat (warm shutdown, by pid); the ingress stays."""
        for process in reversed(self.workers):
            process.stop()
        self.workers.clear()

    def stop_all(self) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(Exception):
                process.stop()

    def logs(self) -> str:
        return "\n".join(process.text() for process in self.processes)


def wait_for_text(process: WorkerProcess, text: str, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while text not in process.text():
        if process.process.poll() is not None:
            pytest.fail(f"{process.name} exited early\n{process.tail()}", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"{process.name}: no {text!r} after {timeout} s\n{process.tail()}", False)
        time.sleep(0.05)


def relay_counts(ingress_url: str) -> dict[str, float]:
    """The ingress relay's keys from its ``/metrics``: ``published`` (handed to
    the broker), ``dropped`` (left to the sweeper) and ``pending``."""
    values = {}
    for line in httpx.get(f"{ingress_url}/metrics", timeout=10).text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in ("taskhook_relay_published_total", "taskhook_relay_dropped_total"):
            values[name.split("_")[2]] = float(value)
        elif name == "taskhook_relay_pending":
            values["pending"] = float(value)
    return values


def kill_process(process: WorkerProcess) -> None:
    """SIGKILL the process itself (not a warm shutdown): a crash, by its pid."""
    with contextlib.suppress(ProcessLookupError):
        process.process.send_signal(signal.SIGKILL)
    process.process.wait(timeout=10)


def kills_in(text: str) -> list[dict]:
    return [match.groupdict() for match in KILL_LINE.finditer(text)]


def backstops_in(text: str) -> set[int]:
    return {int(match["delivery"]) for match in BACKSTOP_LINE.finditer(text)}


def swept_in(text: str) -> int:
    return sum(int(count) for count in SWEEP_LINE.findall(text))


# --- the scenario's view of its database --------------------------------------------------------


@dataclass(frozen=True)
class Tenant:
    """A workspace fed by a Jira, a GitHub and a GitLab source, with their secrets."""

    workspace_id: int
    slug: str
    jira_source: str
    jira_secret: str
    github_source: str
    github_secret: str
    gitlab_source: str
    gitlab_secret: str

    def jira(self, key: str, **options) -> Delivery:
        return Delivery.jira(self.jira_source, self.jira_secret, key, **options)

    def github(self, number: int, **options) -> Delivery:
        return Delivery.github(self.github_source, self.github_secret, number, **options)


def add_tenant(sessions: sessionmaker[Session], secret_book, slug: str, prefix: str) -> Tenant:
    jira_secret = secret_book.new(f"{slug}-jira-secret")
    github_secret = secret_book.new(f"{slug}-github-secret")
    gitlab_secret = secret_book.new(f"{slug}-gitlab-secret")
    with session_scope(sessions) as session:
        workspace = create_workspace(
            session=session, slug=slug, name=slug.title(), task_prefix=prefix
        )
        add_source(
            session=session,
            provider="jira",
            workspace_id=workspace.id,
            slug=f"{slug}-jira",
            secret=jira_secret,
            create_events=["jira:issue_created"],
            site_url=JIRA_SITE,
        )
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug=f"{slug}-github",
            secret=github_secret,
            create_events=["issues.opened", "pull_request.opened"],
        )
        add_source(
            session=session,
            provider="gitlab",
            workspace_id=workspace.id,
            slug=f"{slug}-gitlab",
            secret=gitlab_secret,
            create_events=["Issue Hook.open", "Merge Request Hook.open"],
        )
        workspace_id = workspace.id
    return Tenant(
        workspace_id,
        slug,
        f"{slug}-jira",
        jira_secret,
        f"{slug}-github",
        github_secret,
        f"{slug}-gitlab",
        gitlab_secret,
    )


def unfinished(sessions: sessionmaker[Session]) -> int:
    """Deliveries still queued or processing, in the whole database."""
    with sessions() as session:
        return session.scalar(
            select(func.count())
            .select_from(DeliveryRow)
            .where(DeliveryRow.status.in_(["queued", "processing"]))
        )


#: How long a drain may stand still -- no delivery stored, none finished --
#: before a scenario fails. Longer than anything a scenario waits for on
#: purpose: a lease (3-5 s), a sweep (1 s), a worker reconnecting to a broker
#: that came back (kombu's retries are at most 30 s apart).
DRAIN_STUCK_AFTER = 60.0


def wait_drained(
    sessions: sessionmaker[Session],
    *,
    expected: int,
    stuck_after: float = DRAIN_STUCK_AFTER,
    logs=(),
) -> float:
    """Wait until ``expected`` deliveries are stored and none is unfinished;
    returns the seconds it took.

    No deadline on the whole drain: on a loaded machine the workers drain
    slower, and a deadline sized for a quiet one measured the machine (one
    missed at load average 5-7). The wait fails only when the drain has stood
    still for ``stuck_after`` seconds, naming what was left."""
    started = moved_at = time.monotonic()
    last: tuple[int, int] | None = None
    while True:
        with sessions() as session:
            by_status = Counter(
                dict(
                    session.execute(
                        select(DeliveryRow.status, func.count()).group_by(DeliveryRow.status)
                    ).all()
                )
            )
        stored = sum(by_status.values())
        left = {status: by_status[status] for status in ("queued", "processing")}
        if stored >= expected and not any(left.values()):
            return time.monotonic() - started
        now = time.monotonic()
        progress = (stored, stored - sum(left.values()))
        if progress != last:
            last, moved_at = progress, now
        elif now - moved_at > stuck_after:
            tails = "\n".join(process.tail() for process in logs)
            pytest.fail(
                f"the drain stood still for {stuck_after:.0f} s, {now - started:.0f} s in: "
                f"{stored} of {expected} deliveries stored, {left['queued']} queued and "
                f"{left['processing']} processing\n{tails}",
                pytrace=False,
            )
        time.sleep(0.1)


def outcomes(sessions: sessionmaker[Session], workspace_id: int | None = None) -> Counter:
    """Finished deliveries by (status, outcome)."""
    query = select(DeliveryRow.status, DeliveryRow.outcome, func.count()).group_by(
        DeliveryRow.status, DeliveryRow.outcome
    )
    if workspace_id is not None:
        query = query.join(WebhookSource, WebhookSource.id == DeliveryRow.source_id).where(
            WebhookSource.workspace_id == workspace_id
        )
    with sessions() as session:
        return Counter({(s, o): n for s, o, n in session.execute(query).all()})


def tasks_by_external_id(sessions: sessionmaker[Session], workspace_id: int) -> Counter:
    with sessions() as session:
        rows = session.execute(
            select(Task.external_id, func.count())
            .where(Task.workspace_id == workspace_id)
            .group_by(Task.external_id)
        ).all()
    return Counter(dict(rows))


def database_view(url: str) -> tuple[Engine, sessionmaker[Session]]:
    engine = make_engine(url)
    return engine, make_session_factory(engine)


def taskhook(
    database_url: str,
    broker_url: str,
    log,
    *args: str,
    root: Path = ROOT,
    hidden: tuple[str, ...] = (),
    **env: str,
) -> subprocess.CompletedProcess:
    """The real CLI, as an operator runs it (``python -m worker.cli`` is ``taskhook``);
    ``root``: another release's code, as in :class:`Stack`. The ``hidden``
    values (a secret given as an argument) are starred in the log."""
    if root != ROOT:
        env = {"PYTHONPATH": str(root), **env}
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        cwd=root,
        env=worker_environment(database_url, broker_url, **env),
        # An operator's script: nobody at a terminal answers a question.
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    transcript = f"$ taskhook {' '.join(args)}\n{done.stdout}{done.stderr}\n"
    for value in hidden:
        transcript = transcript.replace(value, "***")
    with log.open("a") as output:
        output.write(transcript)
    return done


def assert_each_jira_issue_done_once(
    sessions: sessionmaker[Session], engine: Engine, workspace_id: int, prefix: str, count: int
) -> None:
    """Issues ``{prefix}-1`` to ``{prefix}-{count}`` (Jira's) each became one
    task, created by a delivery that is done; and the invariants hold."""
    assert tasks_by_external_id(sessions, workspace_id) == {
        f"jira:{prefix}-{n}": 1 for n in range(1, count + 1)
    }
    assert outcomes(sessions, workspace_id) == {("done", "created"): count}
    assert_invariants(engine)
