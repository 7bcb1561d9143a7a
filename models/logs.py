"""Log lines a machine can read: one JSON object a line, carrying the ids
an operator searches by (docs/runbook.md, "Follow one delivery").

``TASKHOOK_LOG_FORMAT=json`` turns it on in every process: the ingress
(``ingest.server`` hands uvicorn :func:`uvicorn_log_config`), the Celery
worker and beat (``worker.celery_app`` calls :func:`use_json_on` once Celery
has made its handlers) and the CLI (:func:`configure_cli`). Plain text stays
the default, for a person at a terminal.

Which delivery a line is about comes from a context variable, not from the
call: the worker binds a delivery's ids once (:func:`delivery_context`) and
every line logged while it runs carries them, the library's lines too.
Each Celery thread and each asyncio task has a context of its own, so two
deliveries running side by side never mix their ids.

A line carries ids, never a credential: what is logged is what the code
already logs, and those messages are kept free of secrets
(tests/e2e/test_canaries.py reads every line at DEBUG, in both formats).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace
from pythonjsonlogger.json import JsonFormatter

#: The ids of the delivery the current thread or task is working on.
_DELIVERY: ContextVar[dict[str, Any] | None] = ContextVar("taskhook_delivery", default=None)

#: What a process calls itself in its lines (``process``): ``ingress``,
#: ``worker``, ``beat``, ``cli``; set once when the process starts.
_process_role = "taskhook"

#: The logger of the one line per delivery each process writes when
#: ``TASKHOOK_LOG_EACH_DELIVERY`` is on: "stored" (ingress), "recorded" (worker).
DELIVERIES = logging.getLogger("taskhook.deliveries")


@contextmanager
def delivery_context(**ids: Any) -> Iterator[None]:
    """Every line logged in the block carries ``ids`` (None values left out);
    :func:`bind` adds more as they become known."""
    token = _DELIVERY.set({key: value for key, value in ids.items() if value is not None})
    try:
        yield
    finally:
        _DELIVERY.reset(token)


def bind(**ids: Any) -> None:
    """Adds ``ids`` to the current delivery's context; outside one, does nothing."""
    current = _DELIVERY.get()
    if current is not None:
        current.update((key, value) for key, value in ids.items() if value is not None)


def current_ids() -> dict[str, Any]:
    """The current delivery's ids (a copy); empty outside one."""
    return dict(_DELIVERY.get() or {})


class JsonLines(JsonFormatter):
    """One JSON object a line: ``time`` (UTC, ISO 8601), ``level``,
    ``process``, ``pid``, ``logger``, ``message``, the current delivery's ids,
    ``trace_id`` and ``span_id`` inside a span, the fields a call passed as
    ``extra``, and ``exc_info`` when there is one."""

    def __init__(self) -> None:
        super().__init__(json_ensure_ascii=False)

    def add_fields(
        self, log_record: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_record["time"] = datetime.fromtimestamp(record.created, UTC).isoformat(
            timespec="milliseconds"
        )
        log_record["level"] = record.levelname
        log_record["process"] = _process_role
        log_record["pid"] = record.process
        log_record["logger"] = record.name
        log_record["message"] = record.getMessage()
        log_record.update(_DELIVERY.get() or {})
        # The trace the line belongs to, when tracing is on (models.tracing).
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            log_record["trace_id"] = format(span.trace_id, "032x")
            log_record["span_id"] = format(span.span_id, "016x")
        super().add_fields(log_record, record, message_dict)
        # JsonFormatter copies the record's own attributes asked for in its
        # format string; none are, so only ``extra`` and exc_info remain.
        log_record.pop("color_message", None)


def wants_json(log_format: str | None = None) -> bool:
    """Whether this process logs JSON: the setting, else the environment
    (a process may log before its settings are read)."""
    chosen = log_format or os.environ.get("TASKHOOK_LOG_FORMAT", "text")
    return chosen.strip().lower() == "json"


def set_process_role(role: str) -> None:
    global _process_role
    _process_role = role


def use_json_on(*loggers: logging.Logger) -> None:
    """Gives every handler of ``loggers`` (the root when none) the JSON format."""
    for logger in loggers or (logging.getLogger(),):
        for handler in logger.handlers:
            handler.setFormatter(JsonLines())


def install_json_handler() -> None:
    """A JSON handler on stderr for the root logger (once), and Python's
    warnings through it: a process that logs before its framework made its
    handlers (Celery warns about running as root first) is JSON from its
    first line."""
    root = logging.getLogger()
    if not any(isinstance(handler.formatter, JsonLines) for handler in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLines())
        root.addHandler(handler)
    logging.captureWarnings(True)


def json_line(logger: str, level: int, message: str) -> str:
    """One JSON line, formatted without a logger: for what a process says
    before its logging exists, or where logging may not run."""
    return JsonLines().format(logging.LogRecord(logger, level, __file__, 0, message, None, None))


def say(logger: str, message: str) -> None:
    """One INFO line written with a bare ``os.write``, without logging's
    locks: for a signal handler, which may interrupt a line being logged."""
    # Celery has swapped sys.stderr for a proxy by then: the descriptor itself.
    os.write(2, (json_line(logger, logging.INFO, message) + "\n").encode())


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """uvicorn's ``log_config`` for JSON lines: its loggers and the root (ours)
    write through one handler to stderr."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonLines}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": sys.stderr}
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            "uvicorn": {"level": level.upper()},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"level": "INFO"},
        },
    }


def configure_cli() -> None:
    """The CLI's warnings and errors as JSON lines on stderr, when asked for;
    its output (stdout) is the command's, untouched."""
    set_process_role("cli")
    if wants_json():
        install_json_handler()
