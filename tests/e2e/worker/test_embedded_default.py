"""The embedded default: a worker on kombu's filesystem broker and a SQLite file.

No servers: this is what ``scripts/run`` gives a fresh machine. The broker
folder and the database live in the test's temporary directory; everything
else is the default settings (only the timings are short).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from models.broker.messages import PROCESS_DELIVERY, RELEASE_IDENTITY
from models.db import make_engine, make_session_factory
from models.settings import Settings
from tests.support.feeds import delivery, make_feed, store_fixture, tasks_of
from tests.support.processes import StartWorker, finished, wait_until
from worker.celery_app import make_celery_app

pytestmark = pytest.mark.e2e


def test_the_embedded_default_turns_deliveries_into_tasks_and_releases(
    start_embedded_worker: StartWorker, sqlite_template: Path, tmp_path: Path
):
    database = tmp_path / "taskhook.db"  # where start_embedded_worker points the worker
    shutil.copyfile(sqlite_template, database)
    database_url = f"sqlite:///{database}"
    broker_folder = tmp_path / "broker"
    engine = make_engine(database_url)
    sessions = make_session_factory(engine)
    settings = Settings(database_url=database_url, broker_folder=broker_folder)
    client = make_celery_app(settings)
    try:
        feed = make_feed(sessions)
        sent = store_fixture(sessions, feed, "github", "issues__opened")
        never_sent = store_fixture(sessions, feed, "jira", "jira_issue_created__cloud")
        worker = start_embedded_worker("embedded", beat=True)

        client.send_task(PROCESS_DELIVERY, args=[sent])
        wait_until(finished(sessions, sent, never_sent), timeout=30, what="both", logs=[worker])

        assert {task.external_id for task in tasks_of(sessions, feed.workspace_id)} == {
            "gh-issue/Codertocat/Hello-World#1",
            "jira:TES-41",
        }
        assert delivery(sessions, never_sent).outcome == "created"  # the sweeper's doing
        holder = delivery(sessions, never_sent).task_id
        answer = client.send_task(
            RELEASE_IDENTITY, args=[feed.workspace_id, "jira:TES-41", "ops", "demo reset", holder]
        ).get(timeout=30)
        assert answer["released"] is True
    finally:
        client.close()
        engine.dispose()
