"""One error vocabulary: every domain error lives in ``models.errors`` with
one kind, and each surface maps kinds to answers once -- REST
(``ingest.rest.STATUS_OF_KIND``), MCP (``ingest.mcp.tool_errors``), the CLI
(``worker.cli.runtime.TaskhookGroup``); and the webhook routes a refused
delivery's kind (``ingest.webhooks.ANSWER_OF_REFUSAL``)."""

from __future__ import annotations

import importlib
import pkgutil

import click
import pytest
from click.testing import CliRunner
from mcp.server.mcpserver.exceptions import ToolError

import models
from ingest.mcp import tool_errors
from ingest.rest import STATUS_OF_KIND
from ingest.webhooks import ANSWER_OF_REFUSAL
from models.errors import (
    ErrorKind,
    RefusalKind,
    TaskNotFound,
    TaskStoreError,
    WorkspaceNotAccessible,
)
from tests.support.domain_errors import SAMPLES
from worker.cli.runtime import TaskhookGroup


def _every_models_module_imported() -> None:
    for module in pkgutil.walk_packages(models.__path__, prefix="models."):
        importlib.import_module(module.name)


def _domain_errors() -> set[type[TaskStoreError]]:
    _every_models_module_imported()
    found, pending = set(), [TaskStoreError]
    while pending:
        for subclass in pending.pop().__subclasses__():
            found.add(subclass)
            pending.append(subclass)
    return found


def test_every_domain_error_lives_in_models_errors():
    assert {error.__module__ for error in _domain_errors()} == {"models.errors"}


def test_every_domain_error_has_one_kind():
    # The base names none, so a new error cannot inherit one by accident.
    assert "kind" not in vars(TaskStoreError)
    for error in _domain_errors():
        assert isinstance(error.kind, ErrorKind), error


def test_the_samples_cover_every_domain_error():
    assert set(SAMPLES) == _domain_errors()


def test_the_older_bases_stay_for_callers_that_catch_them():
    # ``except ValueError`` (worker.cli.params.checked_by) and ``except
    # LookupError`` keep catching what they caught before the errors moved.
    for error in _domain_errors():
        if error.kind is ErrorKind.INVALID:
            assert issubclass(error, ValueError), error
        if error.kind is ErrorKind.NOT_FOUND:
            assert issubclass(error, LookupError), error


def test_the_rest_table_answers_every_kind():
    assert set(STATUS_OF_KIND) == set(ErrorKind)
    assert STATUS_OF_KIND == {
        ErrorKind.NOT_FOUND: 404,
        ErrorKind.INVALID: 400,
        ErrorKind.CONFLICT: 409,
        ErrorKind.FORBIDDEN: 403,
        ErrorKind.MISCONFIGURED: 503,
        ErrorKind.STALE: 412,
    }


def test_the_webhook_routes_answer_every_refusal_kind():
    # The statuses the ingress answered before the refusals moved to the
    # domain, and the metrics' results; each is pinned end to end by
    # tests/integration/ingest and tests/reliability/test_08_bad_input.py.
    assert ANSWER_OF_REFUSAL == {
        RefusalKind.MALFORMED: (400, "bad_request"),
        RefusalKind.UNSUPPORTED_CONTENT_TYPE: (415, "unsupported_media_type"),
        RefusalKind.TOO_OLD: (400, "too_old"),
    }


def _tool_error_of(error: TaskStoreError) -> str:
    with pytest.raises(ToolError) as raised, tool_errors(workspace_id=7):
        raise error
    return str(raised.value)


@pytest.mark.parametrize("error", SAMPLES.values(), ids=lambda error: type(error).__name__)
def test_mcp_turns_every_domain_error_into_a_tool_error(error):
    expected = {
        WorkspaceNotAccessible: "workspace 7 not found",
        TaskNotFound: "the task was deleted before its creation finished",
    }.get(type(error), str(error))
    assert _tool_error_of(error) == expected


def test_mcp_lets_other_errors_through():
    with pytest.raises(KeyError), tool_errors(workspace_id=7):
        raise KeyError("not a domain error")


@pytest.mark.parametrize("error", SAMPLES.values(), ids=lambda error: type(error).__name__)
def test_the_cli_refuses_every_domain_error_in_one_line_with_exit_1(error):
    @click.group(cls=TaskhookGroup)
    def root() -> None:
        pass

    @root.command()
    def fails() -> None:
        raise error

    result = CliRunner().invoke(root, ["fails"])
    assert (result.exit_code, result.output) == (1, f"Error: {error}\n")
