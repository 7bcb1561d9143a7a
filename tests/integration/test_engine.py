"""The engines taskhook makes, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError

from models.db import session_scope
from models.tables import Workspace
from tests.conftest import Store


def test_a_failed_statement_never_shows_its_parameters(store: Store):
    """A statement's parameters are a request's values (a title, a
    description): an error message, and so a log line, must not carry them."""
    store.workspace("acme")

    with pytest.raises(IntegrityError) as failed, session_scope(store.sessions) as session:
        session.add(Workspace(slug="acme", name="a title nobody may log", task_prefix="X"))

    assert "a title nobody may log" not in str(failed.value)
    assert "SQL parameters hidden" in str(failed.value)
