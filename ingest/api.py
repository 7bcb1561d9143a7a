"""The REST surface of the external-ID contract: create, lookup, release, and
the plain task routes.

Order of checks on every route (docs/contract.md, "Request ordering"): the
token (401), then the caller's access to the workspace -- a workspace it may
not see answers exactly like one that does not exist (404) -- then validation
(400), then the lookup. A caller without access learns nothing about which
identities exist there.

No route maps the task store's errors itself: they reach the caller through
``ingest.rest.domain_error_response``. The create route alone names its own
words for a hidden workspace ("task not created").
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from ingest.rest import (
    MAX_ID,
    TASK_NOT_CREATED,
    ApiError,
    Authenticated,
    Id,
    error_responses,
    hidden_workspace_says,
    in_session,
    require_access,
)
from ingest.schemas import CreatedTask, FoundTask, TaskCreate, TaskPage, TaskPatch, TaskRead
from models import idempotency, retry_safe
from models.errors import TaskNotFound
from models.idempotency import task_revision
from models.identities import names_shown
from models.tables import Task
from models.tasks import (
    NewTask,
    create_task,
    find_task_by_external_id,
    get_task,
    list_tasks,
    update_task,
)
from models.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["tasks"], responses=error_responses(400, 401, 503))


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _first_problem(error: ValidationError) -> str:
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"]) or "body"
    return f"{where}: {problem['msg']}"


# --- retries of the changes that are not a create (docs/contract.md, "Retries of
# everything that is not a create") ----------------------------------------------------

IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Any unique text (a UUID) naming this change. A retry with the same key "
        "and the same request gets the first answer back and changes nothing again "
        "(`Idempotent-Replayed: true`); the same key with another request gets 409. Kept "
        "for TASKHOOK_IDEMPOTENCY_WINDOW_HOURS (24), after which it is a new request.",
    ),
]
IfMatchHeader = Annotated[
    str | None,
    Header(
        alias="If-Match",
        description="The task's revision as its ETag gave it (GET /tasks/{task_id}): when "
        "the task changed since, nothing is done and the answer is 412.",
    ),
]
#: Says a response is the replay of an earlier one under the same key.
REPLAYED = "Idempotent-Replayed"


def _retry(request: Request, principal: Principal, key: str | None) -> idempotency.Retry:
    hours = request.app.state.runtime.settings.idempotency_window_hours
    return idempotency.Retry.of(
        idempotency.token_actor(principal.token_id), key, window=timedelta(hours=hours)
    )


def _replayed(response: Response, replayed: bool) -> Response:
    if replayed:
        response.headers[REPLAYED] = "true"
    return response


# --- create and the identity routes ---------------------------------------------------


@router.post(
    "/tasks",
    response_model=CreatedTask,
    responses=error_responses(400, 404, 409),
    dependencies=[hidden_workspace_says(TASK_NOT_CREATED)],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": TaskCreate.model_json_schema()}},
        }
    },
    summary="Create a task, or return the one that already holds its external_id",
)
async def create(request: Request, principal: Authenticated) -> CreatedTask:
    """Create-if-absent: with an ``external_id`` that a task in the workspace
    already holds, nothing is created and that task comes back with
    ``deduplicated: true``. Every answer carries ``deduplicated`` and
    ``creation_complete``."""
    body = await _json_object(request)
    workspace_id = body.get("workspace_id")
    if type(workspace_id) is not int:
        raise ApiError(400, "workspace_id: an integer is required")
    # Authorization precedes any external-ID work.
    require_access(principal, workspace_id)
    try:
        fields = TaskCreate.model_validate(body)
    except ValidationError as error:
        raise ApiError(400, _first_problem(error)) from None

    def work(session: Session) -> CreatedTask:
        result = create_task(
            session=session,
            caller=principal.caller,
            workspace_id=workspace_id,
            new=NewTask(
                title=fields.title,
                description=fields.description,
                external_id=fields.external_id,
            ),
        )
        return CreatedTask.of(
            result.task,
            names_shown(session, [result.task.id])[result.task.id],
            deduplicated=result.outcome.deduplicated,
            creation_complete=result.outcome.creation_complete,
        )

    # A TaskNotFound here: someone deleted the task before this create settled.
    return await run_in_threadpool(in_session, request, work)


BY_EXTERNAL_ID = "/workspaces/{workspace_id}/tasks/by-external-id"
ExternalIdQuery = Annotated[str | None, Query(description="The external id (required).")]

#: Query parameters a request must send, though the route declares them
#: optional: the route itself answers their absence with 400 and its own
#: error body, after the token and the workspace access are checked
#: (docs/contract.md, "Request ordering"). The OpenAPI document marks them
#: required, so generated clients send them (ingest.app).
REQUIRED_QUERY_PARAMETERS = {
    (router.prefix + BY_EXTERNAL_ID, "get"): {"external_id"},
    (router.prefix + BY_EXTERNAL_ID, "delete"): {"external_id", "reason"},
}


@router.get(
    BY_EXTERNAL_ID,
    response_model=FoundTask,
    responses=error_responses(400, 404),
    summary="Find the task that answers to an external_id, held or as an alias (read-only)",
)
def lookup(
    request: Request,
    principal: Authenticated,
    workspace_id: Id,
    external_id: ExternalIdQuery = None,
) -> FoundTask:
    """The task holding ``external_id`` -- archived and unsettled ones included --
    or the task it is an alias of (a name the item had before a move, or that
    an operator merged into it), with ``creation_complete`` and its ``names``.
    Never creates anything. A caller that wants to
    recover after a long absence should look up first and create only on 404."""
    require_access(principal, workspace_id)

    def work(session: Session) -> FoundTask:
        task = find_task_by_external_id(
            session=session,
            caller=principal.caller,
            workspace_id=workspace_id,
            external_id=external_id,
        )
        if task is None:
            raise TaskNotFound()
        return FoundTask.of(
            task,
            names_shown(session, [task.id])[task.id],
            creation_complete=task.external_id_settled_at is not None,
        )

    return in_session(request, work)


@router.delete(
    BY_EXTERNAL_ID,
    status_code=204,
    responses=error_responses(400, 403, 404, 409),
    summary="Release an external_id (operator role): the task stays, the identity is freed",
)
def release(
    request: Request,
    principal: Authenticated,
    workspace_id: Id,
    external_id: ExternalIdQuery = None,
    reason: Annotated[
        str | None, Query(description="Why the identity is released (required; audited).")
    ] = None,
    expected_task_id: Annotated[
        int | None,
        Query(
            ge=1,
            le=MAX_ID,
            description="The task id the caller expects to hold the identity. When another "
            "task holds it, nothing is released and the answer is 409, naming the holder.",
        ),
    ] = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response:
    """Sets the holder's external_id and its settlement to null and writes an
    audit row naming the token. Release is for an identity a person has
    determined is abandoned -- never an automatic answer to
    ``creation_complete: false``. Send ``expected_task_id`` with the holder
    you looked at, so that a task that claimed the identity since is never
    freed by mistake. With an ``Idempotency-Key``, a retry after the release
    committed answers 204 again, even though the identity is free (or held by
    a newer task) by then."""
    require_access(principal, workspace_id)
    if not principal.is_operator:
        raise ApiError(403, "releasing an external_id needs an operator token")
    retry = _retry(request, principal, idempotency_key)

    def work(session: Session) -> bool:
        return retry_safe.release(
            session=session,
            caller=principal.caller,
            workspace_id=workspace_id,
            external_id=external_id,
            operator=principal.name,
            reason=reason or "",
            expected_task_id=expected_task_id,
            retry=retry,
        ).replayed

    return _replayed(Response(status_code=204), in_session(request, work))


# --- plain task routes ------------------------------------------------------------------


def _read(session: Session, task: Task) -> TaskRead:
    """``task`` with its names (docs/contract.md §15, item 9)."""
    return TaskRead.of(task, names_shown(session, [task.id])[task.id])


def _revised(session: Session, task: Task) -> tuple[TaskRead, str]:
    return _read(session, task), task_revision(task)


@router.get("/tasks/{task_id}", response_model=TaskRead, responses=error_responses(404))
def read_task(
    request: Request, response: Response, principal: Authenticated, task_id: Id
) -> TaskRead:
    """The task; its ``ETag`` header is its revision, for ``If-Match``."""
    read, revision = in_session(
        request,
        lambda s: _revised(s, get_task(session=s, caller=principal.caller, task_id=task_id)),
    )
    response.headers["ETag"] = revision
    return read


@router.get(
    "/workspaces/{workspace_id}/tasks", response_model=TaskPage, responses=error_responses(404)
)
def read_tasks(
    request: Request,
    principal: Authenticated,
    workspace_id: Id,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    after: Annotated[
        int, Query(ge=0, le=MAX_ID, description="Return tasks with ids above this.")
    ] = 0,
) -> TaskPage:
    require_access(principal, workspace_id)

    def work(session: Session) -> TaskPage:
        tasks = list_tasks(
            session=session,
            caller=principal.caller,
            workspace_id=workspace_id,
            limit=limit,
            after=after,
        )
        names = names_shown(session, [task.id for task in tasks])
        return TaskPage(
            tasks=[TaskRead.of(task, names[task.id]) for task in tasks],
            next_after=tasks[-1].id if len(tasks) == limit else None,
        )

    return in_session(request, work)


@router.patch(
    "/tasks/{task_id}",
    response_model=TaskRead,
    responses=error_responses(400, 404),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": TaskPatch.model_json_schema()}},
        }
    },
)
async def edit_task(request: Request, principal: Authenticated, task_id: Id) -> TaskRead:
    """Change the title or the description. ``external_id`` is not accepted: it
    is set once, at create."""
    body = await _json_object(request)
    if "external_id" in body:
        raise ApiError(400, "external_id cannot be changed; it is set once, at create")
    try:
        patch = TaskPatch.model_validate(body)
    except ValidationError as error:
        raise ApiError(400, _first_problem(error)) from None

    def work(session: Session) -> TaskRead:
        task = update_task(
            session=session,
            caller=principal.caller,
            task_id=task_id,
            title=patch.title,
            description=patch.description,
            clear_description="description" in body and patch.description is None,
        )
        return _read(session, task)

    return await run_in_threadpool(in_session, request, work)


@router.post(
    "/tasks/{task_id}/archive", response_model=TaskRead, responses=error_responses(404, 409, 412)
)
def archive(
    request: Request,
    response: Response,
    principal: Authenticated,
    task_id: Id,
    idempotency_key: IdempotencyKeyHeader = None,
    if_match: IfMatchHeader = None,
) -> TaskRead:
    """Archive the task. It keeps its external_id: a retried create still finds it.
    The answer is the task as it is now, with its new ``ETag``."""
    retry = _retry(request, principal, idempotency_key)

    def work(session: Session) -> tuple[TaskRead, str, bool]:
        task, receipt = retry_safe.archive(
            session=session,
            caller=principal.caller,
            task_id=task_id,
            if_match=if_match,
            retry=retry,
        )
        return *_revised(session, task), receipt.replayed

    read, revision, replayed = in_session(request, work)
    response.headers["ETag"] = revision
    _replayed(response, replayed)
    return read


@router.delete("/tasks/{task_id}", status_code=204, responses=error_responses(403, 404, 409, 412))
def delete(
    request: Request,
    principal: Authenticated,
    task_id: Id,
    idempotency_key: IdempotencyKeyHeader = None,
    if_match: IfMatchHeader = None,
) -> Response:
    """Delete the task. Its external_id is free again: a later create makes a new task.
    Audited (the token's name and role, the time, the identity freed). A
    workspace may reserve deletes to operators: a member token then gets 403
    and nothing is deleted. With an ``Idempotency-Key``, a retry after the
    delete committed answers 204 again, not 404."""
    retry = _retry(request, principal, idempotency_key)

    def work(session: Session) -> bool:
        return retry_safe.delete(
            session=session,
            caller=principal.caller,
            task_id=task_id,
            if_match=if_match,
            retry=retry,
        ).replayed

    return _replayed(Response(status_code=204), in_session(request, work))
