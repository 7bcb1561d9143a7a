"""``taskhook release``: what it shows, asks and sends to the operator worker
(the fake app of tests/support/cli.py plays the worker), and how it ends when
the worker or the broker does not answer."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from celery.exceptions import TimeoutError as CeleryTimeout

from models.broker.messages import OPERATOR_QUEUE, RELEASE_IDENTITY
from models.db import session_scope
from models.tasks import NewTask, create_task, release_external_id
from tests.support.cli import (
    BIN,
    RELEASE,
    ROOT,
    as_json,
    held_by,
    operator_worker,
    process_env,
    refused,
    taskhook,
    usage_error,
)
from tests.support.scenarios import EXTERNAL_ID, an_unfinished_create
from tests.support.stores import TRUSTED, Store
from worker import cli as cli_module
from worker.cli import EXIT_NO_ANSWER


def test_release_sends_the_operator_task_and_prints_what_was_released(store: Store, celery):
    workspace_id, task_id, _, parked = an_unfinished_create(store)
    celery.answer = operator_worker(store)

    result = taskhook(
        store,
        *RELEASE,
        "--reason",
        "worker died",
        "--operator",
        "alice",
        "--yes",
        "--timeout",
        "7",
    )

    assert result.exit_code == 0, result.output
    # The fifth argument is the holder it showed: only that task may be released.
    assert celery.sent == [
        (
            RELEASE_IDENTITY,
            [workspace_id, EXTERNAL_ID, "alice", "worker died", task_id],
            OPERATOR_QUEUE,
        )
    ]
    # --timeout bounds the whole command: what sending took is not waited again.
    assert 6 < celery.results[0].waited <= 7
    assert f"Released '{EXTERNAL_ID}' from ACME-1 (task {task_id})" in result.stdout
    assert f"taskhook deliveries replay {parked}" in result.stdout
    assert held_by(store) is None
    assert store.scalar("SELECT operator FROM identity_releases") == "alice"


def test_release_asks_first_and_a_no_sends_nothing(store: Store, celery):
    an_unfinished_create(store)
    celery.answer = operator_worker(store)
    args = (*RELEASE, "--reason", "dead", "--operator", "al")

    declined = taskhook(store, *args, input="n\n")
    assert declined.exit_code == 1
    assert "Release it? [y/N]" in declined.stdout
    assert celery.sent == []
    assert held_by(store) == "ACME-1"

    accepted = taskhook(store, *args, input="y\n")
    assert accepted.exit_code == 0
    assert held_by(store) is None


def test_release_defaults_the_operator_to_the_os_user(store: Store, celery, monkeypatch):
    an_unfinished_create(store)
    monkeypatch.setattr(cli_module.getpass, "getuser", lambda: "ops-bob")
    celery.answer = operator_worker(store)
    taskhook(store, *RELEASE, "--reason", "r", "--yes")
    assert celery.sent[0][1][2] == "ops-bob"


def test_release_without_an_answer_says_the_operator_worker_is_missing(store: Store, celery):
    an_unfinished_create(store)

    def no_worker(*_args):
        raise CeleryTimeout("The operation timed out.")

    celery.answer = no_worker
    result = taskhook(
        store,
        *RELEASE,
        "--reason",
        "r",
        "--yes",
        "--timeout",
        "0.5",
    )

    line = refused(result, EXIT_NO_ANSWER)
    assert "the operator worker did not answer within 0.5s" in line
    assert "operator worker running" in line
    assert held_by(store) == "ACME-1"


def test_release_refused_by_the_worker_exits_non_zero(store: Store, celery):
    an_unfinished_create(store)
    celery.answer = lambda *args: {"released": False, "error": "task not found"}
    line = refused(taskhook(store, *RELEASE, "--reason", "r", "--yes"))
    assert line == "Error: not released: task not found"


def test_release_whose_operator_task_raised_is_refused_without_a_traceback(store: Store, celery):
    an_unfinished_create(store)

    def crashed(*_args):
        raise RuntimeError("database is locked")

    celery.answer = crashed
    line = refused(taskhook(store, *RELEASE, "--reason", "r", "--yes"))
    assert line == "Error: not released: RuntimeError: database is locked"


def test_release_of_an_identity_nobody_holds_sends_nothing(store: Store, celery):
    store.workspace()
    result = taskhook(
        store, "release", "--workspace", "acme", "jira:NOPE-1", "--reason", "r", "--yes"
    )
    assert "no task in workspace acme holds" in refused(result)
    assert celery.sent == []


def test_release_with_the_broker_down_releases_nothing(store: Store, celery):
    an_unfinished_create(store)
    celery.broker_down = True
    result = taskhook(store, *RELEASE, "--reason", "r", "--yes")
    assert "cannot reach the broker" in refused(result)
    assert held_by(store) == "ACME-1"


def test_release_for_scripts_prints_only_json_on_stdout(store: Store, celery):
    _, task_id, _, parked = an_unfinished_create(store)
    celery.answer = operator_worker(store)

    document = as_json(taskhook(store, *RELEASE, "--reason", "r", "--yes", "--json"))

    assert document["released"] is True
    assert (document["task_id"], document["identifier"]) == (task_id, "ACME-1")
    assert document["needs_operator_deliveries"] == [parked]


def test_release_needs_a_reason_and_rejects_an_invalid_external_id(store: Store, celery):
    an_unfinished_create(store)
    blank = taskhook(store, *RELEASE, "--reason", "  ", "--yes")
    missing = taskhook(store, *RELEASE, "--yes")
    invalid = taskhook(store, "release", "--workspace", "acme", "a\x7fb", "--reason", "r", "--yes")
    assert (blank.exit_code, missing.exit_code) == (2, 2)
    assert "control characters" in refused(invalid)
    assert celery.sent == []


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--reason", "x" * 100_000, "the reason must be at most 1000 characters (got 100000)"),
        (
            "--reason",
            "worker died\x1b[2J",
            "the reason must be one line without control characters (U+001B at position 11)",
        ),
        ("--reason", "line one\nline two", "(U+000A at position 8)"),
        ("--operator", "o" * 201, "the operator must be at most 200 characters (got 201)"),
        ("--operator", "al\x07ice", "the operator must be one line without control characters"),
    ],
)
def test_release_refuses_what_the_audit_cannot_keep_before_showing_anything(
    store: Store, celery, option, value, says
):
    an_unfinished_create(store)
    given = {"--reason": "worker died", "--operator": "alice"} | {option: value}

    result = taskhook(store, *RELEASE, *(part for pair in given.items() for part in pair), "--yes")

    line = usage_error(result)
    assert line.startswith(f"Error: Invalid value for '{option}': ")
    assert says in line
    assert result.stdout == ""
    assert celery.sent == []
    assert held_by(store) == "ACME-1"


def test_release_sends_the_reason_and_operator_as_the_audit_keeps_them(store: Store, celery):
    an_unfinished_create(store)
    celery.answer = operator_worker(store)

    taskhook(store, *RELEASE, "--reason", "  worker died  ", "--operator", " alice ", "--yes")

    assert celery.sent[0][1][2:4] == ["alice", "worker died"]
    assert store.scalar("SELECT reason FROM identity_releases") == "worker died"


def test_release_without_a_terminal_says_to_pass_yes(store: Store, celery):
    an_unfinished_create(store)

    # No input: the prompt meets the end of a stdin that is not a terminal.
    line = usage_error(taskhook(store, *RELEASE, "--reason", "worker died"))

    assert line == (
        "Error: 'Release it?' got no answer (stdin is not a terminal): "
        "pass --yes to release without asking"
    )
    assert celery.sent == []
    assert held_by(store) == "ACME-1"


def test_release_frees_only_the_holder_it_showed(store: Store, celery):
    workspace_id, task_id, _, _ = an_unfinished_create(store)
    operator = operator_worker(store)

    def another_task_took_the_identity_meanwhile(*args):
        # While the request waited in the queue: released by someone else,
        # and a new create made ACME-2 with the same external id.
        with session_scope(store.sessions) as session:
            release_external_id(
                session=session,
                workspace_id=workspace_id,
                external_id=EXTERNAL_ID,
                operator="bob",
                reason="bob's release",
            )
        with session_scope(store.sessions) as session:
            create_task(
                session=session,
                caller=TRUSTED,
                workspace_id=workspace_id,
                new=NewTask(title="Login page is blank", external_id=EXTERNAL_ID),
            )
        return operator(*args)

    celery.answer = another_task_took_the_identity_meanwhile
    line = refused(taskhook(store, *RELEASE, "--reason", "worker died", "--yes"))

    assert celery.sent[0][1][4] == task_id
    assert line == (
        f"Error: not released: the identity is held by task ACME-2 (id {task_id + 1}), not by "
        f"the expected task ACME-1 (id {task_id}); nothing was released. Look again before "
        "anything else: "
        f"taskhook task lookup --workspace acme '{EXTERNAL_ID}'"
    )
    assert held_by(store) == "ACME-2"
    assert store.scalar("SELECT count(*) FROM identity_releases") == 1


@contextmanager
def a_broker_that_is_down(how: str) -> Iterator[str]:
    """A Redis URL nothing answers at: a closed port, or a port whose listener
    never accepts (a frozen server: connections hang instead of failing)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        if how == "frozen":
            listener.listen(64)
            yield f"redis://127.0.0.1:{port}/0"
            return
    yield f"redis://127.0.0.1:{port}/0"  # closed: nothing listens on the port any more


@pytest.mark.parametrize("how", ["closed", "frozen"])
def test_release_with_the_broker_down_ends_within_its_timeout(store: Store, how):
    an_unfinished_create(store)
    timeout = 3.0

    def release_within(seconds: float) -> tuple[subprocess.CompletedProcess, float]:
        started = time.monotonic()
        result = subprocess.run(
            [str(BIN / "taskhook"), *RELEASE, "--reason", "r", "--yes", "--timeout", str(seconds)],
            cwd=ROOT,
            env=process_env(store) | {"TASKHOOK_BROKER_URL": broker_url},
            capture_output=True,
            text=True,
            timeout=120,
        )
        return result, time.monotonic() - started

    with a_broker_that_is_down(how) as broker_url:
        # The same command with next to no time to wait: the process's own
        # start and imports, as slow as this machine is right now.
        _, start = release_within(0.01)
        result, took = release_within(timeout)

    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"Error: cannot reach the broker at {broker_url}: ")
    assert "nothing was released" in result.stderr
    assert took < start + timeout + 1.5, f"took {took:.1f}s, of which {start:.1f}s to start"
    assert held_by(store) == "ACME-1"
