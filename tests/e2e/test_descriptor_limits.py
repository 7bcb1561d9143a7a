"""The ingress at its limit of open files, on the real server: ``python -m
ingest.server`` started with a soft and hard RLIMIT_NOFILE of 1,024 (so the
raise at start cannot help), on SQLite and the filesystem broker, then on
PostgreSQL and Redis, raw sockets on the other end.

1,100 connections that begin a head and never finish it would take every
descriptor the ingress has; past that, the event loop's accept fails, and
uvloop then accepts and closes what waits in the listen queue: signed
deliveries were reset (22 of 36, issue 35). The ingress bounds its
connections below the limit and, at the bound, closes the connection that
has waited longest for its head: every signed delivery is answered 202, and
none is reset.
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from models.db import make_engine, make_session_factory, session_scope
from models.sources import add_source
from models.tables import Delivery
from models.workspaces import create_workspace
from tests.support.deliveries import fixture, github_headers
from tests.support.processes import Ingress

pytestmark = pytest.mark.e2e

SECRET, SOURCE = "descriptors-github-secret", "descriptors-github"
PATH = f"/webhooks/github/{SOURCE}"
OPEN_FILES = 1024
SLOW_CONNECTIONS = 1100
DELIVERIES = 36


def at_1024_open_files() -> None:
    """In the ingress's process before it runs: soft and hard limit 1,024."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


#: The slow heads stay open for the whole test unless the ingress closes them.
PATIENT = {"TASKHOOK_HEADER_READ_TIMEOUT_SECONDS": "120"}


def add_github_source(sessions: sessionmaker[Session]) -> None:
    with session_scope(sessions) as session:
        workspace = create_workspace(session=session, slug="fds", name="F", task_prefix="FDS")
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug=SOURCE,
            secret=SECRET,
            create_events=["issues.opened"],
        )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def served(
    request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path
) -> Iterator[tuple[Ingress, sessionmaker[Session]]]:
    """The ingress at 1,024 open files with a GitHub source, and its store: the
    embedded default (SQLite, the filesystem broker), then PostgreSQL and Redis."""
    if request.param == "postgresql":
        sessions = request.getfixturevalue("sessions")
        add_github_source(sessions)
        start_ingress = request.getfixturevalue("start_ingress")
        yield start_ingress(preexec_fn=at_1024_open_files, **PATIENT), sessions
        return
    path = tmp_path / "taskhook.db"
    shutil.copyfile(sqlite_template, path)
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    try:
        sessions = make_session_factory(engine)
        add_github_source(sessions)
        ingress = Ingress(
            tmp_path,
            url,
            "filesystem://",
            preexec_fn=at_1024_open_files,
            TASKHOOK_BROKER_FOLDER=str(tmp_path / "broker"),
            **PATIENT,
        )
        try:
            yield ingress, sessions
        finally:
            ingress.stop()
    finally:
        engine.dispose()


def signed_delivery(ingress: Ingress, number: int) -> tuple[str, bytes]:
    """A signed GitHub delivery of an issue of its own: (delivery id, request)."""
    payload = json.loads(fixture("github", "issues__opened"))
    payload["issue"]["number"] = 35_000 + number
    body = json.dumps(payload).encode()
    headers = github_headers("issues__opened", body, SECRET)
    lines = [f"POST {PATH} HTTP/1.1", f"Host: 127.0.0.1:{ingress.port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    return headers["X-GitHub-Delivery"], "\r\n".join(lines).encode() + b"\r\n\r\n" + body


def post(ingress: Ingress, request: bytes) -> str:
    """Send ``request`` on a connection of its own; what came back: the
    answer's status line, ``"reset"``, ``"closed"`` (nothing said) or ``"timeout"``."""
    received = b""
    try:
        with socket.create_connection(("127.0.0.1", ingress.port), timeout=30) as sock:
            sock.sendall(request)
            while chunk := sock.recv(65536):
                received += chunk
    except ConnectionResetError:
        return "reset"
    except TimeoutError:
        return "timeout"
    if not received:
        return "closed"
    head = received.split(b"\r\n\r\n", 1)[0].decode(errors="replace")
    status = head.split("\r\n", 1)[0]
    if not status.startswith("HTTP/1.1 202"):
        return f"{status} ({head!r})"
    return status


def test_slow_heads_past_the_open_files_limit_leave_signed_deliveries_accepted(
    served: tuple[Ingress, sessionmaker[Session]],
) -> None:
    ingress, sessions = served
    slow: list[socket.socket] = []
    try:
        for _ in range(SLOW_CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", ingress.port), timeout=10)
            slow.append(sock)
            with contextlib.suppress(OSError):  # the ingress may have closed it already
                sock.sendall(b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: slow\r\n")
        time.sleep(1)  # the ingress takes them in

        sent = [signed_delivery(ingress, number) for number in range(DELIVERIES)]
        outcomes = [post(ingress, request) for _, request in sent]
    finally:
        for sock in slow:
            sock.close()

    failed = [outcome for outcome in outcomes if not outcome.startswith("HTTP/1.1 202")]
    assert not failed, (
        f"{len(failed)} of {DELIVERIES} not accepted: {failed[:5]}\n{ingress.process.tail()}"
    )
    with sessions() as session:
        stored = session.scalar(
            select(func.count())
            .select_from(Delivery)
            .where(Delivery.delivery_id.in_([delivery_id for delivery_id, _ in sent]))
        )
    assert stored == DELIVERIES
    log = ingress.process.text()
    assert "socket.accept() out of system resource" not in log
    assert "Too many open files" not in log
