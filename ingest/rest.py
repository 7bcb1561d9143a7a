"""What every REST route shares: bearer-token authentication, workspace
access, the error shape, and one unit of work per request.

The domain's errors reach the caller through one table, :data:`STATUS_OF_KIND`
(``ingest.app`` registers :func:`domain_error_response` for every
``TaskStoreError``): a route raises or lets through the store's own error and
never maps it itself. What a route may say differently is only its words for
a workspace the caller may not see (:func:`hidden_workspace_says`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Path, Request
from fastapi.params import Depends as Dependency
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from ingest.runtime import IngressRuntime
from ingest.schemas import ErrorBody
from models.console_sessions import SignedIn, signed_in
from models.db import session_scope
from models.errors import ErrorKind, TaskStoreError, WorkspaceNotAccessible
from models.tables import MAX_ROW_ID
from models.tokens import Principal, authenticate

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Ids are 32-bit integers in the database; a larger one can name nothing.
MAX_ID = MAX_ROW_ID
Id = Annotated[int, Path(ge=1, le=MAX_ID)]

TASK_NOT_CREATED = "task not created"
TASK_NOT_FOUND = "task not found"
UNAVAILABLE = "temporarily unavailable; retry later"

#: Each kind of domain error as a REST status: the REST surface's one table.
STATUS_OF_KIND: dict[ErrorKind, int] = {
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.INVALID: 400,
    ErrorKind.CONFLICT: 409,
    ErrorKind.FORBIDDEN: 403,
    # Not the caller's to fix: answered like any failure of the service, so
    # the caller retries once an operator has fixed the workspace.
    ErrorKind.MISCONFIGURED: 503,
    # HTTP's own answer to an If-Match that no longer matches (RFC 9110 §13.1.1).
    ErrorKind.STALE: 412,
}


class ApiError(Exception):
    def __init__(self, status: int, error: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.headers = dict(headers or {})
        if status == 401:
            self.headers.setdefault("WWW-Authenticate", "Bearer")


def api_error_response(error: ApiError) -> JSONResponse:
    return JSONResponse({"error": error.error}, status_code=error.status, headers=error.headers)


def domain_error_response(request: Request, error: TaskStoreError) -> JSONResponse:
    """The answer to a domain error: its kind's status, and ``str(error)``
    except where the contract wants other words."""
    status = STATUS_OF_KIND[error.kind]
    if isinstance(error, WorkspaceNotAccessible):
        # The route's words, not the store's "workspace N not found": a hidden
        # workspace answers exactly like a missing one, whichever check saw it.
        return api_error_response(ApiError(status, _hidden_workspace_answer(request)))
    if status == 503:
        log.error("%s %s refused: %s", request.method, request.url.path, error)
        retry_after = request.app.state.runtime.settings.retry_after_seconds
        return api_error_response(
            ApiError(status, UNAVAILABLE, headers={"Retry-After": str(retry_after)})
        )
    return api_error_response(ApiError(status, str(error)))


def hidden_workspace_says(wording: str) -> Dependency:
    """A route's dependency naming its 404 words for a workspace the caller
    may not see (:data:`TASK_NOT_FOUND` unless a route says otherwise)."""

    def record(request: Request) -> None:
        request.state.hidden_workspace_answer = wording

    return Depends(record)


def _hidden_workspace_answer(request: Request) -> str:
    return getattr(request.state, "hidden_workspace_answer", TASK_NOT_FOUND)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody} for status in statuses}


_bearer = HTTPBearer(auto_error=False, description="A token from `taskhook token add`.")


def current_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None:
        raise ApiError(401, "missing bearer token")
    runtime: IngressRuntime = request.app.state.runtime
    with runtime.store_errors(), session_scope(runtime.sessions) as session:
        principal = authenticate(session=session, token=credentials.credentials)
    if principal is None:
        raise ApiError(401, "invalid or revoked token")
    return principal


Authenticated = Annotated[Principal, Depends(current_principal)]


def browser_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """A bearer token, or else a console session's cookie: for the read-only
    routes a browser's EventSource calls, which cannot send a header. Never
    for a route that changes anything (a cookie rides along on cross-site
    requests where a header does not)."""
    if credentials is not None:
        return current_principal(request, credentials)
    user = console_session_of(request)
    if user is None:
        raise ApiError(401, "missing bearer token (or console session)")
    return user.principal


BrowserAuthenticated = Annotated[Principal, Depends(browser_principal)]

#: The console's session cookie (ingest.console.auth sets it at sign-in).
SESSION_COOKIE = "taskhook_session"


def console_session_of(request: Request) -> SignedIn | None:
    """The console session whose cookie the request carries, if it is live."""
    key = request.cookies.get(SESSION_COOKIE)
    if not key:
        return None
    runtime: IngressRuntime = request.app.state.runtime
    with runtime.store_errors(), session_scope(runtime.sessions) as session:
        return signed_in(session=session, key=key)


def in_session(request: Request, work: Callable[[Session], T]) -> T:
    """Run ``work`` in one unit of work; database failures become a 503."""
    runtime: IngressRuntime = request.app.state.runtime
    with runtime.store_errors(), session_scope(runtime.sessions) as session:
        return work(session)


def require_access(principal: Principal, workspace_id: int) -> None:
    """A workspace the caller may not see answers like one that does not exist
    (the store's own check raises the same error)."""
    if not principal.caller.may_access(workspace_id):
        raise WorkspaceNotAccessible(workspace_id)
