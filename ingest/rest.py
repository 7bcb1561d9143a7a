"""What every REST route shares: bearer-token authentication, workspace
access, the error shape, and one unit of work per request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Path, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from ingest.runtime import IngressRuntime
from ingest.schemas import ErrorBody
from models.db import session_scope
from models.tables import MAX_ROW_ID
from models.tokens import Principal, authenticate

T = TypeVar("T")

#: Ids are 32-bit integers in the database; a larger one can name nothing.
MAX_ID = MAX_ROW_ID
Id = Annotated[int, Path(ge=1, le=MAX_ID)]

TASK_NOT_CREATED = "task not created"
TASK_NOT_FOUND = "task not found"


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
    with runtime.store_errors(), runtime.sessions() as session:
        principal = authenticate(session=session, token=credentials.credentials)
    if principal is None:
        raise ApiError(401, "invalid or revoked token")
    return principal


Authenticated = Annotated[Principal, Depends(current_principal)]


def in_session(request: Request, work: Callable[[Session], T]) -> T:
    """Run ``work`` in one unit of work; database failures become a 503."""
    runtime: IngressRuntime = request.app.state.runtime
    with runtime.store_errors(), session_scope(runtime.sessions) as session:
        return work(session)


def require_access(principal: Principal, workspace_id: int, not_found: str) -> None:
    """A workspace the caller may not see answers like one that does not exist."""
    if not principal.caller.may_access(workspace_id):
        raise ApiError(404, not_found)
