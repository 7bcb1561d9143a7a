"""The ``taskhook`` CLI against real databases (SQLite and PostgreSQL), through click.

Commands that send a Celery message (``release``, ``deliveries replay``,
``deliveries replay-matching``) get a fake app through
``worker.cli.runtime.load_celery_app``: it records what would be sent and answers as
the operator worker would, running the real service function against the
same database. The round trip through a real broker and
a real operator worker belongs to the end-to-end tests.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import TimeoutError as CeleryTimeout
from sqlalchemy import update

from bench.fakes.github_api import FakeGitHub
from bench.fakes.jira_api import FakeJira
from models.broker.messages import (
    DELIVERIES_QUEUE,
    OPERATOR_QUEUE,
    PROCESS_DELIVERIES,
    PROCESS_DELIVERY,
    RELEASE_IDENTITY,
)
from models.db import session_scope
from models.inbox import DeliveryStatus
from models.sources import add_source, verifying_source
from models.tables import CatchUpSource, Delivery, utcnow
from models.tasks import CreateHooks, NewTask, create_task, release_external_id
from models.tokens import authenticate
from tests.support.cli import PUBLIC_URL, as_json, refused, taskhook, usage_error
from tests.support.deliveries import FIXTURES
from tests.support.scenarios import (
    EXTERNAL_ID,
    SECRET,
    Crash,
    a_delivery,
    a_source,
    create_by,
    park,
    settle_as,
)
from tests.support.stores import TRUSTED, Store
from worker import cli as cli_module
from worker.cli import EXIT_NO_ANSWER
from worker.cli import runtime as cli_runtime
from worker.operator import release_identity as operator_release

RELEASE = ("release", "--workspace", "acme", EXTERNAL_ID)
ROOT = Path(__file__).resolve().parents[2]


# --- a fake Celery app ----------------------------------------------------------------------


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
    results: list[FakeResult] = field(default_factory=list)

    def send_task(self, name: str, *, args: list[Any], queue: str) -> FakeResult:
        if self.broker_down:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        self.sent.append((name, list(args), queue))
        result = FakeResult(lambda: self.answer(*args))
        self.results.append(result)
        return result


@pytest.fixture
def celery(monkeypatch: pytest.MonkeyPatch) -> FakeApp:
    app = FakeApp()
    monkeypatch.setattr(cli_runtime, "load_celery_app", lambda: app)
    return app


def operator_worker(store: Store) -> Callable[..., dict[str, Any]]:
    """What the operator task does with the message's arguments: the operator
    worker's own function, in one unit of work on the store."""

    def release_identity_task(workspace_id, external_id, operator, reason, expected_task_id=None):
        with session_scope(store.sessions) as session:
            return operator_release(
                session=session,
                workspace_id=workspace_id,
                external_id=external_id,
                operator=operator,
                reason=reason,
                expected_task_id=expected_task_id,
            )

    return release_identity_task


def held_by(store: Store, external_id: str = EXTERNAL_ID) -> object:
    return store.scalar("SELECT identifier FROM tasks WHERE external_id = :e", e=external_id)


# --- db -------------------------------------------------------------------------------------


def test_db_upgrade_migrates_a_fresh_sqlite_file_and_is_safe_to_repeat(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'var' / 'fresh.db'}"

    first = taskhook(url, "db", "upgrade")
    again = as_json(taskhook(url, "db", "upgrade", "--json"))

    assert first.exit_code == 0
    assert "is at revision" in first.stdout
    assert again["revision"]
    assert (
        taskhook(url, "workspace", "add", "acme", "--name", "Acme", "--prefix", "ACME").exit_code
        == 0
    )


def test_db_upgrade_of_a_migrated_store_changes_nothing(store: Store):
    store.workspace()
    assert taskhook(store, "db", "upgrade").exit_code == 0
    assert store.scalar("SELECT count(*) FROM workspaces") == 1


def test_a_database_without_tables_says_to_upgrade(tmp_path: Path):
    line = refused(taskhook(f"sqlite:///{tmp_path / 'empty.db'}", "stats"))
    assert "taskhook db upgrade" in line


def test_an_unreachable_database_is_one_clear_line():
    url = "postgresql+psycopg://postgres:hunter2@127.0.0.1:1/taskhook"
    line = refused(taskhook(url, "workspace", "list"))
    assert line.startswith("Error: cannot use the database at postgresql+psycopg://postgres:***@")
    assert "hunter2" not in line


def test_importing_the_cli_builds_nothing():
    code = (
        "import sys, worker.cli; "
        "assert 'worker.celery_app' not in sys.modules; "
        "assert 'celery' not in sys.modules; "
        "assert 'alembic' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# --- workspaces -------------------------------------------------------------------------------


def test_workspace_add_then_list_for_people_and_for_scripts(store: Store):
    added = taskhook(store, "workspace", "add", "acme", "--name", "Acme Corp", "--prefix", "ACME")
    taskhook(store, "workspace", "add", "beta", "--name", "Beta", "--prefix", "BETA", "--json")

    assert added.exit_code == 0
    assert "ACME-1" in added.stdout
    table = taskhook(store, "workspace", "list").stdout.splitlines()
    assert table[0].split() == ["SLUG", "NAME", "PREFIX", "TASKS", "SOURCES", "CREATED"]
    assert table[1].startswith("acme  Acme Corp  ACME")
    listed = as_json(taskhook(store, "workspace", "list", "--json"))["workspaces"]
    assert [(w["slug"], w["task_prefix"], w["tasks"]) for w in listed] == [
        ("acme", "ACME", 0),
        ("beta", "BETA", 0),
    ]


def test_workspace_add_sets_the_intake_wip_limit(store: Store):
    taskhook(store, "workspace", "add", "acme", "--name", "A", "--prefix", "A", "--wip-limit", "3")
    assert store.scalar("SELECT wip_limit FROM workflow_steps WHERE position = 0") == 3
    assert store.scalar("SELECT count(*) FROM workflow_steps") == 3


def test_a_duplicate_workspace_slug_is_refused(store: Store):
    store.workspace("acme")
    line = refused(taskhook(store, "workspace", "add", "acme", "--name", "A", "--prefix", "ACME"))
    assert line == "Error: a workspace with slug 'acme' already exists"


#: Every option or argument whose value the models would refuse, by command:
#: each is a usage error (exit 2, as docs/runbook.md says), caught before
#: anything is stored.
INVALID_VALUES = {
    "workspace slug": (("workspace", "add", "Bad Slug", "--name", "A", "--prefix", "A"), "SLUG"),
    "workspace name": (("workspace", "add", "beta", "--name", " ", "--prefix", "A"), "--name"),
    "workspace prefix": (("workspace", "add", "beta", "--name", "A", "--prefix", "a"), "--prefix"),
    "wip limit": (
        ("workspace", "add", "beta", "--name", "A", "--prefix", "A", "--wip-limit", "-1"),
        "--wip-limit",
    ),
    "source name": (("source", "add", "github", "--workspace", "acme", "--name", "A!"), "--name"),
    "source secret": (
        ("source", "add", "github", "--workspace", "acme", "--name", "b", "--secret", " "),
        "--secret",
    ),
    "rotated secret": (("source", "rotate-secret", "acme-github", "--secret", "  "), "--secret"),
    "token name": (("token", "add", "--workspace", "acme", "--name", "a\x01b"), "--name"),
}


@pytest.mark.parametrize("case", sorted(INVALID_VALUES))
def test_an_invalid_value_is_a_usage_error_and_stores_nothing(store: Store, case: str):
    a_source(store, store.workspace().id)  # acme-github
    command, parameter = INVALID_VALUES[case]
    counts = "SELECT (SELECT count(*) FROM workspaces) + (SELECT count(*) FROM webhook_sources)"
    counts += " + (SELECT count(*) FROM source_secrets) + (SELECT count(*) FROM api_tokens)"
    before = store.scalar(counts)

    line = usage_error(taskhook(store, *command))

    assert line.startswith(f"Error: Invalid value for '{parameter}': ")
    assert store.scalar(counts) == before


# --- demo -------------------------------------------------------------------------------------


def test_demo_setup_for_the_run_command_touches_only_the_embedded_database(store: Store):
    embedded = store.dialect == "sqlite"

    first = as_json(taskhook(store, "demo", "setup", "--embedded-only", "--json"))
    said = taskhook(store, "demo", "setup", "--embedded-only").stdout

    assert first["created"] is embedded
    assert store.scalar("SELECT count(*) FROM workspaces") == (1 if embedded else 0)
    assert store.scalar("SELECT count(*) FROM webhook_sources") == (2 if embedded else 0)
    if embedded:
        assert "existing workspaces kept" in said
    else:
        assert said.startswith("==> no demo workspace on postgresql+psycopg://")
        assert "ask for one with `taskhook demo setup`" in said


def test_demo_setup_asked_for_by_name_works_on_any_database(store: Store):
    document = as_json(taskhook(store, "demo", "setup", "--json"))

    assert document["created"] is True
    assert [s["url"] for s in document["sources"]] == [
        f"{PUBLIC_URL}/webhooks/github/demo-github",
        f"{PUBLIC_URL}/webhooks/jira/demo-jira",
    ]


# --- sources ----------------------------------------------------------------------------------


def test_source_add_prints_the_url_and_a_generated_secret_once(store: Store):
    store.workspace()

    result = taskhook(store, "source", "add", "github", "--workspace", "acme")

    assert result.exit_code == 0
    assert f"{PUBLIC_URL}/webhooks/github/acme-github" in result.stdout
    assert "will not be shown again" in result.stdout
    (secret_line,) = [line for line in result.stdout.splitlines() if line.startswith("Secret:")]
    printed = secret_line.split()[-1]
    with store.sessions() as session:
        source = verifying_source(session=session, provider="github", slug="acme-github")
    assert source.secrets == (printed,)
    assert source.create_events == {"issues.opened", "pull_request.opened"}
    assert printed not in taskhook(store, "source", "list").output
    assert printed not in taskhook(store, "source", "list", "--json").output


def test_a_given_secret_is_never_printed(store: Store):
    store.workspace()
    given = "s3cret-from-the-vault"

    result = taskhook(
        store,
        "source",
        "add",
        "jira",
        "--workspace",
        "acme",
        "--secret",
        given,
        "--site",
        "https://acme.atlassian.net/",
        "--name",
        "acme-jira",
    )
    document = as_json(
        taskhook(
            store, "source", "add", "github", "--workspace", "acme", "--secret", given, "--json"
        )
    )

    assert result.exit_code == 0
    assert given not in result.output
    assert "secret" not in document
    assert document["url"] == f"{PUBLIC_URL}/webhooks/github/acme-github"
    with store.sessions() as session:
        jira = verifying_source(session=session, provider="jira", slug="acme-jira")
    assert (jira.secrets, jira.site_url, jira.create_events) == (
        (given,),
        "https://acme.atlassian.net",
        {"jira:issue_created"},
    )


def test_source_add_for_scripts_carries_a_generated_secret(store: Store):
    store.workspace()
    document = as_json(taskhook(store, "source", "add", "jira", "--workspace", "acme", "--json"))
    with store.sessions() as session:
        jira = verifying_source(session=session, provider="jira", slug="acme-jira")
    assert jira.secrets == (document["secret"],)
    assert document["events"] == ["jira:issue_created"]


def test_source_events_are_validated_against_the_adapter(store: Store):
    store.workspace()
    unknown = taskhook(
        store, "source", "add", "jira", "--workspace", "acme", "--events", "issues.opened"
    )
    chosen = taskhook(
        store,
        "source",
        "add",
        "github",
        "--workspace",
        "acme",
        "--events",
        "issues.opened, issues.reopened",
    )

    assert unknown.exit_code == 2
    assert "jira:issue_created" in unknown.stderr
    assert chosen.exit_code == 0
    with store.sessions() as session:
        github = verifying_source(session=session, provider="github", slug="acme-github")
    assert github.create_events == {"issues.opened", "issues.reopened"}


def test_source_add_mistakes(store: Store):
    store.workspace()
    no_workspace = refused(taskhook(store, "source", "add", "github", "--workspace", "nope"))
    site_on_github = taskhook(
        store, "source", "add", "github", "--workspace", "acme", "--site", "https://x.example"
    )
    bad_site = taskhook(store, "source", "add", "jira", "--workspace", "acme", "--site", "acme")
    unknown_provider = taskhook(store, "source", "add", "bitbucket", "--workspace", "acme")
    taskhook(store, "source", "add", "github", "--workspace", "acme")
    duplicate = refused(taskhook(store, "source", "add", "github", "--workspace", "acme"))

    assert no_workspace == "Error: workspace 'nope' not found"
    assert (site_on_github.exit_code, bad_site.exit_code, unknown_provider.exit_code) == (2, 2, 2)
    assert duplicate == "Error: a source named 'acme-github' already exists"
    assert store.scalar("SELECT count(*) FROM webhook_sources") == 1


def test_source_list_shows_active_secret_counts_never_secrets(store: Store):
    a_source(store, store.workspace().id)
    taskhook(store, "source", "rotate-secret", "acme-github")

    table = taskhook(store, "source", "list")
    listed = as_json(taskhook(store, "source", "list", "--json"))["sources"]

    assert table.stdout.splitlines()[0].split() == [
        "NAME",
        "PROVIDER",
        "WORKSPACE",
        "ENABLED",
        "SECRETS",
        "EVENTS",
        "URL",
    ]
    assert table.stdout.splitlines()[1].split()[:5] == ["acme-github", "github", "acme", "yes", "2"]
    assert SECRET not in table.output + json.dumps(listed)
    assert [(s["slug"], s["active_secrets"], s["url"]) for s in listed] == [
        ("acme-github", 2, f"{PUBLIC_URL}/webhooks/github/acme-github")
    ]


def test_a_source_disables_and_enables(store: Store):
    a_source(store, store.workspace().id)

    assert taskhook(store, "source", "disable", "acme-github").exit_code == 0
    with store.sessions() as session:
        assert verifying_source(session=session, provider="github", slug="acme-github") is None
    assert taskhook(store, "source", "enable", "acme-github").exit_code == 0
    with store.sessions() as session:
        assert verifying_source(session=session, provider="github", slug="acme-github")
    line = refused(taskhook(store, "source", "disable", "nope"))
    assert line == "Error: no webhook source named 'nope'"


def test_rotating_a_secret_keeps_the_old_one_until_finish(store: Store):
    a_source(store, store.workspace().id)

    started = taskhook(store, "source", "rotate-secret", "acme-github", "--secret", "new-one")
    with store.sessions() as session:
        during = verifying_source(session=session, provider="github", slug="acme-github")
    finished = as_json(
        taskhook(store, "source", "rotate-secret", "acme-github", "--finish", "--json")
    )
    with store.sessions() as session:
        after = verifying_source(session=session, provider="github", slug="acme-github")

    assert started.exit_code == 0
    assert "new-one" not in started.output
    assert sorted(during.secrets) == sorted([SECRET, "new-one"])
    assert finished == {"source": "acme-github", "retired": 1}
    assert after.secrets == ("new-one",)


def test_a_generated_rotation_secret_is_printed_once_and_verifies(store: Store):
    a_source(store, store.workspace().id)
    document = as_json(taskhook(store, "source", "rotate-secret", "acme-github", "--json"))
    with store.sessions() as session:
        source = verifying_source(session=session, provider="github", slug="acme-github")
    assert document["secret"] in source.secrets


def test_rotate_secret_mistakes(store: Store):
    a_source(store, store.workspace().id)
    both = taskhook(store, "source", "rotate-secret", "acme-github", "--finish", "--secret", "x")
    assert both.exit_code == 2
    assert refused(taskhook(store, "source", "rotate-secret", "nope")).endswith("'nope'")


# --- tasks and identities -------------------------------------------------------------------


def a_settled_task(store: Store) -> tuple[int, int, int]:
    """A task created by delivery d-1, then found again by delivery d-2."""
    acme = store.workspace()
    source_id = a_source(store, acme.id)
    first = a_delivery(store, source_id, "d-1")
    task_id = create_by(store, acme.id, first)
    second = a_delivery(store, source_id, "d-2")
    settle_as(store, second, DeliveryStatus.DONE, outcome="found_settled", task_id=task_id)
    return task_id, first, second


def an_unfinished_create(store: Store) -> tuple[int, int, int, int]:
    """Delivery d-1's worker died after its insert; d-2 is parked as needs_operator."""
    acme = store.workspace()
    source_id = a_source(store, acme.id)
    creator = a_delivery(store, source_id, "d-1")
    task_id = create_by(store, acme.id, creator, crash_before_settle=True)
    parked = a_delivery(store, source_id, "d-2")
    park(store, parked, task_id)
    return acme.id, task_id, creator, parked


def test_task_lookup_shows_the_task_and_the_deliveries_that_touched_it(store: Store):
    task_id, first, second = a_settled_task(store)

    result = taskhook(store, "task", "lookup", "--workspace", "acme", EXTERNAL_ID)
    document = as_json(
        taskhook(store, "task", "lookup", "--workspace", "acme", EXTERNAL_ID, "--json")
    )

    assert result.exit_code == 0
    assert "ACME-1  Login page is blank" in result.stdout
    assert "settled at" in result.stdout
    assert "archived     no" in result.stdout
    rows = [
        line.split()
        for line in result.stdout.splitlines()
        if line.split()[:1] in ([str(first)], [str(second)])
    ]
    # RECEIVED is a date and a time: STATUS is the sixth word, OUTCOME the eighth.
    assert [(row[0], row[5], row[7]) for row in rows] == [
        (str(first), "done", "created"),
        (str(second), "done", "found_settled"),
    ]
    assert (
        document["task"].items()
        >= {
            "id": task_id,
            "identifier": "ACME-1",
            "external_id": EXTERNAL_ID,
            "settled": True,
            "archived": False,
        }.items()
    )
    assert [d["id"] for d in document["deliveries"]] == [first, second]


def set_creator(store: Store, creator: int, state: str) -> None:
    """Put the creating delivery in ``state``: live, expired (its worker died), queued, dead."""
    now = utcnow()
    values = {
        "live": {"status": "processing", "lease_expires_at": now + timedelta(minutes=1)},
        "expired": {"status": "processing", "lease_expires_at": now - timedelta(minutes=1)},
        "queued": {"status": "queued", "lease_expires_at": None},
        "dead": {"status": "dead", "lease_expires_at": None, "last_error": "db gone"},
    }[state]
    with session_scope(store.sessions) as session:
        session.execute(update(Delivery).where(Delivery.id == creator).values(**values))


@pytest.mark.parametrize(
    ("state", "advice"),
    [
        ("live", "delivery 1 is being processed now (attempt 1, lease until"),
        ("expired", "delivery 1's worker stopped (its lease ran out at"),
        ("queued", "delivery 1 is queued: when it runs it finishes its own create"),
        ("dead", "then `taskhook deliveries replay 1` finishes its own create"),
    ],
)
def test_task_lookup_says_what_an_unfinished_create_is_doing(store: Store, state, advice):
    _, _, creator, _ = an_unfinished_create(store)
    set_creator(store, creator, state)

    result = taskhook(store, "task", "lookup", "--workspace", "acme", EXTERNAL_ID)

    assert "NOT SETTLED: its create had not finished when looked at" in result.stdout
    assert advice in " ".join(result.stdout.split())
    assert "needs_operator" in result.stdout


def test_a_task_created_through_the_api_has_no_creator_to_wait_for(store: Store):
    acme = store.workspace()

    def client_died(_task):
        raise Crash()

    with store.sessions() as session, pytest.raises(Crash):
        create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=acme.id,
            new=NewTask(title="From a script", external_id=EXTERNAL_ID),
            hooks=CreateHooks(after_insert=client_died),
        )

    lookup = taskhook(store, "task", "lookup", "--workspace", "acme", EXTERNAL_ID)
    preview = taskhook(store, *RELEASE, "--reason", "client gone", input="n\n")

    assert "created outside the webhooks (REST API)" in " ".join(lookup.stdout.split())
    assert "No delivery touched it" in lookup.stdout
    assert "WARNING" not in preview.stdout


def test_release_warns_when_the_create_may_still_finish(store: Store, celery):
    _, _, creator, _ = an_unfinished_create(store)
    set_creator(store, creator, "live")
    live = taskhook(store, *RELEASE, "--reason", "r", input="n\n")
    set_creator(store, creator, "dead")
    dead = taskhook(store, *RELEASE, "--reason", "r", input="n\n")

    assert "WARNING: its create may still finish on its own" in live.stdout
    assert "WARNING" not in dead.stdout
    assert "creates a NEW task" in dead.stdout
    assert celery.sent == []


def test_release_of_a_settled_task_says_it_makes_a_second_task(store: Store, celery):
    a_settled_task(store)
    preview = taskhook(store, *RELEASE, "--reason", "r", input="n\n")
    assert "Its create FINISHED" in preview.stdout
    assert "SECOND task" in preview.stdout


def test_task_lookup_refuses_what_it_cannot_find_in_one_line(store: Store):
    store.workspace()
    missing = refused(taskhook(store, "task", "lookup", "--workspace", "acme", "jira:NOPE-1"))
    invalid = refused(taskhook(store, "task", "lookup", "--workspace", "acme", "jira:PROJ-1\t"))
    workspace = refused(taskhook(store, "task", "lookup", "--workspace", "nope", "jira:PROJ-1"))
    too_long = refused(taskhook(store, "task", "lookup", "--workspace", "acme", "x" * 256))

    assert missing == "Error: no task in workspace acme holds external id 'jira:NOPE-1'"
    assert invalid == (
        "Error: external_id must not contain control characters (U+0009 at position 11)"
    )
    assert workspace == "Error: workspace 'nope' not found"
    assert "at most 255 bytes" in too_long


def test_task_lookup_and_explain_take_a_task_identifier_too(store: Store):
    task_id, first, second = a_settled_task(store)

    shown = taskhook(store, "task", "lookup", "--workspace", "acme", "ACME-1")
    document = as_json(taskhook(store, "task", "lookup", "--workspace", "acme", "ACME-1", "--json"))
    explained = as_json(taskhook(store, "explain", "--workspace", "acme", "ACME-1", "--json"))

    assert shown.exit_code == 0, shown.output
    assert "ACME-1  Login page is blank" in shown.stdout
    assert f"external id  {EXTERNAL_ID}" in shown.stdout
    assert (document["external_id"], document["task"]["id"]) == (EXTERNAL_ID, task_id)
    assert [d["id"] for d in document["deliveries"]] == [first, second]
    assert (explained["external_id"], explained["holder"]["id"]) == (EXTERNAL_ID, task_id)


def test_an_external_id_wins_over_a_task_identifier_of_the_same_name(store: Store):
    a_settled_task(store)  # ACME-1 holds EXTERNAL_ID
    with session_scope(store.sessions) as session:
        create_task(
            session=session,
            caller=TRUSTED,
            workspace_id=store.scalar("SELECT id FROM workspaces"),
            new=NewTask(title="Named like a task", external_id="ACME-1"),
        )

    document = as_json(taskhook(store, "task", "lookup", "--workspace", "acme", "ACME-1", "--json"))

    assert (document["external_id"], document["task"]["identifier"]) == ("ACME-1", "ACME-2")


def test_task_lookup_says_what_to_pass_when_an_identifier_names_no_identity(store: Store):
    workspace_id, *_ = an_unfinished_create(store)
    with session_scope(store.sessions) as session:
        release_external_id(
            session=session,
            workspace_id=workspace_id,
            external_id=EXTERNAL_ID,
            operator="alice",
            reason="worker died",
        )

    released = refused(taskhook(store, "task", "lookup", "--workspace", "acme", "ACME-1"))
    unknown = refused(taskhook(store, "task", "lookup", "--workspace", "acme", "ACME-9"))

    assert released == (
        "Error: task ACME-1 holds no external id (it was released, or created without one): "
        "pass the external id itself, e.g. 'jira:PROJ-12' or 'gh-issue/OWNER/REPO#12'"
    )
    assert unknown == (
        "Error: no task in workspace acme holds external id 'ACME-9', and no task there is "
        "named ACME-9: pass an external id, e.g. 'jira:PROJ-12' or 'gh-issue/OWNER/REPO#12', "
        "or a task identifier"
    )


def test_task_lookup_of_a_released_identity_points_at_explain(store: Store):
    workspace_id, *_ = an_unfinished_create(store)
    with session_scope(store.sessions) as session:
        release_external_id(
            session=session,
            workspace_id=workspace_id,
            external_id=EXTERNAL_ID,
            operator="alice",
            reason="worker died",
        )
    line = refused(taskhook(store, "task", "lookup", "--workspace", "acme", EXTERNAL_ID))
    assert "released 1 time(s): taskhook explain" in line


def test_explain_prints_the_lineage_in_time_order(store: Store):
    _, _, creator, parked = an_unfinished_create(store)

    result = taskhook(store, "explain", "--workspace", "acme", EXTERNAL_ID)
    document = as_json(taskhook(store, "explain", "--workspace", "acme", EXTERNAL_ID, "--json"))

    assert result.exit_code == 0
    events = [event["what"] for event in document["events"]]
    assert events == [
        f"delivery {creator} received",
        "task ACME-1 created",
        # The insert's fence is the creator's last row update: it died after the insert.
        f"delivery {creator} processing",
        f"delivery {parked} received",
        f"delivery {parked} needs_operator",
    ]
    positions = [result.stdout.index(what) for what in events]
    assert positions == sorted(positions)
    assert "docs/runbook.md" in result.stdout
    assert document["holder"]["settled"] is False


def test_explain_of_an_identity_never_held_is_refused(store: Store):
    store.workspace()
    line = refused(taskhook(store, "explain", "--workspace", "acme", "jira:NOPE-1"))
    assert line == "Error: nothing in workspace acme holds or held external id 'jira:NOPE-1'"


# --- release --------------------------------------------------------------------------------


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
        f"the expected task {task_id}; nothing was released. Look again before anything else: "
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


# --- deliveries -------------------------------------------------------------------------------


def test_deliveries_list_filters_and_pages(store: Store):
    source_id = a_source(store, store.workspace().id)
    pks = [a_delivery(store, source_id, f"d-{n}") for n in range(3)]
    settle_as(store, pks[0], DeliveryStatus.DEAD, error="payload has no issue")

    table = taskhook(store, "deliveries", "list")
    dead = taskhook(store, "deliveries", "list", "--status", "dead")
    first_page = as_json(taskhook(store, "deliveries", "list", "--limit", "2", "--json"))
    before = str(first_page["next_before"])
    second_page = as_json(
        taskhook(store, "deliveries", "list", "--limit", "2", "--before", before, "--json")
    )

    assert [line.split()[0] for line in table.stdout.splitlines()] == [
        "ID",
        str(pks[2]),
        str(pks[1]),
        str(pks[0]),
    ]
    assert "payload has no issue" in dead.stdout
    assert len(dead.stdout.splitlines()) == 2
    assert [d["id"] for d in first_page["deliveries"]] == [pks[2], pks[1]]
    assert [d["id"] for d in second_page["deliveries"]] == [pks[0]]
    assert second_page["next_before"] is None
    assert (
        "More: taskhook deliveries list --before"
        in taskhook(store, "deliveries", "list", "--limit", "1").stdout
    )
    assert taskhook(store, "deliveries", "list", "--status", "lost").exit_code == 2


def test_deliveries_show_never_shows_a_signature(store: Store):
    source_id = a_source(store, store.workspace().id)
    pk = a_delivery(
        store,
        source_id,
        "d-1",
        headers={"X-GitHub-Event": "issues", "X-Hub-Signature-256": "sha256=0123abcd"},
    )

    shown = taskhook(store, "deliveries", "show", str(pk))
    document = as_json(taskhook(store, "deliveries", "show", str(pk), "--json"))

    assert "X-GitHub-Event" in shown.stdout
    assert "0123abcd" not in shown.output + json.dumps(document)
    assert document["summary"]["delivery_id"] == "d-1"
    assert refused(taskhook(store, "deliveries", "show", "999")) == "Error: delivery 999 not found"
    assert taskhook(store, "deliveries", "show", "one").exit_code == 2


def test_deliveries_list_shows_why_a_delivery_is_dead(store: Store):
    source_id = a_source(store, store.workspace().id)
    unsupported = a_delivery(store, source_id, "d-1")
    settle_as(store, unsupported, DeliveryStatus.DEAD, reason="unsupported payload: no issue")
    crashed = a_delivery(store, source_id, "d-2")
    settle_as(
        store,
        crashed,
        DeliveryStatus.DEAD,
        reason="database errors, 3 retries spent",
        error="OperationalError: gone",
    )

    rows = {
        line.split()[0]: line
        for line in taskhook(store, "deliveries", "list", "--status", "dead").stdout.splitlines()
    }

    assert "unsupported payload: no issue" in rows[str(unsupported)]
    assert "database errors, 3 retries spent; OperationalError: gone" in rows[str(crashed)]


def test_deliveries_show_names_the_external_id_of_its_task(store: Store):
    _, first, _ = a_settled_task(store)

    shown = taskhook(store, "deliveries", "show", str(first)).stdout
    document = as_json(taskhook(store, "deliveries", "show", str(first), "--json"))

    assert f"external id   {EXTERNAL_ID}" in shown
    assert "task          ACME-1" in shown
    listed = taskhook(store, "deliveries", "list").stdout
    assert f"ACME-1  {EXTERNAL_ID}" in listed
    assert document["summary"]["external_id"] == EXTERNAL_ID


@pytest.mark.parametrize(
    "command",
    [
        ("deliveries", "show", "{id}"),
        ("deliveries", "replay", "{id}"),
        ("deliveries", "list", "--before", "{id}"),
        ("token", "revoke", "{id}"),
    ],
)
# 2**31 fits SQLite's keys but not PostgreSQL's INTEGER; 2**63 fits neither.
@pytest.mark.parametrize("number", ["0", str(2**31), str(2**63), "99999999999999999999"])
def test_an_id_no_row_can_have_is_a_usage_error(store: Store, celery, command, number):
    source_id = a_source(store, store.workspace().id)
    settle_as(store, a_delivery(store, source_id, "d-1"), DeliveryStatus.DEAD, error="x")

    line = usage_error(taskhook(store, *(part.format(id=number) for part in command)))

    assert line.startswith("Error: Invalid value for ")
    assert f"{number} is not in the range 1<=x<=2147483647" in line
    assert celery.sent == []


def test_replay_commits_then_sends_the_delivery_to_the_worker(store: Store, celery):
    _, _, _, parked = an_unfinished_create(store)
    seen_at_send: list[object] = []
    celery.answer = lambda *args: None
    original_send = celery.send_task

    def send_after_checking(name, *, args, queue):
        # Another connection sees the row queued: the replay was committed first.
        seen_at_send.append(store.scalar("SELECT status FROM deliveries WHERE id = :p", p=parked))
        return original_send(name, args=args, queue=queue)

    celery.send_task = send_after_checking
    result = taskhook(store, "deliveries", "replay", str(parked))

    assert result.exit_code == 0
    assert celery.sent == [(PROCESS_DELIVERY, [parked], DELIVERIES_QUEUE)]
    assert seen_at_send == ["queued"]


def test_replay_refuses_a_delivery_that_is_not_parked_or_dead(store: Store, celery):
    _, first, _ = a_settled_task(store)
    line = refused(taskhook(store, "deliveries", "replay", str(first)))
    assert line == (
        f"Error: delivery {first} is done; only dead, mismatch, needs_operator or replay "
        "deliveries can be replayed"
    )
    assert (
        refused(taskhook(store, "deliveries", "replay", "999")) == "Error: delivery 999 not found"
    )
    assert celery.sent == []


def test_replay_with_the_broker_down_leaves_the_sweeper_to_send_it(store: Store, celery):
    source_id = a_source(store, store.workspace().id)
    dead = a_delivery(store, source_id, "d-1")
    settle_as(store, dead, DeliveryStatus.DEAD, error="database went away")
    celery.broker_down = True

    result = taskhook(store, "deliveries", "replay", str(dead), "--json")

    assert (
        as_json(result).items() >= {"delivery": dead, "status": "queued", "enqueued": False}.items()
    )
    assert store.scalar("SELECT status FROM deliveries WHERE id = :p", p=dead) == "queued"


# --- bulk replay and the operations history --------------------------------------------------


def some_dead(store: Store, count: int) -> list[int]:
    source_id = a_source(store, store.workspace().id)
    dead = [a_delivery(store, source_id, f"d-dead-{n}") for n in range(count)]
    for pk in dead:
        settle_as(store, pk, DeliveryStatus.DEAD, error="database went away")
    a_delivery(store, source_id, "d-queued")
    return dead


def statuses(store: Store, pks: list[int]) -> list[str]:
    return [store.scalar("SELECT status FROM deliveries WHERE id = :p", p=pk) for pk in pks]


def test_replay_matching_dry_run_counts_and_changes_nothing(store: Store, celery):
    dead = some_dead(store, 3)

    table = taskhook(store, "deliveries", "replay-matching", "--status", "dead", "--dry-run")
    listed = as_json(
        taskhook(
            store,
            "deliveries",
            "replay-matching",
            "--since",
            "2020-01-01T00:00",
            "--dry-run",
            "--json",
        )
    )

    assert table.exit_code == 0
    assert table.stdout.splitlines() == [
        "Dry run: 3 deliveries would be queued again.",
        "To run it: the same options, without --dry-run, with --name NAME --expect 3.",
    ]
    # A time without an offset is UTC.
    assert listed == {
        "dry_run": True,
        "criteria": {"received_from": "2020-01-01T00:00:00+00:00"},
        "replayable": 3,
        "bodies_dropped": 0,
    }
    assert statuses(store, dead) == ["dead"] * 3
    assert celery.sent == []
    assert store.scalar("SELECT count(*) FROM operations") == 0


def test_replay_matching_queues_sends_and_keeps_the_run_in_the_history(store: Store, celery):
    dead = some_dead(store, 3)

    ran = as_json(
        taskhook(
            store,
            "deliveries",
            "replay-matching",
            "--status",
            "dead",
            "--name",
            " after the database fix ",
            "--expect",
            "3",
            "--operator",
            "alice",
            "--json",
        )
    )
    table = taskhook(store, "operations", "list")
    (listed,) = as_json(taskhook(store, "operations", "list", "--json"))["operations"]

    assert celery.sent == [(PROCESS_DELIVERIES, [dead], DELIVERIES_QUEUE)]
    assert statuses(store, dead) == ["queued"] * 3
    assert ran["not_sent"] == 0
    assert listed == ran["operation"]
    assert {key: listed[key] for key in ("kind", "name", "operator", "criteria")} == {
        "kind": "bulk-replay",
        "name": "after the database fix",
        "operator": "alice",
        "criteria": {"status": "dead"},
    }
    assert (listed["expected"], listed["matched"], listed["done"], listed["error"]) == (
        3,
        3,
        3,
        None,
    )
    assert table.stdout.splitlines()[0].split() == [
        "ID",
        "STARTED",
        "FINISHED",
        "KIND",
        "NAME",
        "OPERATOR",
        "EXPECTED",
        "MATCHED",
        "DONE",
        "CRITERIA",
        "ERROR",
    ]
    assert "after the database fix" in table.stdout and "status=dead" in table.stdout
    people = taskhook(store, "deliveries", "replay-matching", "--status", "dead", "--name", "again")
    assert people.stdout.splitlines()[0] == (
        f"Operation {listed['id'] + 1} (again): 0 deliveries queued again and sent to the worker."
    )


def test_replay_matching_with_the_broker_down_leaves_the_sweeper_to_send_them(store: Store, celery):
    dead = some_dead(store, 2)
    celery.broker_down = True

    result = taskhook(store, "deliveries", "replay-matching", "--name", "retry")

    assert result.exit_code == 0
    assert "2 of them are queued but not sent: the sweeper sends them" in result.stdout
    assert "The broker did not take a message ([Errno 111] Connection refused)." in result.stderr
    assert statuses(store, dead) == ["queued"] * 2


def test_replay_matching_mistakes_are_clear_and_change_nothing(store: Store, celery):
    dead = some_dead(store, 1)
    command = ("deliveries", "replay-matching")

    assert "--name is required" in usage_error(taskhook(store, *command))
    assert "a bulk replay needs a name" in usage_error(taskhook(store, *command, "--name", " "))
    assert "not an ISO 8601 date or time" in usage_error(
        taskhook(store, *command, "--since", "yesterday", "--dry-run")
    )
    assert "--since must be before --until" in usage_error(
        taskhook(store, *command, "--since", "2026-12-02", "--until", "2026-12-01", "--dry-run")
    )
    assert refused(taskhook(store, *command, "--status", "done", "--name", "x")) == (
        "Error: done deliveries cannot be replayed in bulk: only dead or needs_operator "
        "deliveries can be replayed that way (a replay or mismatch delivery is replayed on "
        "its own, once its sender is known to be genuine)"
    )
    assert "search must be at most 300 characters" in refused(
        taskhook(store, *command, "--search", "x" * 301, "--dry-run")
    )
    assert statuses(store, dead) == ["dead"]
    assert celery.sent == []
    assert store.scalar("SELECT count(*) FROM operations") == 0


def test_operations_list_of_an_empty_history(store: Store):
    assert taskhook(store, "operations", "list").stdout.startswith("No operations yet")
    assert as_json(taskhook(store, "operations", "list", "--json")) == {"operations": []}


# --- stats --------------------------------------------------------------------------------------


def test_stats_for_people_and_for_scripts(store: Store):
    source_id = a_source(store, store.workspace().id)
    a_delivery(store, source_id, "d-1")
    settle_as(store, a_delivery(store, source_id, "d-2"), DeliveryStatus.DEAD, error="x")

    table = taskhook(store, "stats").stdout
    document = as_json(taskhook(store, "stats", "--json"))

    assert "queued          1" in table
    assert "dead            1" in table
    assert "Oldest queued: received" in table
    assert document["counts"]["queued"] == 1
    assert document["oldest_queued_age_seconds"] >= 0


# --- the real round trip: taskhook processes, Redis, a Celery operator worker ------------------

#: This module's own Redis database (FLUSHDB before and after, never FLUSHALL).
REDIS_URL = os.environ.get("TASKHOOK_TEST_CLI_REDIS_URL", "redis://127.0.0.1:6379/14")
BIN = Path(sys.executable).parent


@pytest.fixture
def redis_broker() -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as error:
        pytest.fail(f"Redis is not reachable at {REDIS_URL} ({error})", pytrace=False)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


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
        capture_output=True,
        text=True,
        timeout=120,
    )


@contextmanager
def operator_worker_process(store: Store, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A worker worker -Q operator``, as the Procfile's operator line runs it."""
    with log.open("wb") as output:
        worker = subprocess.Popen(
            [
                str(BIN / "celery"),
                "-A",
                "worker",
                "worker",
                "-Q",
                OPERATOR_QUEUE,
                "--concurrency",
                "1",
                "--loglevel",
                "INFO",
                "-n",
                f"operator-{uuid.uuid4().hex[:8]}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=ROOT,
            env=process_env(store),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            yield worker
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


@pytest.mark.e2e
@pytest.mark.redis
def test_release_round_trip_through_a_real_operator_worker(store: Store, redis_broker, tmp_path):
    workspace_id, task_id, _, _ = an_unfinished_create(store)

    with operator_worker_process(store, tmp_path / "operator.log"):
        result = taskhook_process(
            store,
            *RELEASE,
            "--reason",
            "worker died",
            "--operator",
            "alice",
            "--yes",
            "--timeout",
            "60",
            "--json",
        )

    assert result.returncode == 0, result.stderr + (tmp_path / "operator.log").read_text()
    assert "Traceback" not in result.stderr
    answer = json.loads(result.stdout)
    assert (
        answer.items()
        >= {
            "released": True,
            "workspace_id": workspace_id,
            "task_id": task_id,
            "identifier": "ACME-1",
            "external_id": EXTERNAL_ID,
            "operator": "alice",
        }.items()
    )
    assert held_by(store) is None
    assert store.scalar("SELECT reason FROM identity_releases") == "worker died"


@pytest.mark.e2e
@pytest.mark.redis
def test_an_unanswered_release_says_so_and_still_runs_when_a_worker_starts(
    store: Store, redis_broker, tmp_path
):
    an_unfinished_create(store)

    result = taskhook_process(store, *RELEASE, "--reason", "r", "--yes", "--timeout", "1")

    assert result.returncode == EXIT_NO_ANSWER, result.stderr
    assert "the operator worker did not answer within 1s" in result.stderr
    assert "Traceback" not in result.stderr
    assert held_by(store) == "ACME-1"
    # What the message warns about is true: the request waits in the queue.
    with operator_worker_process(store, tmp_path / "operator.log"):
        deadline = time.monotonic() + 60
        while held_by(store) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
    assert held_by(store) is None, (tmp_path / "operator.log").read_text()


@pytest.mark.redis
def test_replay_puts_the_delivery_on_the_real_deliveries_queue(store: Store, redis_broker):
    source_id = a_source(store, store.workspace().id)
    dead = a_delivery(store, source_id, "d-1")
    settle_as(store, dead, DeliveryStatus.DEAD, error="database went away")

    result = taskhook_process(store, "deliveries", "replay", str(dead))

    assert result.returncode == 0, result.stderr
    assert "sent to the worker" in result.stdout
    (message,) = [json.loads(raw) for raw in redis_broker.lrange(DELIVERIES_QUEUE, 0, -1)]
    assert message["headers"]["task"] == PROCESS_DELIVERY
    args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    assert args == [dead]


# --- API tokens -------------------------------------------------------------------------------


def test_token_add_prints_the_token_once_and_list_never_shows_it(store: Store):
    store.workspace("acme")
    added = as_json(
        taskhook(
            store,
            "token",
            "add",
            "--workspace",
            "acme",
            "--role",
            "operator",
            "--name",
            "alice",
            "--json",
        )
    )
    assert added["token"].startswith("th_")
    with store.sessions() as session:
        principal = authenticate(session=session, token=added["token"])
    assert (principal.name, principal.role.value) == ("alice", "operator")

    listing = taskhook(store, "token", "list")
    assert added["token"] not in listing.stdout
    assert "alice" in listing.stdout and "operator" in listing.stdout
    (row,) = as_json(taskhook(store, "token", "list", "--json"))["tokens"]
    assert row["workspaces"] == ["acme"] and "token" not in row


def test_a_revoked_token_no_longer_authenticates(store: Store):
    store.workspace("acme")
    added = as_json(
        taskhook(store, "token", "add", "--workspace", "acme", "--name", "bob", "--json")
    )
    assert taskhook(store, "token", "revoke", str(added["id"])).exit_code == 0
    with store.sessions() as session:
        assert authenticate(session=session, token=added["token"]) is None


def test_token_mistakes_are_one_line_refusals(store: Store):
    store.workspace("acme")
    assert "nope" in refused(taskhook(store, "token", "add", "--workspace", "nope", "--name", "x"))
    # A blank --name is an invalid value: a usage error (test_an_invalid_value_is_a_usage_error...).
    assert "999" in refused(taskhook(store, "token", "revoke", "999"))
    assert (
        taskhook(
            store, "token", "add", "--workspace", "acme", "--name", "x", "--role", "admin"
        ).exit_code
        == 2
    )


# --- catch-up ---------------------------------------------------------------------------

CATCH_UP_TOKEN = "ghp_cli_token_never_printed"


def _opened(number: int) -> dict[str, Any]:
    payload = json.loads((FIXTURES / "github" / "issues__opened.json").read_text())
    payload["issue"]["number"] = number
    return payload


@pytest.fixture
def github_log(store: Store) -> Iterator[FakeGitHub]:
    workspace = store.workspace()
    a_source(store, workspace.id)
    with FakeGitHub(token=CATCH_UP_TOKEN) as github:
        for number in (1, 2, 3):
            github.log_delivery(
                hook="repos/acme/widgets/hooks/77",
                event="issues",
                action="opened",
                payload=_opened(number),
                status_code=502,
            )
        yield github


def test_source_catch_up_takes_the_token_without_echo_and_never_shows_it(
    store: Store, github_log: FakeGitHub
):
    given = ("source", "catch-up", "acme-github", "--repo", "acme/widgets", "--hook-id", "77")
    result = taskhook(store, *given, "--api-url", github_log.base_url, input=f"{CATCH_UP_TOKEN}\n")

    assert result.exit_code == 0, result.output
    assert CATCH_UP_TOKEN not in result.output
    assert "taskhook catch-up github --source acme-github --dry-run" in result.stdout
    for listing in (("source", "list"), ("source", "list", "--json")):
        assert CATCH_UP_TOKEN not in taskhook(store, *listing).output


@pytest.mark.parametrize(
    "case",
    [
        ("--repo", "acme/widgets", "--org", "acme"),
        ("--repo", "not a repo"),
        ("--org", "acme", "--hook-id", "seven"),
        ("--org", "acme", "--api-url", "ftp://ghe.example"),
    ],
    ids=["two owners", "bad repo", "bad hook id", "bad api url"],
)
def test_source_catch_up_refuses_bad_values_and_stores_nothing(store: Store, case):
    workspace = store.workspace()
    a_source(store, workspace.id)
    result = taskhook(
        store, "source", "catch-up", "acme-github", *case, "--token-stdin", input="t\n"
    )
    assert usage_error(result)
    with session_scope(store.sessions) as session:
        assert session.get(CatchUpSource, 1) is None


def test_catch_up_github_dry_run_then_run_then_nothing_new(
    store: Store, github_log: FakeGitHub, celery: FakeApp
):
    taskhook(
        store,
        "source",
        "catch-up",
        "acme-github",
        "--repo",
        "acme/widgets",
        "--api-url",
        github_log.base_url,
        "--hook-id",
        "77",
        "--token-stdin",
        input=f"{CATCH_UP_TOKEN}\n",
    )
    run = ("catch-up", "github", "--source", "acme-github", "--json")

    dry = as_json(taskhook(store, *run, "--dry-run"))
    assert len(dry["missed"]) == 3 and dry["recovered"] == [] and celery.sent == []

    done = as_json(taskhook(store, *run))
    assert len(done["recovered"]) == 3
    # The three, committed together, share one worker message.
    assert celery.sent == [(PROCESS_DELIVERIES, [done["recovered"]], DELIVERIES_QUEUE)]

    again = as_json(taskhook(store, *run, "--since", "1d"))
    assert again["missed"] == [] and len(celery.sent) == 1
    people = taskhook(store, "catch-up", "github", "--source", "acme-github")
    assert "Missed creates" in people.stdout and CATCH_UP_TOKEN not in people.output


def test_catch_up_github_with_a_wrong_token_is_one_clear_line(store: Store, github_log: FakeGitHub):
    taskhook(
        store,
        "source",
        "catch-up",
        "acme-github",
        "--org",
        "acme",
        "--api-url",
        github_log.base_url,
        "--hook-id",
        "77",
        "--token-stdin",
        input="ghp_wrong_one\n",
    )
    line = refused(taskhook(store, "catch-up", "github", "--source", "acme-github"))
    assert line.startswith("Error: catch-up of acme-github stopped:")
    assert "ghp_wrong_one" not in line


def test_catch_up_github_since_must_be_a_duration_or_a_date(store: Store):
    line = usage_error(taskhook(store, "catch-up", "github", "--source", "x", "--since", "soon"))
    assert "neither a duration" in line


def test_catch_up_of_a_source_without_log_access_says_how_to_give_it(store: Store):
    workspace = store.workspace()
    a_source(store, workspace.id)
    line = refused(taskhook(store, "catch-up", "github", "--source", "acme-github"))
    assert "taskhook source catch-up acme-github --repo OWNER/REPO" in line


def _app_key_file(tmp_path: Path) -> tuple[Path, Any]:
    """A throwaway GitHub App private key, written as GitHub hands it out (PEM)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / "app.private-key.pem"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return path, key


def test_source_catch_up_of_an_app_reads_its_hook_with_a_jwt_and_never_shows_the_key(
    store: Store, github_log: FakeGitHub, celery: FakeApp, tmp_path: Path
):
    import jwt

    key_file, key = _app_key_file(tmp_path)
    for number in (4, 5):
        github_log.log_delivery(
            hook="app/hook", event="issues", action="opened", payload=_opened(number)
        )
    given = ("source", "catch-up", "acme-github", "--app-id", "4200")
    result = taskhook(
        store, *given, "--private-key-file", str(key_file), "--api-url", github_log.base_url
    )

    assert result.exit_code == 0, result.output
    assert "GitHub App 4200's own hook" in result.stdout
    key_line = key_file.read_text().splitlines()[1]
    assert key_line not in result.output
    done = as_json(taskhook(store, "catch-up", "github", "--source", "acme-github", "--json"))
    assert len(done["recovered"]) == 2  # the App's hook, not the repository's
    assert key_line not in json.dumps(done)
    jwt.decode(github_log.app_jwts[0], key.public_key(), algorithms=["RS256"], issuer="4200")
    for listing in (("source", "list"), ("source", "list", "--json")):
        assert key_line not in taskhook(store, *listing).output


@pytest.mark.parametrize(
    "case",
    ["not a key", "missing file", "bad app id", "no key", "and a repo", "and a token", "hook id"],
)
def test_source_catch_up_of_an_app_refuses_bad_values_and_stores_nothing(
    store: Store, tmp_path: Path, case: str
):
    workspace = store.workspace()
    a_source(store, workspace.id)
    key_file, _ = _app_key_file(tmp_path)
    broken = tmp_path / "broken.pem"
    secret_line = key_file.read_text().splitlines()[1]
    broken.write_text(key_file.read_text().replace(secret_line, secret_line[::-1]))
    app = ("--app-id", "4200", "--private-key-file", str(key_file))
    args = {
        "not a key": ("--app-id", "4200", "--private-key-file", str(broken)),
        "missing file": ("--app-id", "4200", "--private-key-file", str(tmp_path / "none.pem")),
        "bad app id": ("--app-id", "Iv1.abc", "--private-key-file", str(key_file)),
        "no key": ("--app-id", "4200"),
        "and a repo": (*app, "--repo", "acme/widgets"),
        "and a token": (*app, "--token-stdin"),
        "hook id": (*app, "--hook-id", "77"),
    }[case]

    result = taskhook(store, "source", "catch-up", "acme-github", *args, input="t\n")

    assert usage_error(result)
    assert secret_line not in result.output and secret_line[::-1] not in result.output
    with session_scope(store.sessions) as session:
        assert session.get(CatchUpSource, 1) is None


def _with_token(store: Store, github: FakeGitHub, *owner: str) -> None:
    given = ("source", "catch-up", "acme-github", *(owner or ("--repo", "acme/widgets")))
    result = taskhook(
        store,
        *given,
        "--hook-id",
        "77",
        "--api-url",
        github.base_url,
        "--token-stdin",
        input=f"{CATCH_UP_TOKEN}\n",
    )
    assert result.exit_code == 0, result.output


def test_catch_up_github_scan_stores_each_item_once_however_often_it_runs(
    store: Store, github_log: FakeGitHub, celery: FakeApp
):
    _with_token(store, github_log)
    for number in (1, 2, 3, 4):
        github_log.open_issue("acme/widgets", title=f"Opened long ago, #{number}")
    scan = ("catch-up", "github", "--source", "acme-github", "--scan", "--since", "2026-11-01")

    done = as_json(taskhook(store, *scan, "--json"))
    assert done["kind"] == "scan" and len(done["recovered"]) == 4
    assert done["missed"][0] == "scan:gh-issue/acme/widgets#1"
    assert celery.sent == [(PROCESS_DELIVERIES, [done["recovered"]], DELIVERIES_QUEUE)]

    again = taskhook(store, *scan)
    assert again.exit_code == 0, again.output
    assert "GitHub's issues and pull requests" in again.stdout
    assert "Missed creates" in again.stdout and len(celery.sent) == 1
    stats = taskhook(store, "stats").stdout
    assert "Last catch-up of acme-github (scan)" in stats
    assert CATCH_UP_TOKEN not in again.output + stats


def test_catch_up_github_scan_of_an_organization_hook_names_its_repository(
    store: Store, github_log: FakeGitHub, celery: FakeApp
):
    _with_token(store, github_log, "--org", "acme")
    github_log.open_issue("acme/widgets", title="One")
    scan = ("catch-up", "github", "--source", "acme-github", "--scan", "--since", "3d")
    line = refused(taskhook(store, *scan))
    assert "name the repository to scan (--repo OWNER/REPO)" in line
    done = taskhook(store, *scan, "--repo", "acme/widgets")
    assert done.exit_code == 0, done.output
    assert "the source is not covered by it" in done.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--scan", "--redeliver"), "a --scan reads no log"),
        (("--repo", "acme/widgets"), "--repo names the repository a --scan lists"),
        (("--scan", "--repo", "not a repo"), "OWNER/REPO"),
    ],
    ids=["scan and redeliver", "repo without scan", "bad repo"],
)
def test_catch_up_github_scan_options_that_do_not_fit_are_usage_errors(store: Store, args, says):
    line = usage_error(taskhook(store, "catch-up", "github", "--source", "x", *args))
    assert says in line


JIRA_EMAIL, JIRA_TOKEN = "ops@acme.example", "ATATT3x-cli-jira-token-never-printed"


@pytest.fixture
def jira_site(store: Store) -> Iterator[FakeJira]:
    workspace = store.workspace()
    with FakeJira(email=JIRA_EMAIL, api_token=JIRA_TOKEN, pat=JIRA_TOKEN) as jira:
        with session_scope(store.sessions) as session:
            add_source(
                session=session,
                provider="jira",
                workspace_id=workspace.id,
                slug="acme-jira",
                secret=SECRET,
                create_events=["jira:issue_created"],
                site_url=jira.base_url,
            )
        for number in (1, 2, 3):
            jira.create_issue(summary=f"Opened while we were down, #{number}")
        yield jira


@pytest.mark.parametrize("access", [("--email", JIRA_EMAIL), ("--pat",)], ids=["cloud", "pat"])
def test_catch_up_jira_searches_the_site_and_stores_each_issue_once(
    store: Store, jira_site: FakeJira, celery: FakeApp, access
):
    given = taskhook(store, "source", "catch-up", "acme-jira", *access, input=f"{JIRA_TOKEN}\n")
    assert given.exit_code == 0, given.output
    assert "taskhook catch-up jira --source acme-jira --dry-run" in given.stdout
    run = ("catch-up", "jira", "--source", "acme-jira")

    dry = as_json(taskhook(store, *run, "--dry-run", "--json"))
    assert dry["missed"] == [f"scan:jira:PROJ-{n}" for n in (1, 2, 3)] and celery.sent == []
    done = as_json(taskhook(store, *run, "--json"))
    assert done["kind"] == "search" and len(done["recovered"]) == 3
    assert celery.sent == [(PROCESS_DELIVERIES, [done["recovered"]], DELIVERIES_QUEUE)]
    again = taskhook(store, *run)
    assert again.exit_code == 0 and "Jira's issue search" in again.stdout
    assert len(celery.sent) == 1
    stats = taskhook(store, "stats").stdout
    assert "Last catch-up of acme-jira (Jira search)" in stats
    for output in (given.output, dry, done, again.output, stats):
        assert JIRA_TOKEN not in str(output)


def test_catch_up_jira_with_a_wrong_token_is_one_clear_line(store: Store, jira_site: FakeJira):
    taskhook(store, "source", "catch-up", "acme-jira", "--email", JIRA_EMAIL, input="wrong-token\n")
    line = refused(taskhook(store, "catch-up", "jira", "--source", "acme-jira"))
    assert line.startswith("Error: catch-up of acme-jira stopped: Jira rejected")
    assert "wrong-token" not in line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--email", "ops@acme.example", "--pat"), "one of them"),
        (("--jql", "project = PROJ"), "one of them"),
        (("--email", "not an email"), "not an email address"),
        (("--pat", "--jql", "project = PROJ ORDER BY key"), "ORDER BY"),
        (("--pat", "--site", "ftp://jira.example"), "http(s) URL"),
        (("--pat", "--repo", "acme/widgets"), "for a Jira source"),
    ],
    ids=["both", "neither", "bad email", "order by", "bad site", "and a repo"],
)
def test_source_catch_up_of_jira_refuses_bad_values_and_stores_nothing(
    store: Store, jira_site: FakeJira, args, says
):
    result = taskhook(store, "source", "catch-up", "acme-jira", *args, input="t\n")
    assert says in usage_error(result)
    with session_scope(store.sessions) as session:
        assert session.get(CatchUpSource, 1) is None


def test_catch_up_jira_of_a_github_source_says_which_it_is(store: Store, github_log: FakeGitHub):
    line = refused(taskhook(store, "catch-up", "jira", "--source", "acme-github"))
    assert "is a github source, not Jira's" in line
    given = taskhook(store, "source", "catch-up", "acme-github", "--pat", input="t\n")
    assert "this access is for a Jira site" in refused(given)
