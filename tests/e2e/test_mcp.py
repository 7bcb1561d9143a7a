"""The MCP create_task tool through a real MCP client session from the SDK,
over stdio (``taskhook mcp`` as a subprocess) and over streamable HTTP (a real
uvicorn serving the ingress), on a SQLite store."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from models.db import make_engine, make_session_factory, session_scope
from models.tokens import issue_token
from models.workspaces import create_workspace
from tests.support.processes import READY_TIMEOUT, ROOT, WorkerProcess, free_port, wait_until

pytestmark = pytest.mark.e2e


@dataclass
class Store:
    url: str
    one_workspace_token: str  # sees acme only
    two_workspace_token: str  # sees acme and globex
    outsider_token: str  # sees globex only
    acme: int
    globex: int

    def settle_nothing(self) -> None:
        """Make every task look unsettled (its create 'had not finished')."""
        engine = make_engine(self.url)
        with engine.begin() as connection:
            connection.exec_driver_sql("UPDATE tasks SET external_id_settled_at = NULL")
        engine.dispose()


@pytest.fixture
def store(tmp_path: Path, sqlite_template: Path) -> Store:
    path = tmp_path / "taskhook.db"
    shutil.copyfile(sqlite_template, path)
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    with session_scope(make_session_factory(engine)) as session:
        acme = create_workspace(session=session, slug="acme", name="Acme", task_prefix="ACME")
        globex = create_workspace(session=session, slug="globex", name="Globex", task_prefix="GLX")
        tokens = [
            issue_token(session=session, name=name, role="member", workspace_ids=ids).token
            for name, ids in (
                ("one", [acme.id]),
                ("two", [acme.id, globex.id]),
                ("outsider", [globex.id]),
            )
        ]
        ids = acme.id, globex.id
    engine.dispose()
    return Store(url, *tokens, *ids)


def environment(store: Store, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TASKHOOK_")}
    return env | {"TASKHOOK_DATABASE_URL": store.url} | extra


@pytest.fixture
def http_url(store: Store, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    args = [sys.executable, "-m", "ingest.server", "--port", str(port)]
    server = WorkerProcess("uvicorn", tmp_path / "uvicorn.log", args, environment(store))
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, timeout=READY_TIMEOUT, what="uvicorn", logs=[server])
        yield f"{base}/mcp/"
    finally:
        server.stop()


def stdio_client(store: Store, token: str) -> Client:
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-m", "worker.cli", "mcp"],
        env=environment(store, TASKHOOK_MCP_TOKEN=token),
        cwd=str(ROOT),
    )
    return Client(parameters)


def http_client(url: str, token: str):
    headers = {"Authorization": f"Bearer {token}"}
    transport = streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers))
    return Client(transport)


def run(scenario) -> None:
    async def bounded():
        with anyio.fail_after(60):
            await scenario()

    anyio.run(bounded)


def result_of(call) -> dict:
    assert not call.is_error, call.content
    return json.loads(call.content[0].text)


def error_of(call) -> str:
    assert call.is_error
    return call.content[0].text


async def check_the_whole_contract(client: Client, store: Store) -> None:
    assert client.server_info.name == "taskhook"
    assert client.server_info.version == importlib.metadata.version("taskhook")
    tools = (await client.list_tools()).tools
    assert [tool.name for tool in tools] == ["create_task"]  # no lookup, no release
    described = tools[0].description
    assert "create-if-absent, not a lookup" in described
    assert "Never call it just to check" in described
    assert "nothing was created" in described
    assert "do not release the identity and create again" in described
    assert "UUID you generated" in described and "replay exactly the arguments" in described
    assert {"title", "external_id", "workspace_id"} <= set(tools[0].input_schema["properties"])

    arguments = {"title": "Fix the login page", "external_id": "jira:PROJ-1"}
    created = result_of(await client.call_tool("create_task", arguments))
    assert (created["deduplicated"], created["creation_complete"]) == (False, True)
    assert (created["external_id"], created["workspace_id"]) == ("jira:PROJ-1", store.acme)

    replay = result_of(await client.call_tool("create_task", arguments))
    assert (replay["id"], replay["deduplicated"], replay["creation_complete"]) == (
        created["id"],
        True,
        True,
    )

    store.settle_nothing()
    unsettled = result_of(await client.call_tool("create_task", arguments))
    assert (unsettled["deduplicated"], unsettled["creation_complete"]) == (True, False)

    invalid = await client.call_tool("create_task", {"title": "t", "external_id": "bad\n"})
    assert "control characters" in error_of(invalid)

    # The title check comes before any store call: a replay without a title
    # is a validation error, not a Found outcome.
    for no_title in ({"external_id": "jira:PROJ-1"}, {"title": " ", "external_id": "jira:PROJ-1"}):
        assert (await client.call_tool("create_task", no_title)).is_error

    elsewhere = await client.call_tool(
        "create_task", {"title": "t", "external_id": "x", "workspace_id": store.globex}
    )
    assert f"workspace {store.globex} not found" in error_of(elsewhere)


def test_over_stdio(store: Store):
    async def scenario():
        async with stdio_client(store, store.one_workspace_token) as client:
            await check_the_whole_contract(client, store)

    run(scenario)


def test_over_http(store: Store, http_url: str):
    async def scenario():
        async with http_client(http_url, store.one_workspace_token) as client:
            await check_the_whole_contract(client, store)

    run(scenario)


def test_a_token_seeing_several_workspaces_must_name_one(store: Store, http_url: str):
    async def scenario():
        async with http_client(http_url, store.two_workspace_token) as client:
            refused = await client.call_tool("create_task", {"title": "t"})
            assert "workspace_id is required" in error_of(refused)
            assert "acme" in error_of(refused) and "globex" in error_of(refused)
            chosen = await client.call_tool(
                "create_task", {"title": "t", "workspace_id": store.globex}
            )
            assert result_of(chosen)["workspace_id"] == store.globex

    run(scenario)


def test_http_without_a_valid_token_is_refused_before_mcp(store: Store, http_url: str):
    for headers in ({}, {"Authorization": "Bearer th_nope"}):
        answer = httpx.post(
            http_url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers
        )
        assert answer.status_code == 401


def test_stdio_refuses_an_invalid_token(store: Store):
    import subprocess

    started = subprocess.run(
        [sys.executable, "-m", "worker.cli", "mcp"],
        cwd=ROOT,
        env=environment(store, TASKHOOK_MCP_TOKEN="th_nope"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert started.returncode == 1
    assert "invalid or revoked token" in started.stderr
