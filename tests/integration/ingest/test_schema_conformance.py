"""schemathesis against the ingress in-process (ASGI), with real tokens: no
input gets a 5xx, and every answer matches what /openapi.json promises."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ingest.app import create_app
from models.db import make_engine, make_session_factory, session_scope
from models.settings import Settings
from models.tasks import NewTask, create_task
from models.tokens import issue_token
from models.workspaces import create_workspace
from tests.support.stores import TRUSTED

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


# Which operations to exercise: read from the app's own document (no database needed).
OPERATIONS = [
    (method.upper(), path)
    for path, methods in create_app().openapi()["paths"].items()
    if path.startswith("/api/")
    for method in methods
]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path):
    """The ASGI app on a SQLite store with a workspace, tasks and an operator token."""
    path = tmp_path_factory.mktemp("schemathesis") / "taskhook.db"
    shutil.copyfile(sqlite_template, path)
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    with session_scope(sessions) as session:
        workspace = create_workspace(session=session, slug="acme", name="Acme", task_prefix="ACME")
        token = issue_token(
            session=session, name="fuzz", role="operator", workspace_ids=[workspace.id]
        ).token
    with sessions() as session:
        for n in range(3):  # something for reads, archives and deletes to find
            create_task(
                session=session,
                caller=TRUSTED,
                workspace_id=workspace.id,
                new=NewTask(title=f"task {n}", external_id=f"jira:PROJ-{n}"),
            )
    engine.dispose()
    app = create_app(Settings(database_url=url), publish=lambda keys, lane: None)
    return schemathesis.openapi.from_asgi("/openapi.json", app), token


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_the_api_matches_its_schema_and_never_fails_with_5xx(api, method, path):
    schema, token = api
    operation = schema[path][method]

    @given(case=operation.as_strategy())
    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    def exercise(case):
        case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, checks=CHECKS)

    exercise()
