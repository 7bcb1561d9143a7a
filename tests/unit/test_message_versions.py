"""Every message says its version, and every task takes what it does not
know (models.broker.versions): one release back, both ways."""

from __future__ import annotations

import inspect
import logging
import uuid
from queue import Empty

import pytest

from models.broker import versions
from models.broker.messages import PROCESS_DELIVERY, SWEEP
from models.broker.versions import HEADER, MESSAGE_VERSION, UNVERSIONED, version_of
from models.settings import Settings
from worker.celery_app import make_celery_app


def test_a_message_without_the_header_is_the_first_releases():
    assert version_of(None) == version_of({}) == UNVERSIONED == 1
    assert version_of({HEADER: 2}) == 2
    assert version_of({HEADER: "3"}) == 3
    assert version_of({HEADER: "not a number"}) == UNVERSIONED


def test_what_the_worker_app_sends_carries_the_version():
    broker = f"memory://versions-{uuid.uuid4().hex}"
    app = make_celery_app(Settings(broker_url=broker))
    app.send_task(PROCESS_DELIVERY, args=[7], queue="deliveries")
    app.send_task(SWEEP, queue="deliveries")  # as beat sends it

    seen = []
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue("deliveries")
        while True:
            try:
                message = queue.get(timeout=0.2)
            except Empty:
                break
            seen.append((message.headers["task"], message.headers.get(HEADER)))
            message.ack()
        queue.close()
    assert seen == [(PROCESS_DELIVERY, MESSAGE_VERSION), (SWEEP, MESSAGE_VERSION)]


def test_every_task_takes_keyword_arguments_it_does_not_know():
    app = make_celery_app(Settings(broker_url="memory://"))
    app.loader.import_default_modules()
    ours = {name: task for name, task in app.tasks.items() if name.startswith("taskhook.")}
    assert len(ours) >= 6, sorted(ours)  # every module of TASK_MODULES registered
    for name, task in ours.items():
        parameters = inspect.signature(task.run).parameters.values()
        assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters), name


def test_an_unknown_argument_or_a_newer_message_is_said_once(caplog: pytest.LogCaptureFixture):
    versions._noticed.clear()
    caplog.set_level(logging.INFO, logger=versions.__name__)

    for _ in range(3):
        versions.notice_unknown("taskhook.x", {"later": 1}, {HEADER: MESSAGE_VERSION + 1})
        versions.notice_unknown("taskhook.x", {}, {HEADER: MESSAGE_VERSION + 1})
        versions.notice_unknown("taskhook.x", {}, {HEADER: MESSAGE_VERSION})
        versions.notice_unknown("taskhook.x", {}, None)

    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "taskhook.x: ignored arguments this release does not know (later), "
        f"from a message of version {MESSAGE_VERSION + 1}",
        f"taskhook.x: a message of version {MESSAGE_VERSION + 1}, newer than this "
        f"release's {MESSAGE_VERSION}: a newer release runs beside this one",
    ]
