"""TASKHOOK_WORKER_LOG_EACH_TASK: Celery's per-task INFO lines, on or off."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from celery.app import trace
from celery.worker import strategy

from models.settings import Settings
from worker import runtime
from worker.celery_app import PER_TASK_LOGGERS, _per_task_lines


@pytest.fixture(autouse=True)
def _restored_levels() -> Iterator[None]:
    levels = {name: logging.getLogger(name).level for name in PER_TASK_LOGGERS}
    yield
    runtime.reset()
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_celery_still_logs_them_through_these_loggers():
    # When this fails, Celery moved its "received"/"succeeded" lines to other loggers.
    assert {strategy.logger.name, trace.logger.name} == set(PER_TASK_LOGGERS)


@pytest.mark.parametrize(
    ("log_each_task", "loglevel", "quiet"),
    [(True, logging.INFO, False), (False, logging.INFO, True), (False, "DEBUG", False)],
)
def test_they_go_only_when_turned_off_and_not_debugging(log_each_task, loglevel, quiet):
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    runtime.use(settings=Settings(worker_log_each_task=log_each_task))
    _per_task_lines(loglevel=loglevel)
    levels = {logging.getLogger(name).level for name in PER_TASK_LOGGERS}
    assert levels == ({logging.WARNING} if quiet else {logging.NOTSET})
