"""Settings read from TASKHOOK_ variables: what a default is derived from."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from models.settings import Settings


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
