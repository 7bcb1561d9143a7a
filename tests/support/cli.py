"""The ``taskhook`` CLI against a test's store: run through click in process
(``taskhook``) or as a real process (``taskhook_process``), how a test reads
what it answered, and a fake Celery app (``FakeApp``) that records what a
command would send and answers as the operator worker would. The ``celery``
fixture that puts it in place is in tests/integration/cli/conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from models.broker.messages import IDEMPOTENCY_KEY_HEADER
from models.db import session_scope
from tests.support.redis_databases import machine_redis_url
from tests.support.scenarios import EXTERNAL_ID
from tests.support.stores import Store
from worker.cli import cli
from worker.operator import release_by_message

#: The public URL the commands print webhook URLs under.
PUBLIC_URL = "https://hooks.example.com"
RELEASE = ("release", "--workspace", "acme", EXTERNAL_ID)
ROOT = Path(__file__).resolve().parents[2]
#: The CLI tests' own Redis database (FLUSHDB before and after, never FLUSHALL).
REDIS_URL = machine_redis_url("TASKHOOK_TEST_CLI_REDIS_URL", "redis://127.0.0.1:6379/14")
BIN = Path(sys.executable).parent


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


def process_env(store: Store) -> dict[str, str]:
    return os.environ | {
        "TASKHOOK_DATABASE_URL": store.url,
        "TASKHOOK_BROKER_URL": REDIS_URL,
        "TASKHOOK_PUBLIC_URL": PUBLIC_URL,
    }


def taskhook_process(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "taskhook"), *args],
        cwd=ROOT,
        env=process_env(store),
        # An operator's script: nobody at a terminal answers a question.
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


class FakeResult:
    def __init__(self, answer: Callable[[], Any]) -> None:
        self._answer = answer
        self.waited: float | None = None

    def get(self, timeout: float) -> Any:
        self.waited = timeout
        return self._answer()


@dataclass
class FakeApp:
    """Records ``send_task`` calls; ``answer(*args)`` plays the worker's part."""

    answer: Callable[..., Any] = lambda *args: None
    broker_down: bool = False
    sent: list[tuple[str, list[Any], str]] = field(default_factory=list)
    #: The custom headers of each message sent (the Idempotency-Key's).
    headers: list[dict[str, Any]] = field(default_factory=list)
    results: list[FakeResult] = field(default_factory=list)

    def send_task(
        self, name: str, *, args: list[Any], queue: str, headers: dict[str, Any] | None = None
    ) -> FakeResult:
        if self.broker_down:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        self.sent.append((name, list(args), queue))
        self.headers.append(dict(headers or {}))
        # The header reaches an answer that reads it, as the worker's task does.
        key = (headers or {}).get(IDEMPOTENCY_KEY_HEADER)
        reads_key = getattr(self.answer, "reads_idempotency_key", False)
        result = FakeResult(
            lambda: self.answer(*args, **({"idempotency_key": key} if reads_key else {}))
        )
        self.results.append(result)
        return result


def operator_worker(store: Store) -> Callable[..., dict[str, Any]]:
    """What the operator task does with the message's arguments: the operator
    worker's own function, in one unit of work on the store."""

    def release_identity_task(
        workspace_id, external_id, operator, reason, expected_task_id=None, idempotency_key=None
    ):
        with session_scope(store.sessions) as session:
            return release_by_message(
                session=session,
                workspace_id=workspace_id,
                external_id=external_id,
                operator=operator,
                reason=reason,
                expected_task_id=expected_task_id,
                idempotency_key=idempotency_key,
            )

    release_identity_task.reads_idempotency_key = True
    return release_identity_task


def held_by(store: Store, external_id: str = EXTERNAL_ID) -> object:
    return store.scalar("SELECT identifier FROM tasks WHERE external_id = :e", e=external_id)
