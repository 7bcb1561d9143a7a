"""The ``taskhook`` CLI against real databases (SQLite and PostgreSQL), through click.

Commands that send a Celery message (``release``, ``deliveries replay``,
``deliveries replay-matching``) get a fake app through
``worker.cli.runtime.load_celery_app`` (the ``celery`` fixture): it records what would
be sent and answers as the operator worker would, running the real service
function against the same database (``operator_worker`` in
tests/support/cli.py). The round trip through a real broker and a real
operator worker is test_round_trip.py's, and the end-to-end tests'.
"""

from __future__ import annotations

import pytest

from tests.support.cli import FakeApp
from worker.cli import runtime as cli_runtime


@pytest.fixture
def celery(monkeypatch: pytest.MonkeyPatch) -> FakeApp:
    app = FakeApp()
    monkeypatch.setattr(cli_runtime, "load_celery_app", lambda: app)
    return app
