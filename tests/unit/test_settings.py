"""Settings read from TASKHOOK_ variables: what a default is derived from."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from models.settings import (
    OTHER_VARIABLES,
    Settings,
    invalid_settings,
    setting_names,
    unknown_variables,
)


@pytest.fixture(autouse=True)
def no_taskhook_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the variables a test sets: none left in the developer's shell."""
    for name in list(os.environ):
        if name.startswith("TASKHOOK_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("variables", "public_url"),
    [
        ({}, "http://127.0.0.1:8000"),
        ({"TASKHOOK_PORT": "8100"}, "http://127.0.0.1:8100"),
        ({"TASKHOOK_HOST": "10.0.0.5", "TASKHOOK_PORT": "9000"}, "http://10.0.0.5:9000"),
        # A wildcard is where the ingress listens, not an address anyone reaches.
        ({"TASKHOOK_HOST": "0.0.0.0", "TASKHOOK_PORT": "8100"}, "http://127.0.0.1:8100"),
        ({"TASKHOOK_HOST": "::1"}, "http://[::1]:8000"),
        (
            {"TASKHOOK_PORT": "8100", "TASKHOOK_PUBLIC_URL": "https://hooks.example.com"},
            "https://hooks.example.com",
        ),
    ],
)
def test_the_public_url_defaults_to_where_the_ingress_listens(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], public_url: str
):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)

    assert Settings().public_url == public_url


def test_a_port_out_of_range_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TASKHOOK_PORT", "70000")

    with pytest.raises(ValueError, match="port"):
        Settings()


def test_cors_origins_are_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch):
    assert Settings().cors_origins == []
    monkeypatch.setenv("TASKHOOK_CORS_ORIGINS", "https://app.example.com, http://localhost:3000/")
    assert Settings().cors_origins == ["https://app.example.com", "http://localhost:3000"]


@pytest.mark.parametrize(
    ("origins", "says"),
    [
        ("*", "list the origins"),
        ("https://app.example.com/console", "not an origin"),
        ("app.example.com", "not an origin"),
        ("ftp://app.example.com", "not an origin"),
    ],
)
def test_a_cors_origin_must_be_exact(monkeypatch: pytest.MonkeyPatch, origins: str, says: str):
    monkeypatch.setenv("TASKHOOK_CORS_ORIGINS", origins)

    with pytest.raises(ValueError, match=says):
        Settings()


def test_settings_are_values_only():
    """Reading settings imports no broker library: what a broker URL means to
    kombu is models.broker.connection's, built at the edges that connect."""
    check = "import sys, models.settings; print('kombu' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert imported.stdout.strip() == "False", imported.stderr


# --- a bad value, an unknown name: one line that says what is allowed -------------------------


def invalid(monkeypatch: pytest.MonkeyPatch, **variables: str) -> str:
    """The one line the processes print for the settings of ``variables``."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as raised:
        Settings()
    return invalid_settings(raised.value)


@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        (
            "TASKHOOK_LEASE_SECONDS",
            "abc",
            "TASKHOOK_LEASE_SECONDS='abc': must be a whole number of seconds >= 1",
        ),
        (
            "TASKHOOK_LEASE_SECONDS",
            "0",
            "TASKHOOK_LEASE_SECONDS='0': must be a whole number of seconds >= 1",
        ),
        ("TASKHOOK_PORT", "70000", "TASKHOOK_PORT='70000': must be a whole number from 1 to 65535"),
        (
            "TASKHOOK_ENQUEUE_TIMEOUT_SECONDS",
            "soon",
            "TASKHOOK_ENQUEUE_TIMEOUT_SECONDS='soon': must be a number of seconds > 0",
        ),
        (
            "TASKHOOK_SQLITE_SYNCHRONOUS",
            "fast",
            "TASKHOOK_SQLITE_SYNCHRONOUS='fast': must be one of FULL, NORMAL",
        ),
        (
            "TASKHOOK_STREAM_LISTENER",
            "maybe",
            "TASKHOOK_STREAM_LISTENER='maybe': must be true or false",
        ),
        (
            "TASKHOOK_BODY_RETENTION_DAYS",
            "-1",
            "TASKHOOK_BODY_RETENTION_DAYS='-1': must be a whole number of days from 0 to 36500",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable_and_what_it_takes(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, line: str
):
    assert invalid(monkeypatch, **{name: value}) == line


def test_several_bad_values_are_still_one_line(monkeypatch: pytest.MonkeyPatch):
    line = invalid(monkeypatch, TASKHOOK_LEASE_SECONDS="abc", TASKHOOK_PORT="x")
    assert "\n" not in line
    assert "TASKHOOK_LEASE_SECONDS='abc'" in line
    assert "TASKHOOK_PORT='x'" in line


def test_settings_that_contradict_each_other_say_both_values(monkeypatch: pytest.MonkeyPatch):
    line = invalid(monkeypatch, TASKHOOK_LEASE_SECONDS="30")
    assert line == "TASKHOOK_LEASE_SECONDS (30) must exceed TASKHOOK_TASK_TIME_LIMIT_SECONDS (60)"


@pytest.mark.parametrize(
    "url",
    [
        "filesystem://",
        "redis://h:6379/0",
        "rediss://h:6380/0",
        "amqp://u:p@h:5672/v",
        "amqps://h//",
    ],
)
def test_every_broker_taskhook_runs_on_is_taken(monkeypatch: pytest.MonkeyPatch, url: str):
    monkeypatch.setenv("TASKHOOK_BROKER_URL", url)
    assert Settings().broker_url == url


@pytest.mark.parametrize("url", ["rabbitmq://guest:hunter2@h//", "sqs://", "127.0.0.1:6379"])
def test_another_broker_is_refused_naming_those_taken(monkeypatch: pytest.MonkeyPatch, url: str):
    line = invalid(monkeypatch, TASKHOOK_BROKER_URL=url)
    assert line.startswith("TASKHOOK_BROKER_URL=")
    for scheme in ("filesystem://", "amqp://", "amqps://", "redis://", "rediss://"):
        assert scheme in line
    assert "hunter2" not in line


@pytest.mark.parametrize(
    ("url", "taken"),
    [
        ("sqlite:///var/taskhook.db", "sqlite:///var/taskhook.db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        # psycopg is the driver taskhook installs; SQLAlchemy's default is psycopg2.
        ("postgresql://u:p@h:5433/db", "postgresql+psycopg://u:p@h:5433/db"),
    ],
)
def test_sqlite_and_postgresql_are_the_databases(
    monkeypatch: pytest.MonkeyPatch, url: str, taken: str
):
    monkeypatch.setenv("TASKHOOK_DATABASE_URL", url)
    assert Settings().database_url == taken


@pytest.mark.parametrize(
    "url", ["mysql://u:hunter2@localhost/db", "postgresql+psycopg2://u@h/db", "var/taskhook.db"]
)
def test_another_database_is_refused_naming_those_taken(monkeypatch: pytest.MonkeyPatch, url: str):
    line = invalid(monkeypatch, TASKHOOK_DATABASE_URL=url)
    assert line.startswith("TASKHOOK_DATABASE_URL=")
    assert "sqlite:///" in line and "postgresql+psycopg://" in line
    assert "hunter2" not in line


def test_the_listener_connects_straight_to_postgresql_never_through_the_pooler(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("TASKHOOK_DATABASE_URL", "postgresql://u@pgbouncer:6432/db")
    assert Settings().listener_url() == "postgresql+psycopg://u@pgbouncer:6432/db"
    # Behind a pooler, no direct URL: no listener (a LISTEN there hears nothing).
    monkeypatch.setenv("TASKHOOK_DATABASE_POOLER", "pgbouncer")
    assert Settings().listener_url() is None
    monkeypatch.setenv("TASKHOOK_DATABASE_DIRECT_URL", "postgresql://u@db:5432/db")
    assert Settings().listener_url() == "postgresql+psycopg://u@db:5432/db"


@pytest.mark.parametrize(
    ("variables", "says"),
    [
        (
            {"TASKHOOK_DATABASE_POOLER": "pgpool"},
            "TASKHOOK_DATABASE_POOLER='pgpool': must be one of none, pgbouncer",
        ),
        (
            {"TASKHOOK_DATABASE_POOLER": "pgbouncer"},
            "TASKHOOK_DATABASE_POOLER=pgbouncer is for PostgreSQL behind a pooler; "
            "TASKHOOK_DATABASE_URL is a SQLite file: unset the pooler",
        ),
        (
            {"TASKHOOK_DATABASE_DIRECT_URL": "sqlite:///var/taskhook.db"},
            "TASKHOOK_DATABASE_DIRECT_URL='sqlite:///var/taskhook.db': must be a PostgreSQL "
            "URL that bypasses the pooler: postgresql+psycopg://user:password@host:5432/db",
        ),
    ],
)
def test_a_pooler_setting_that_cannot_work_is_one_line(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], says: str
):
    assert invalid(monkeypatch, **variables) == says


def test_a_misspelled_setting_is_named_with_the_setting_it_may_mean():
    assert unknown_variables({"TASKHOOK_DATABSE_URL": "sqlite:///x.db", "PATH": "/bin"}) == [
        "TASKHOOK_DATABSE_URL is not a setting; did you mean TASKHOOK_DATABASE_URL?"
    ]
    assert unknown_variables({"TASKHOOK_ZZZ": "1"}) == [
        "TASKHOOK_ZZZ is not a setting and is ignored"
    ]


def test_settings_and_the_variables_taskhook_reads_otherwise_are_known():
    environ = {name: "1" for name in setting_names() | OTHER_VARIABLES}
    environ |= {"taskhook_port": "8000", "TASKHOOK_TEST_POSTGRES_URL": "x", "TASKHOOK_BENCH_X": "1"}
    assert unknown_variables(environ) == []


def test_every_taskhook_variable_the_repository_names_is_known():
    """A variable the code, the scripts, the docs or the tests use is never
    warned about: a new one is a setting, or joins OTHER_VARIABLES."""
    named: set[str] = set()
    for top in ROOT.iterdir():
        if top.name in {".venv", ".git", "var"}:  # not the repository's own files
            continue
        for path in [top, *top.rglob("*")] if top.is_dir() else [top]:
            if path.suffix not in SCANNED or not path.is_file():
                continue
            if path in NAMING_UNKNOWN_VARIABLES:
                continue
            text = WARNED_ABOUT.sub("", path.read_text(errors="replace"))
            named |= set(TASKHOOK_NAME.findall(text))
    assert {"TASKHOOK_DATABASE_URL", "TASKHOOK_BEAT_SCHEDULE", "TASKHOOK_TEST_REDIS_URL"} <= named
    assert unknown_variables(dict.fromkeys(named, "1")) == []


ROOT = Path(__file__).resolve().parents[2]
#: A variable's name as the repository writes it (not a Python name such as _TASKHOOK_X).
TASKHOOK_NAME = re.compile(r"\bTASKHOOK_[A-Z0-9_]*[A-Z0-9]\b")
#: A warning the docs show, about a name that is unknown on purpose.
WARNED_ABOUT = re.compile(r"TASKHOOK_\w+ is not a setting")
SCANNED = {".py", ".md", ".sh", ".yml", ".yaml", ".toml", ".json", ""}
#: The tests that set unknown names on purpose, to see them warned about.
NAMING_UNKNOWN_VARIABLES = {
    Path(__file__).resolve(),
    ROOT / "tests" / "e2e" / "test_startup_errors.py",
}
