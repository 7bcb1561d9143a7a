"""The engines taskhook makes, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from models.db import session_scope, transaction
from models.tables import Workspace
from tests.support.stores import Store


def test_a_failed_statement_never_shows_its_parameters(store: Store):
    """A statement's parameters are a request's values (a title, a
    description): an error message, and so a log line, must not carry them."""
    store.workspace("acme")

    with pytest.raises(IntegrityError) as failed, session_scope(store.sessions) as session:
        session.add(Workspace(slug="acme", name="a title nobody may log", task_prefix="X"))

    assert "a title nobody may log" not in str(failed.value)
    assert "SQL parameters hidden" in str(failed.value)


def test_a_named_transaction_commits_its_writes_before_the_unit_of_work_ends(store: Store):
    """The create's insert must be durable before its settlement begins: a
    transaction block commits on leaving, while the unit of work goes on."""
    with session_scope(store.sessions) as session:
        with transaction(session, "the first write"):
            session.add(Workspace(slug="first", name="First", task_prefix="F"))
        with session_scope(store.sessions) as other:  # another connection sees it now
            assert other.scalar(select(Workspace.slug).where(Workspace.slug == "first"))
        session.add(Workspace(slug="second", name="Second", task_prefix="S"))

    with session_scope(store.sessions) as session:
        assert set(session.scalars(select(Workspace.slug))) == {"first", "second"}


def test_a_named_transaction_that_fails_rolls_back_and_says_which_it_was(store: Store):
    with pytest.raises(IntegrityError) as failed, session_scope(store.sessions) as session:
        session.add(Workspace(slug="kept", name="Kept", task_prefix="K"))
        session.commit()
        with transaction(session, "the duplicate's insert"):
            session.add(Workspace(slug="kept", name="Again", task_prefix="A"))

    assert "in the transaction: the duplicate's insert" in failed.value.__notes__
    with session_scope(store.sessions) as session:
        assert list(session.scalars(select(Workspace.name))) == ["Kept"]
