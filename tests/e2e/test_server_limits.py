"""The ingress against hostile senders, on the real server: ``python -m
ingest.server`` (uvicorn with the bounded protocol of ``ingest/server.py``),
PostgreSQL and Redis, raw sockets on the other end.

A head over the cap is refused (431, or a closed connection) before the app
runs, at a cost in server CPU that does not grow with what the sender sends;
a head at the cap is served; a sender too slow with its head or its body is
answered 408 and closed; a signed delivery is accepted as ever.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import select as sql_select

from models.db import session_scope
from models.settings import Settings
from models.sources import add_source
from models.tables import Delivery
from models.workspaces import create_workspace
from tests.support.deliveries import fixture, github_headers
from tests.support.processes import Ingress

pytestmark = pytest.mark.e2e

SECRET, SOURCE = "limits-github-secret", "limits-github"
PATH = f"/webhooks/github/{SOURCE}"
CAP = Settings.model_fields["max_header_bytes"].default  # what the ingress ships with
MiB = 1024 * 1024
HEAD_TIMEOUT, BODY_TIMEOUT = 1.0, 3.0  # the impatient ingress's
ISSUE_NUMBERS = itertools.count(1)


@pytest.fixture(scope="module")
def source(sessions) -> None:
    with session_scope(sessions) as session:
        workspace = create_workspace(session=session, slug="limits", name="L", task_prefix="LIM")
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug=SOURCE,
            secret=SECRET,
            create_events=["issues.opened"],
        )


@pytest.fixture(scope="module")
def ingress(start_ingress: Callable[..., Ingress], source) -> Ingress:
    """The ingress with the limits it ships with."""
    return start_ingress()


@pytest.fixture(scope="module")
def impatient_ingress(start_ingress: Callable[..., Ingress], source) -> Ingress:
    """The ingress with short read timeouts, so a test need not wait 30 s."""
    return start_ingress(
        TASKHOOK_HEADER_READ_TIMEOUT_SECONDS=str(HEAD_TIMEOUT),
        TASKHOOK_BODY_READ_TIMEOUT_SECONDS=str(BODY_TIMEOUT),
    )


def issue_body() -> bytes:
    """The fixture of an opened issue, for an issue of its own: the same body
    twice would not be a new delivery."""
    payload = json.loads(fixture("github", "issues__opened"))
    payload["issue"]["number"] = next(ISSUE_NUMBERS)
    return json.dumps(payload, indent=2).encode()


def delivery(ingress: Ingress, *, head_size: int | None = None) -> tuple[str, bytes, bytes]:
    """A signed GitHub delivery as raw bytes: (delivery id, head, body). With
    ``head_size``, an X-Junk header pads the head to exactly that many bytes."""
    body = issue_body()
    headers = github_headers("issues__opened", body, SECRET)
    lines = [f"POST {PATH} HTTP/1.1", f"Host: 127.0.0.1:{ingress.port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    head = "\r\n".join(lines).encode() + b"\r\n\r\n"
    if head_size is not None:
        junk = head_size - len(head) - len(b"X-Junk: \r\n")
        head = head[:-2] + b"X-Junk: " + b"j" * junk + b"\r\n\r\n"
        assert len(head) == head_size
    return headers["X-GitHub-Delivery"], head, body


def answer(sock: socket.socket, limit: float) -> bytes:
    """What the server says until it closes the connection (a reset counts as
    closing); fails when it does neither within ``limit`` s."""
    received, deadline = b"", time.monotonic() + limit
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        except TimeoutError:
            break
        if not chunk:
            return received
        received += chunk
    pytest.fail(f"the ingress neither answered nor closed within {limit} s: {received[:200]!r}")


def statuses(received: bytes) -> list[int]:
    return [int(line.split()[1]) for line in received.split(b"\r\n") if line.startswith(b"HTTP/")]


def stored(sessions, delivery_id: str) -> bool:
    with sessions() as session:
        return (
            session.scalar(sql_select(Delivery.id).where(Delivery.delivery_id == delivery_id))
            is not None
        )


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (proc(5): utime, stime)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def healthz_seconds(ingress: Ingress) -> float:
    started = time.monotonic()
    assert httpx.get(f"{ingress.url}/healthz", timeout=10).status_code == 200
    return time.monotonic() - started


def send_junk_header(ingress: Ingress, size: int) -> bytes:
    """A request whose one header is ``size`` bytes, sent as fast as the socket
    takes it (until the server closes); what the server said."""
    with socket.create_connection(("127.0.0.1", ingress.port), timeout=60) as sock:
        with contextlib.suppress(OSError):  # the server may close while we send
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Junk: ")
            chunk = b"j" * MiB
            for _ in range(size // MiB):
                sock.sendall(chunk)
            sock.sendall(b"\r\n\r\n")
        return answer(sock, limit=60)


def readable(sock: socket.socket, timeout: float) -> bool:
    """Whether the server wrote or closed within ``timeout``. A selector, not
    ``select.select``, which refuses descriptors numbered 1024 or more, as a
    long test session's sockets may be."""
    with selectors.DefaultSelector() as watch:
        watch.register(sock, selectors.EVENT_READ)
        return bool(watch.select(timeout))


def test_a_1_mib_header_is_refused_at_once_while_healthz_answers(ingress: Ingress) -> None:
    latencies: list[float] = []
    sent = threading.Event()

    def poll() -> None:
        while not sent.is_set():
            latencies.append(healthz_seconds(ingress))

    poller = threading.Thread(target=poll)
    poller.start()
    started = time.monotonic()
    try:
        received = send_junk_header(ingress, MiB)
    finally:
        sent.set()
        poller.join()
    assert statuses(received) in ([431], []), received[:200]  # 431, or closed unanswered
    assert time.monotonic() - started < 2
    assert latencies and max(latencies) < 1, latencies
    assert "Exception in ASGI application" not in ingress.process.text()


def test_a_100_mib_header_costs_the_ingress_little_cpu(ingress: Ingress) -> None:
    # A resource bound, not a timing: the server's own CPU time, whatever the
    # machine's load. Before the bound, a 96 MiB header cost 14 s of it.
    before = cpu_seconds(ingress.process.pid)
    received = send_junk_header(ingress, 100 * MiB)
    spent = cpu_seconds(ingress.process.pid) - before
    assert spent < 1.0, f"the ingress spent {spent:.2f} s of CPU on one header"
    assert statuses(received) in ([431], []), received[:200]
    assert healthz_seconds(ingress) < 1


def test_a_signed_delivery_with_a_head_at_the_cap_is_accepted_and_one_byte_more_refused(
    ingress: Ingress, sessions
) -> None:
    at_cap, head, body = delivery(ingress, head_size=CAP)
    with socket.create_connection(("127.0.0.1", ingress.port), timeout=10) as sock:
        sock.sendall(head + body)
        received = answer(sock, limit=10)
    assert statuses(received) == [202], received[:300]
    assert stored(sessions, at_cap)

    over, head, body = delivery(ingress, head_size=CAP + 1)
    with socket.create_connection(("127.0.0.1", ingress.port), timeout=10) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(head + body)
        received = answer(sock, limit=10)
    assert statuses(received) in ([431], []), received[:300]
    assert not stored(sessions, over)


def test_a_head_trickled_past_its_timeout_is_closed(impatient_ingress: Ingress) -> None:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", impatient_ingress.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")
        with contextlib.suppress(OSError):
            while time.monotonic() - started < 6 and not readable(sock, 0.2):
                sock.sendall(b"X-Slow: 1\r\n")
        received = answer(sock, limit=5)
    assert statuses(received) in ([408], []), received[:200]
    assert time.monotonic() - started < HEAD_TIMEOUT + 1.5


def test_a_body_trickled_past_its_timeout_is_answered_408_and_not_stored(
    impatient_ingress: Ingress, sessions
) -> None:
    slow, head, body = delivery(impatient_ingress)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", impatient_ingress.port), timeout=10) as sock:
        sock.sendall(head)
        with contextlib.suppress(OSError):
            for byte in body[: int(BODY_TIMEOUT * 4)]:  # a byte every 0.5 s: twice too slow
                if readable(sock, 0.5):
                    break
                sock.sendall(bytes([byte]))
        received = answer(sock, limit=5)
    elapsed = time.monotonic() - started
    assert statuses(received) == [408], received[:200]
    assert BODY_TIMEOUT - 0.5 < elapsed < BODY_TIMEOUT + 2, (
        elapsed
    )  # the body's clock, not the head's
    assert not stored(sessions, slow)

    # A delivery sent at an ordinary pace is accepted by the same ingress.
    body = issue_body()
    headers = github_headers("issues__opened", body, SECRET)
    response = httpx.post(
        f"{impatient_ingress.url}{PATH}", content=body, headers=headers, timeout=10
    )
    assert response.status_code == 202, response.text
    assert stored(sessions, headers["X-GitHub-Delivery"])
    assert "Exception in ASGI application" not in impatient_ingress.process.text()
