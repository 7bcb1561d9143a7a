"""The MCP server: one tool, ``create_task``, through which coding agents create
tasks idempotently.

Two transports, one tool. ``taskhook mcp`` serves it on stdio for a local
agent, as the principal of the token it was started with. The ingress mounts
it at ``/mcp`` (streamable HTTP), behind the same bearer tokens as the REST
API: :class:`BearerGuard` answers 401 before the MCP layer sees a request,
and hands the token's principal to the tool through the request scope.

There is deliberately no release tool and no lookup tool: an agent reaching
for an identity is reaching for the task, and releasing is an operator's
decision, never an agent's (docs/contract.md, "Outcomes" and "Release").
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Receive, Scope, Send

from ingest.schemas import CreatedTask
from models.db import session_scope
from models.errors import TaskNotFound, TaskStoreError, WorkspaceNotAccessible
from models.identities import names_shown
from models.tables import Workspace
from models.tasks import NewTask, create_task
from models.tokens import Principal, authenticate

#: Where BearerGuard leaves the caller for the tool to find.
PRINCIPAL_SCOPE_KEY = "taskhook.principal"

CREATE_TASK_DESCRIPTION = """\
Create a task in a taskhook workspace, or get back the task that already holds \
your external_id.

This CREATES the task when nothing holds the identity yet: it is create-if-absent, \
not a lookup. Never call it just to check whether a task exists.

external_id: a stable identifier from your own system: an issue key \
(jira:PROJ-1234), a webhook delivery id, or a UUID you generated before the first \
call. Creating a task twice with the same external_id in the same workspace returns \
the first task instead of making a duplicate, so pass one whenever a retry or a \
restart could run this call again, and on a retry replay exactly the arguments you \
sent the first time.

The result is the task as JSON with external_id, names, deduplicated and creation_complete \
(names: every name the task answers to; a create under any of them returns this task):
- deduplicated: true means the task already existed and nothing was created; do not \
report that you created something new.
- deduplicated: true together with creation_complete: false means another create \
claimed this identity and had not finished when observed, and may still be in \
progress. Do not assume the task is ready, and do not release the identity and \
create again.
creation_complete says only whether that create finished its required setup; it \
does not mean the task is done or that anyone is working on it.

workspace_id may be left out when your token sees exactly one workspace."""

Sessions = Callable[[], sessionmaker[Session]]
PrincipalOf = Callable[[Context], Principal | None]


def build_mcp_server(*, sessions: Sessions, principal_of: PrincipalOf) -> MCPServer:
    """The MCP server with its one tool. ``sessions`` gives the store;
    ``principal_of`` names the caller of a tool call (None: not authenticated)."""
    # The SDK puts a rich-traceback handler on the root logger when a server
    # is built; taskhook's processes keep their own logging (a rendered
    # traceback on the event loop stalls every request behind it).
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    server = MCPServer(
        name="taskhook",
        version=importlib.metadata.version("taskhook"),
        instructions="Create tasks idempotently with create_task and a stable external_id.",
    )
    root.handlers[:] = handlers
    root.setLevel(level)

    @server.tool(name="create_task", description=CREATE_TASK_DESCRIPTION)
    async def create_task_tool(
        title: Annotated[str, Field(description="What the task is about (required).")],
        ctx: Context,
        external_id: Annotated[
            str | None,
            Field(description="Your stable identifier for this task; see the description."),
        ] = None,
        workspace_id: Annotated[
            int | None, Field(description="The workspace; optional with a single workspace.")
        ] = None,
        description: Annotated[str | None, Field(description="Details for the task.")] = None,
    ) -> dict[str, Any]:
        # The title check runs before any store call: a replay without a title
        # gets this error, not a Found outcome.
        if not title.strip():
            raise ToolError("title is required")
        principal = principal_of(ctx)
        if principal is None:
            raise ToolError("not authenticated: send a taskhook API token")
        return await anyio.to_thread.run_sync(
            _create,
            sessions(),
            principal,
            workspace_id,
            NewTask(title=title, description=description, external_id=external_id),
        )

    return server


def _create(
    sessions: sessionmaker[Session],
    principal: Principal,
    workspace_id: int | None,
    new: NewTask,
) -> dict[str, Any]:
    # One unit of work; the create sequence commits its own steps inside it
    # (docs/architecture.md, "Who commits").
    with session_scope(sessions) as session:
        workspace_id = _effective_workspace(session, principal, workspace_id)
        with tool_errors(workspace_id):
            result = create_task(
                session=session, caller=principal.caller, workspace_id=workspace_id, new=new
            )
        # Its names, the aliases too: a create under one is Found on the task.
        names = names_shown(session, [result.task.id])[result.task.id]
        return CreatedTask.of(
            result.task,
            names,
            deduplicated=result.outcome.deduplicated,
            creation_complete=result.outcome.creation_complete,
        ).model_dump(mode="json")


@contextmanager
def tool_errors(workspace_id: int) -> Iterator[None]:
    """The MCP surface's one translation: a domain error becomes the tool
    error an agent reads, whatever its kind."""
    try:
        yield
    except WorkspaceNotAccessible:
        raise ToolError(f"workspace {workspace_id} not found") from None
    except TaskNotFound:  # the tool only creates: someone deleted the task meanwhile
        raise ToolError("the task was deleted before its creation finished") from None
    except TaskStoreError as error:
        raise ToolError(str(error)) from None


def _effective_workspace(session: Session, principal: Principal, workspace_id: int | None) -> int:
    """The explicit workspace, else the only one the token sees; otherwise a
    clear error naming the choices."""
    if workspace_id is not None:
        return workspace_id
    visible = principal.caller.workspace_ids
    query = select(Workspace.id, Workspace.slug).order_by(Workspace.id)
    if visible is not None:
        query = query.where(Workspace.id.in_(visible))
    choices = session.execute(query).all()
    if len(choices) == 1:
        return choices[0].id
    named = ", ".join(f"{row.id} ({row.slug})" for row in choices) or "none"
    raise ToolError(f"workspace_id is required: this token sees workspaces {named}")


def principal_from_scope(ctx: Context) -> Principal | None:
    """The principal BearerGuard put on the HTTP request that carried this call."""
    request = ctx.request_context.request
    return None if request is None else request.scope.get(PRINCIPAL_SCOPE_KEY)


class BearerGuard:
    """ASGI middleware: only requests with a valid API token reach the MCP app."""

    def __init__(self, app: ASGIApp, sessions: Sessions) -> None:
        self.app = app
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        principal = None
        if scheme.lower() == "bearer" and token.strip():
            principal = await anyio.to_thread.run_sync(self._authenticate, token.strip())
        if principal is None:
            await _unauthorized(send)
            return
        scope[PRINCIPAL_SCOPE_KEY] = principal
        await self.app(scope, receive, send)

    def _authenticate(self, token: str) -> Principal | None:
        with session_scope(self.sessions()) as session:
            return authenticate(session=session, token=token)


async def _unauthorized(send: Send) -> None:
    body = json.dumps({"error": "missing, invalid or revoked bearer token"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"www-authenticate", b"Bearer"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
