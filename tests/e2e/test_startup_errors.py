"""A mistake at a process's start is one line, from every process.

Each process is started as the Procfile starts it (its line, through bash,
from the repository root; the CLI as an operator runs it): a bad setting, a
broker or a database taskhook does not run on, an unreachable database, a
wrong RabbitMQ password, no encryption key (or one removed while it still
seals a stored credential). Each must exit non-zero with one line on stderr that
names the setting, no traceback, no password, and no worker saying "ready".
An unknown ``TASKHOOK_`` name is a warning line of its own, never fatal.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from models import sealing
from models.db import make_engine, make_session_factory, session_scope
from models.sources import add_source
from models.workspaces import create_workspace
from tests.support.cli import BIN
from tests.support.processes import ROOT, free_port, wait_until

pytestmark = pytest.mark.e2e

#: The Procfile's processes by name: what `taskhook start` and a platform run.
PROCFILE = dict(
    line.split(": ", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip()
)
#: A process that does not stop on its own within this has started: a failure.
START_TIMEOUT = 60


def start(process: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``process`` (a Procfile name, or "cli" for ``taskhook stats``) with
    the embedded setup in ``tmp_path`` and ``env`` over it, to its end."""
    environment = {key: value for key, value in os.environ.items() if "TASKHOOK_" not in key}
    environment |= {
        "PATH": f"{BIN}{os.pathsep}{environment.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
        "TASKHOOK_DATABASE_URL": f"sqlite:///{tmp_path / 'taskhook.db'}",
        "TASKHOOK_BROKER_URL": "filesystem://",
        "TASKHOOK_BROKER_FOLDER": str(tmp_path / "broker"),
        "TASKHOOK_BEAT_SCHEDULE": str(tmp_path / "celerybeat-schedule"),
        "TASKHOOK_PORT": str(free_port()),
        **env,
    }
    environment = {key: value for key, value in environment.items() if value != "<unset>"}
    if process == "cli":
        args, cwd = ["taskhook", "stats"], tmp_path
    else:
        args, cwd = ["bash", "-c", f"exec {PROCFILE[process]}"], ROOT
    return subprocess.run(
        args,
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=START_TIMEOUT,
    )


def said(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines a process that could not start said on stderr (blank ones aside)."""
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output, output
    assert " ready." not in output, output
    return [line for line in done.stderr.splitlines() if line.strip()]


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = said(done)
    assert len(lines) == 1, done.stdout + done.stderr
    return lines[0]


def prefix(process: str) -> str:
    """The services say ``taskhook: ...``; the CLI refuses as it always does."""
    return "Error: " if process in ("cli", "release") else "taskhook: "


@pytest.mark.parametrize("process", ["web", "worker", "beat", "release", "cli"])
def test_a_bad_value_is_one_line_naming_the_setting_and_what_it_takes(tmp_path: Path, process: str):
    line = one_line(start(process, tmp_path, TASKHOOK_LEASE_SECONDS="abc"))

    assert line == (
        f"{prefix(process)}TASKHOOK_LEASE_SECONDS='abc': must be a whole number of seconds >= 1"
    )


@pytest.mark.parametrize("process", ["web", "worker", "beat", "cli"])
def test_a_broker_taskhook_does_not_run_on_is_one_line_naming_those_it_does(
    tmp_path: Path, process: str
):
    url = "rabbitmq://guest:hunter2@127.0.0.1:5672//"

    line = one_line(start(process, tmp_path, TASKHOOK_BROKER_URL=url))

    assert line.startswith(
        f"{prefix(process)}TASKHOOK_BROKER_URL='rabbitmq://guest:***@127.0.0.1:5672//': must be "
    )
    for scheme in ("filesystem://", "amqp://", "redis://"):
        assert scheme in line


@pytest.mark.parametrize("process", ["web", "worker", "cli"])
def test_a_database_taskhook_does_not_run_on_is_one_line_naming_those_it_does(
    tmp_path: Path, process: str
):
    url = "mysql://taskhook:hunter2@127.0.0.1/taskhook"

    line = one_line(start(process, tmp_path, TASKHOOK_DATABASE_URL=url))

    assert line == (
        f"{prefix(process)}TASKHOOK_DATABASE_URL='mysql://taskhook:***@127.0.0.1/taskhook': "
        "must be a SQLite or PostgreSQL URL: sqlite:///path/to/taskhook.db or "
        "postgresql+psycopg://user:password@host/db"
    )


@pytest.mark.parametrize("process", ["web", "worker", "operator"])
def test_a_closed_database_port_is_one_line_and_no_worker_is_ready(tmp_path: Path, process: str):
    port = free_port()  # nothing listens there
    url = f"postgresql+psycopg://taskhook:hunter2@127.0.0.1:{port}/taskhook"

    line = one_line(start(process, tmp_path, TASKHOOK_DATABASE_URL=url))

    assert line == (
        f"taskhook: cannot reach the database at postgresql+psycopg://taskhook:***@127.0.0.1:"
        f"{port}/taskhook (TASKHOOK_DATABASE_URL): connection refused"
    )


@pytest.mark.rabbitmq
@pytest.mark.parametrize("process", ["web", "worker", "beat"])
def test_a_wrong_rabbitmq_password_is_one_line(tmp_path: Path, process: str, rabbitmq_url: str):
    wrong = rabbitmq_url.replace("guest:guest@", "guest:hunter2@")
    assert wrong != rabbitmq_url

    done = start(process, tmp_path, TASKHOOK_BROKER_URL=wrong)

    line = one_line(done)
    assert line.startswith("taskhook: cannot reach the broker at amqp://guest:***@")
    assert "(TASKHOOK_BROKER_URL): authentication failed" in line
    assert "hunter2" not in done.stdout + done.stderr


@pytest.mark.parametrize("process", ["web", "worker", "cli"])
def test_an_unknown_variable_is_a_warning_naming_the_setting_it_may_mean(
    tmp_path: Path, process: str
):
    done = start(
        process,
        tmp_path,
        TASKHOOK_DATABSE_URL=f"sqlite:///{tmp_path / 'meant.db'}",
        TASKHOOK_LEASE_SECONDS="abc",
        TASKHOOK_TEST_ANYTHING="the suite's own variables are not warned about",
    )

    assert said(done) == [
        "taskhook: warning: TASKHOOK_DATABSE_URL is not a setting; "
        "did you mean TASKHOOK_DATABASE_URL?",
        f"{prefix(process)}TASKHOOK_LEASE_SECONDS='abc': must be a whole number of seconds >= 1",
    ]


def test_a_misspelled_database_url_leaves_no_default_database_behind(tmp_path: Path):
    """The CLI would have used ./var/taskhook.db: it warns, says there is no
    database there, and creates none."""
    done = start(
        "cli",
        tmp_path,
        TASKHOOK_DATABASE_URL="<unset>",
        TASKHOOK_DATABSE_URL=f"sqlite:///{tmp_path / 'meant.db'}",
    )

    assert said(done) == [
        "taskhook: warning: TASKHOOK_DATABSE_URL is not a setting; "
        "did you mean TASKHOOK_DATABASE_URL?",
        "Error: no database at ./var/taskhook.db (TASKHOOK_DATABASE_URL); "
        "`taskhook db upgrade` creates it",
    ]
    assert not (tmp_path / "var").exists()


def test_the_web_process_starts_through_a_broker_outage_with_one_warning(tmp_path: Path):
    """The inbox is the queue of record: a broker that does not answer is an
    outage the ingress rides out (docs/runbook.md), not a mistake to refuse."""
    port = free_port()  # nothing listens there
    environment = {key: value for key, value in os.environ.items() if "TASKHOOK_" not in key}
    web_port = free_port()
    environment |= {
        "PATH": f"{BIN}{os.pathsep}{environment.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
        "TASKHOOK_DATABASE_URL": f"sqlite:///{tmp_path / 'taskhook.db'}",
        "TASKHOOK_BROKER_URL": f"redis://127.0.0.1:{port}/0",
        "TASKHOOK_PORT": str(web_port),
    }
    subprocess.run(
        ["taskhook", "db", "upgrade"], env=environment, cwd=tmp_path, check=True, timeout=60
    )
    log = tmp_path / "web.log"
    with log.open("wb") as output:
        web = subprocess.Popen(
            ["bash", "-c", f"exec {PROCFILE['web']}"],
            cwd=ROOT,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=output,
        )
    try:
        wait_until(
            lambda: httpx_ok(f"http://127.0.0.1:{web_port}/healthz") or web.poll() is not None,
            timeout=START_TIMEOUT,
            what="the web process to answer",
        )
        assert web.poll() is None, log.read_text()
    finally:
        web.terminate()
        web.wait(timeout=15)
    warnings = [line for line in log.read_text().splitlines() if "TASKHOOK_BROKER_URL" in line]
    assert len(warnings) == 1, log.read_text()
    assert warnings[0].startswith("taskhook: warning: cannot reach the broker at redis://")
    assert "starting anyway" in warnings[0] and "Traceback" not in log.read_text()


def httpx_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("process", ["web", "worker", "live", "operator"])
def test_no_encryption_key_on_postgresql_is_one_line_saying_how_to_make_one(
    tmp_path: Path, process: str, postgres_url: str
):
    missing = tmp_path / "no.key"

    line = one_line(
        start(
            process,
            tmp_path,
            TASKHOOK_DATABASE_URL=postgres_url,
            TASKHOOK_ENCRYPTION_KEY_FILE=str(missing),
        )
    )

    assert line == (
        "taskhook: no encryption key: set TASKHOOK_ENCRYPTION_KEYS to a key made by "
        f"`taskhook secrets new-key`, or put one in {missing} (TASKHOOK_ENCRYPTION_KEY_FILE)"
    )


def test_a_key_removed_while_it_still_seals_a_credential_is_refused_with_a_count(
    tmp_path: Path, postgres_url: str
):
    """Sources added here are sealed by the suite's key; a web process given
    only another key must not start and then fail every delivery."""
    engine = make_engine(postgres_url)
    try:
        with session_scope(make_session_factory(engine)) as session:
            workspace = create_workspace(
                session=session, slug="sealed", name="Sealed", task_prefix="SEAL"
            )
            add_source(
                session=session,
                provider="github",
                workspace_id=workspace.id,
                slug="sealed-github",
                secret="sealed-secret",
                create_events=["issues.opened"],
            )
        old = sealing.installed().primary_id

        line = one_line(
            start(
                "web",
                tmp_path,
                TASKHOOK_DATABASE_URL=postgres_url,
                TASKHOOK_ENCRYPTION_KEYS=sealing.new_key(),
            )
        )
    finally:
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM workspaces WHERE slug = 'sealed'"))
        engine.dispose()

    assert re.fullmatch(
        rf"taskhook: \d+ stored credentials? (is|are) sealed by key {old}, which the "
        r"encryption keys no longer hold: put it back \(after the first key\), run "
        r"`taskhook secrets rotate`, then remove it",
        line,
    ), line
