"""The ``taskhook`` CLI run through click, in process, against a test's store,
and how a test reads what it answered."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner, Result

from tests.support.stores import Store
from worker.cli import cli

#: The public URL the commands print webhook URLs under.
PUBLIC_URL = "https://hooks.example.com"


def taskhook(store_or_url: Store | str, *args: str, input: str | None = None) -> Result:
    """Run one ``taskhook`` command against the store, as a fresh process would."""
    url = store_or_url if isinstance(store_or_url, str) else store_or_url.url
    runner = CliRunner(env={"TASKHOOK_DATABASE_URL": url, "TASKHOOK_PUBLIC_URL": PUBLIC_URL})
    result = runner.invoke(cli, list(args), input=input)
    # Whatever the user got wrong, a command ends with an exit code, never a traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def refused(result: Result, exit_code: int = 1) -> str:
    """The one-line error of a refused command."""
    assert result.exit_code == exit_code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def usage_error(result: Result) -> str:
    """The error line of a usage error: exit 2, click's usage, then one line."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.stderr
    return result.stderr.strip().splitlines()[-1]


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)
