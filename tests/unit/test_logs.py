"""models.logs: JSON lines and the delivery ids they carry."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import sys
import threading

import pytest

from models import logs, startup


@pytest.fixture
def lines() -> io.StringIO:
    """A logger whose lines are JSON, written to a buffer."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logs.JsonLines())
    logger = logging.getLogger("test.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield buffer
    logger.removeHandler(handler)


def read(buffer: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_a_line_has_time_level_process_logger_and_message(lines):
    logs.set_process_role("ingress")
    logging.getLogger("test.logs").warning("hello %s", "there")

    (line,) = read(lines)
    assert line["time"].endswith("+00:00") and "T" in line["time"]
    assert (line["level"], line["process"], line["logger"], line["message"]) == (
        "WARNING",
        "ingress",
        "test.logs",
        "hello there",
    )
    assert isinstance(line["pid"], int)


def test_lines_inside_a_delivery_carry_its_ids_and_those_bound_later(lines):
    log = logging.getLogger("test.logs")
    with logs.delivery_context(inbox_id=7, source=None):
        log.info("claimed")
        logs.bind(task=12, external_id="jira:PROJ-1", workspace=None)
        log.info("created")
    log.info("after")
    logs.bind(task=99)  # outside a delivery: nothing to add to

    claimed, created, after = read(lines)
    assert claimed["inbox_id"] == 7 and "source" not in claimed and "task" not in claimed
    assert (created["task"], created["external_id"]) == (12, "jira:PROJ-1")
    assert "workspace" not in created
    assert "inbox_id" not in after and logs.current_ids() == {}


def test_two_threads_never_mix_their_deliveries_ids(lines):
    log = logging.getLogger("test.logs")
    both_inside = threading.Barrier(2)

    def run(pk: int) -> None:
        with logs.delivery_context(inbox_id=pk):
            both_inside.wait(timeout=5)
            logs.bind(task=pk * 10)
            both_inside.wait(timeout=5)
            log.info("delivery %s", pk)

    threads = [threading.Thread(target=run, args=(pk,)) for pk in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted((line["inbox_id"], line["task"]) for line in read(lines)) == [(1, 10), (2, 20)]


def test_extra_fields_and_an_exception_are_in_the_object(lines):
    log = logging.getLogger("test.logs")
    try:
        raise ValueError("bad value")
    except ValueError:
        log.exception("it failed", extra={"outcome": "dead"})

    (line,) = read(lines)
    assert line["outcome"] == "dead"
    assert "ValueError: bad value" in line["exc_info"]


@pytest.mark.parametrize(
    ("value", "json_lines"), [("json", True), (" JSON ", True), ("text", False), (None, False)]
)
def test_json_is_chosen_by_the_setting(monkeypatch, value, json_lines):
    monkeypatch.delenv("TASKHOOK_LOG_FORMAT", raising=False)
    assert logs.wants_json(value) is json_lines


def test_the_environment_chooses_before_the_settings_are_read(monkeypatch):
    monkeypatch.setenv("TASKHOOK_LOG_FORMAT", "json")
    assert logs.wants_json() is True


def test_uvicorns_config_writes_json_lines_through_one_handler():
    config = logs.uvicorn_log_config("debug")
    logging.config.dictConfig(config)  # accepted as logging's own config
    root = logging.getLogger()
    try:
        assert any(isinstance(handler.formatter, logs.JsonLines) for handler in root.handlers)
        assert root.level == logging.DEBUG
    finally:
        for handler in list(root.handlers):
            if isinstance(handler.formatter, logs.JsonLines):
                root.removeHandler(handler)
        root.setLevel(logging.WARNING)


def test_a_process_that_cannot_start_says_so_in_one_json_line(monkeypatch, capsys):
    monkeypatch.setenv("TASKHOOK_LOG_FORMAT", "json")
    monkeypatch.setattr(sys, "__stderr__", sys.stderr)  # capsys captures sys.stderr only
    with pytest.raises(SystemExit) as exited:
        startup.refuse(startup.CannotStart("TASKHOOK_LEASE_SECONDS='abc': must be a number"))

    (line,) = capsys.readouterr().err.splitlines()
    said = json.loads(line)
    assert exited.value.code == 1
    assert (said["level"], said["logger"]) == ("CRITICAL", "taskhook.startup")
    assert said["message"] == "TASKHOOK_LEASE_SECONDS='abc': must be a number"


def test_without_json_it_is_the_plain_line(monkeypatch, capsys):
    monkeypatch.delenv("TASKHOOK_LOG_FORMAT", raising=False)
    monkeypatch.setattr(sys, "__stderr__", sys.stderr)
    with pytest.raises(SystemExit):
        startup.refuse(startup.CannotStart("no broker"))

    assert capsys.readouterr().err == "taskhook: no broker\n"
