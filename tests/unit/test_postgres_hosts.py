"""Several PostgreSQL hosts in one URL (a primary and its standbys): each form
an operator may write reaches SQLAlchemy, and libpq, as the same host list."""

from __future__ import annotations

import os

import psycopg.conninfo
import pytest
from sqlalchemy.engine import make_url

from models.db import libpq_conninfo, make_engine
from models.postgres_hosts import spread_hosts
from models.settings import Settings, for_people

READ_WRITE = "target_session_attrs=read-write"
#: What libpq must be given, whichever form the URL took.
EXPECTED = {
    "dbname": "taskhook",
    "user": "app",
    "password": "s3cr:t@",
    "host": "10.0.0.1,10.0.0.2",
    "port": "5432,5433",
    "target_session_attrs": "read-write",
}
FORMS = [
    # libpq's own URI form: the hosts in the authority.
    f"postgresql+psycopg://app:s3cr%3At%40@10.0.0.1:5432,10.0.0.2:5433/taskhook?{READ_WRITE}",
    # One host parameter listing them, as libpq's documentation writes it.
    f"postgresql+psycopg://app:s3cr%3At%40@/taskhook?host=10.0.0.1:5432,10.0.0.2:5433&{READ_WRITE}",
    # The forms SQLAlchemy reads as they are.
    f"postgresql+psycopg://app:s3cr%3At%40@/taskhook?host=10.0.0.1:5432&host=10.0.0.2:5433&{READ_WRITE}",
    f"postgresql://app:s3cr%3At%40@/taskhook?host=10.0.0.1,10.0.0.2&port=5432,5433&{READ_WRITE}",
]


@pytest.fixture(autouse=True)
def no_taskhook_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TASKHOOK_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("url", FORMS)
def test_every_form_gives_libpq_the_same_hosts_and_ports(url: str):
    conninfo = libpq_conninfo(Settings(database_url=url).database_url)
    assert psycopg.conninfo.conninfo_to_dict(conninfo) == EXPECTED


@pytest.mark.parametrize("url", FORMS)
def test_the_engine_connects_as_libpq_would(url: str):
    engine = make_engine(url)
    _, options = engine.dialect.create_connect_args(engine.url)
    options.pop("context", None)  # psycopg's adapters, not a libpq keyword
    assert {k: str(v) for k, v in options.items()} == EXPECTED


def test_a_url_rendered_as_a_string_would_name_one_wrong_host():
    """Why the ingress's own connections go through libpq_conninfo: the URL
    rendered back for libpq keeps one host, named with its port."""
    url = make_url(spread_hosts(FORMS[0])).set(drivername="postgresql")
    rendered = psycopg.conninfo.conninfo_to_dict(url.render_as_string(hide_password=False))
    assert rendered["host"] != EXPECTED["host"]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app:pw@db.internal:5432/taskhook",
        "postgresql+psycopg://app@/taskhook?host=/var/run/postgresql",
        "sqlite:///./var/taskhook.db",
    ],
)
def test_one_host_is_left_as_it_is(url: str):
    assert spread_hosts(url) == url


def test_a_single_host_url_still_gives_its_port():
    conninfo = libpq_conninfo("postgresql+psycopg://app:pw@db.internal:6543/taskhook")
    assert psycopg.conninfo.conninfo_to_dict(conninfo) == {
        "host": "db.internal",
        "port": "6543",
        "dbname": "taskhook",
        "user": "app",
        "password": "pw",
    }


def test_a_password_given_as_a_parameter_is_not_printed():
    shown = for_people("postgresql+psycopg://app@/taskhook?host=h1,h2&password=hunter2&port=1,2")
    assert "hunter2" not in shown and "password=***" in shown
