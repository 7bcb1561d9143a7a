"""``taskhook mcp``: the MCP server on stdio, for a local coding agent."""

from __future__ import annotations

import anyio
import click

from models.db import make_session_factory
from models.tokens import authenticate
from worker.cli.runtime import CommandRuntime, Refused, pass_runtime


@click.command("mcp")
@click.option(
    "--token",
    envvar="TASKHOOK_MCP_TOKEN",
    required=True,
    help="The API token the agent acts as [env TASKHOOK_MCP_TOKEN].",
)
@pass_runtime
def mcp(runtime: CommandRuntime, token: str) -> None:
    """Serve the create_task tool over stdio (MCP), as the token's principal.

    Point an agent's MCP configuration at `taskhook mcp` with TASKHOOK_MCP_TOKEN
    set; over HTTP the same tool is at the ingress's /mcp/ with a bearer token.
    """
    from ingest.mcp import build_mcp_server  # the MCP SDK loads only for this command

    with runtime.session() as session:
        principal = authenticate(session=session, token=token)
    if principal is None:
        raise Refused("invalid or revoked token (taskhook token list)")
    sessions = make_session_factory(runtime.engine)
    server = build_mcp_server(sessions=lambda: sessions, principal_of=lambda ctx: principal)
    anyio.run(server.run_stdio_async)
