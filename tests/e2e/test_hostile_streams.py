"""What a caller with a token can make a real ingress hold open: event
streams up to a cap per token and in all, MCP's idle GET stream for a while,
and REST and MCP bodies up to a size (docs/reliability.md, "Hostile input")."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from models.db import make_engine, make_session_factory, session_scope
from models.tokens import issue_token
from models.workspaces import create_workspace
from tests.support.processes import Ingress, wait_until

pytestmark = pytest.mark.e2e

PER_TOKEN, TOTAL, MCP_SECONDS, API_BODY = 2, 3, 1.5, 64 * 1024


@dataclass
class Caller:
    """The ingress's URL, a workspace, and three tokens that see it."""

    base: str
    workspace: int
    tokens: list[str]

    def headers(self, token: int = 0, **more: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[token]}", **more}


@pytest.fixture
def ingress(tmp_path: Path, sqlite_template: Path) -> Iterator[Caller]:
    path = tmp_path / "taskhook.db"
    shutil.copyfile(sqlite_template, path)
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    with session_scope(make_session_factory(engine)) as session:
        acme = create_workspace(session=session, slug="acme", name="Acme", task_prefix="ACME")
        tokens = [
            issue_token(session=session, name=f"t{n}", role="member", workspace_ids=[acme.id]).token
            for n in range(3)
        ]
        workspace = acme.id
    engine.dispose()
    server = Ingress(
        tmp_path,
        url,
        "filesystem://",
        TASKHOOK_BROKER_FOLDER=str(tmp_path / "broker"),
        TASKHOOK_MAX_EVENT_STREAMS_PER_TOKEN=str(PER_TOKEN),
        TASKHOOK_MAX_EVENT_STREAMS=str(TOTAL),
        TASKHOOK_MCP_STREAM_SECONDS=str(MCP_SECONDS),
        TASKHOOK_MAX_API_BODY_BYTES=str(API_BODY),
    )
    try:
        yield Caller(server.url, workspace, tokens)
    finally:
        server.stop()


def open_stream(stack: ExitStack, ingress: Caller, token: int) -> httpx.Response:
    """An event stream held open until ``stack`` closes (its first line read)."""
    client = stack.enter_context(httpx.Client(timeout=10))
    response = stack.enter_context(
        client.stream(
            "GET",
            f"{ingress.base}/api/v1/workspaces/{ingress.workspace}/events",
            params={"timeout": 30},
            headers=ingress.headers(token, Accept="text/event-stream"),
        )
    )
    if response.status_code == 200:
        lines = response.iter_lines()
        next(lines)  # "retry: 1000": the stream is open
        # Held until the stack closes: an abandoned line iterator closes its response.
        stack.callback(lines.close)
    return response


def test_event_streams_are_capped_per_token_and_in_all_with_a_429(ingress: Caller):
    with ExitStack() as held:
        first, second = (open_stream(held, ingress, token=0) for _ in range(PER_TOKEN))
        over_token = open_stream(held, ingress, token=0)
        other_token = open_stream(held, ingress, token=1)
        over_total = open_stream(held, ingress, token=2)

        assert (first.status_code, second.status_code, other_token.status_code) == (200,) * 3
        assert over_token.status_code == 429
        assert over_token.headers["retry-after"]
        over_token.read()
        assert f"this token has {PER_TOKEN} event streams open" in over_token.json()["error"]
        assert over_total.status_code == 429
        over_total.read()
        assert f"the ingress has {TOTAL} event streams open" in over_total.json()["error"]
        # The JSON page form is not a stream: it is never capped.
        page = httpx.get(
            f"{ingress.base}/api/v1/workspaces/{ingress.workspace}/events",
            headers=ingress.headers(0),
        )
        assert page.status_code == 200

    # Closed streams give their slots back.
    def slot_free() -> bool:
        with ExitStack() as again:
            return open_stream(again, ingress, token=0).status_code == 200

    wait_until(slot_free, timeout=10, what="a closed stream's slot to come back")


def test_the_mcp_get_stream_is_closed_after_its_lifetime(ingress: Caller):
    started = time.monotonic()
    with httpx.stream(
        "GET",
        f"{ingress.base}/mcp/",
        headers=ingress.headers(Accept="text/event-stream"),
        timeout=30,
    ) as response:
        body = b"".join(response.iter_bytes())
    lasted = time.monotonic() - started

    assert response.status_code == 200, body
    # Closed by the server, not by the client's 30 s timeout.
    assert lasted < MCP_SECONDS + 10, f"lasted {lasted:.1f}s"


def test_a_rest_body_over_the_limit_is_413_before_it_is_read(ingress: Caller):
    big = {"workspace_id": ingress.workspace, "title": "t", "description": "d" * API_BODY}
    response = httpx.post(f"{ingress.base}/api/v1/tasks", json=big, headers=ingress.headers())

    def chunks():
        yield b'{"workspace_id": 1, "title": "t", "description": "'
        for _ in range(API_BODY // 1024 + 1):
            yield b"d" * 1024
        yield b'"}'

    streamed = httpx.post(
        f"{ingress.base}/api/v1/tasks",
        content=chunks(),
        headers=ingress.headers(**{"Content-Type": "application/json"}),
    )
    within = httpx.post(
        f"{ingress.base}/api/v1/tasks",
        json={"workspace_id": ingress.workspace, "title": "t", "description": "d" * 1000},
        headers=ingress.headers(),
    )

    assert response.status_code == 413
    assert response.json() == {"error": f"request body over the {API_BODY}-byte limit"}
    assert streamed.status_code == 413
    assert within.status_code == 200, within.text


def test_a_chunked_mcp_body_over_the_limit_is_413_and_logged(ingress: Caller, tmp_path: Path):
    """No Content-Length: the limit is found as the body streams in. The MCP
    layer reads the body itself, and once answered it with a 500 and no line."""
    call = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "create_task",'

    def chunks():
        yield call + b' "arguments": {"title": "t", "description": "'
        for _ in range(API_BODY // 1024 + 1):
            yield b"d" * 1024
        yield b'"}}}'

    mcp_headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    response = httpx.post(
        f"{ingress.base}/mcp/", content=chunks(), headers=ingress.headers(**mcp_headers)
    )
    # The ingress still serves MCP calls within the limit.
    within = httpx.post(
        f"{ingress.base}/mcp/",
        content=call + b' "arguments": {"title": "t"}}}',
        headers=ingress.headers(**mcp_headers),
    )

    assert response.status_code == 413, response.text
    assert response.json() == {"error": f"request body over the {API_BODY}-byte limit"}
    assert within.status_code == 200, within.text
    assert within.json()["result"]["isError"] is False, within.text
    (log,) = tmp_path.glob("uvicorn-*.log")
    lines = log.read_text().splitlines()
    refused = [line for line in lines if "over the" in line and "/mcp/" in line]
    assert len(refused) == 1 and "POST" in refused[0], lines
    assert not [line for line in lines if "Error handling POST request" in line], lines


def test_a_rest_body_nested_too_deep_is_400(ingress: Caller):
    deep = '{"title":' + "[" * 10_000 + "]" * 10_000 + "}"
    response = httpx.post(
        f"{ingress.base}/api/v1/tasks",
        content=deep,
        headers=ingress.headers(**{"Content-Type": "application/json"}),
    )

    assert response.status_code == 400
    assert response.json() == {"error": "request body nested too deeply"}
