"""The Celery app: at-least-once delivery, two queues, and the sweeper's schedule.

``celery -A worker worker -Q deliveries,operator`` runs it. Broker, result
backend and database come from the settings (``TASKHOOK_BROKER_URL``,
``TASKHOOK_DATABASE_URL``, ...). Nothing connects at import, and the
configuration itself is read only when Celery first needs it; each worker
process builds its engine in ``worker_process_init`` (prefork) or on first use
(threads, the default: one engine, whose pool the threads share).

At least once, and why each knob:

- ``task_acks_late``: a message is acknowledged after its task ran, so a
  worker that dies mid-task leaves it to be delivered again;
- ``task_reject_on_worker_lost``: ... including when the pool child is killed;
- ``worker_prefetch_multiplier=1``: a worker holds one message beyond the one
  it runs, so a dying worker strands little;
- a Redis ``visibility_timeout`` above the task time limit (settings check
  it): a message is not handed to a second worker while the first still runs;
- on RabbitMQ, quorum queues, publisher confirms and a ``consumer_timeout``
  above what a worker may hold a message (``models.broker.connection``,
  checked at start);
- the sweeper (beat) re-sends what the broker lost altogether, and a
  delivery whose attempts keep dying is parked (``models.inbox.park_lost``).

Running twice is harmless by construction (``worker.processing``).

At its start a worker (or beat) checks its settings and connects once to its
database and broker (beat: its broker); a mistake is one line on stderr and
exit code 1 (``models.startup``), before the worker says "ready".
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from celery import Celery
from celery.apps.beat import Beat
from celery.apps.worker import Worker, install_worker_term_handler
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    celeryd_init,
    import_modules,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutting_down,
)
from celery.utils.log import mlevel

from models import logs, startup, tracing
from models.broker import filesystem_transport
from models.broker.connection import (
    broker_queues,
    broker_transport,
    broker_transport_options,
    result_backend,
)
from models.broker.messages import (
    CATCH_UP,
    DELIVERIES_QUEUE,
    OPERATOR_QUEUE,
    PROCESS_DELIVERIES,
    PROCESS_DELIVERY,
    PRUNE,
    RELEASE_IDENTITY,
    SWEEP,
)
from models.broker.versions import stamp_every_message
from models.settings import Settings
from worker import runtime

#: The modules whose tasks a worker registers (imported by the worker, not here).
TASK_MODULES = ("worker.tasks", "worker.operator", "worker.catchup.tasks", "worker.retention")

#: Every message by name to its queue. Senders may not have the task imported
#: (the ingress, the CLI), so routing is by name.
TASK_ROUTES = {
    PROCESS_DELIVERY: {"queue": DELIVERIES_QUEUE},
    PROCESS_DELIVERIES: {"queue": DELIVERIES_QUEUE},
    SWEEP: {"queue": DELIVERIES_QUEUE},
    RELEASE_IDENTITY: {"queue": OPERATOR_QUEUE},
    CATCH_UP: {"queue": OPERATOR_QUEUE},
    PRUNE: {"queue": OPERATOR_QUEUE},
}


def _beat_schedule(settings: Settings) -> dict[str, Any]:
    schedule: dict[str, Any] = {
        "sweep-the-inbox": {
            "task": SWEEP,
            "schedule": settings.sweep_interval_seconds,
            # A sweep that waited a whole interval in the queue is stale:
            # the next one is already on its way.
            "options": {"expires": settings.sweep_interval_seconds},
        }
    }
    if settings.catchup_interval_seconds > 0:
        schedule["catch-up-from-delivery-logs"] = {
            "task": CATCH_UP,
            "schedule": settings.catchup_interval_seconds,
            "options": {"expires": settings.catchup_interval_seconds},
        }
    if settings.retention_interval_seconds > 0:
        schedule["prune-the-inbox"] = {
            "task": PRUNE,
            "schedule": settings.retention_interval_seconds,
            "options": {"expires": settings.retention_interval_seconds},
        }
    return schedule


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration for ``settings``."""
    time_limit = settings.task_time_limit_seconds
    backend = result_backend(settings)
    if backend.startswith("file://"):
        # Celery's file backend writes a probe into its folder when built and
        # makes no folder: this is where the worker, beat and the CLI open it.
        Path(backend.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    return {
        "broker_url": settings.broker_url,
        "broker_transport": broker_transport(settings),
        "broker_transport_options": broker_transport_options(settings),
        "broker_connection_retry_on_startup": True,
        "result_backend": backend,
        # Only the operator's tasks leave a result (for the CLI); a result per
        # delivery would be a write per delivery that nobody reads.
        "task_ignore_result": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # On a lost broker connection, stop late-acked tasks: their messages
        # come back, and a second run is harmless.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # The pool and its size are settings, so the Procfile, the benchmarks
        # and a user's own command line all start the same worker.
        "worker_pool": settings.worker_pool,
        "worker_concurrency": settings.worker_concurrency,
        # Celery's timer thread sleeps this long between looks at its schedule,
        # and a warm shutdown waits for it to wake: at Celery's 1 s, a second of
        # the 5 s honcho gives a process after SIGTERM (taskhook start).
        "worker_timer_precision": 0.2,
        # Under prefork the soft limit raises inside the task, which retries it
        # like a database error, and the hard limit kills what ignores it. The
        # threads pool enforces neither; there each PostgreSQL statement is cut
        # off at the limit instead (``worker.runtime``).
        "task_time_limit": time_limit,
        "task_soft_time_limit": time_limit * 0.9,
        "task_routes": TASK_ROUTES,
        "task_queues": broker_queues(settings),
        "task_default_queue": DELIVERIES_QUEUE,
        "beat_schedule": _beat_schedule(settings),
        "enable_utc": True,
        "timezone": "UTC",
    }


def make_celery_app(settings: Settings | None = None) -> Celery:
    """A Celery app for ``settings`` (the process's settings when None).

    The configuration is a promise Celery keeps on first use, so building the
    app reads no settings and creates no broker folders.
    """
    app = Celery("taskhook", include=list(TASK_MODULES), set_as_current=settings is None)
    # Whatever it sends -- the CLI, beat, a task's retry -- says its version.
    stamp_every_message()
    # The process's settings are read when Celery first needs its configuration
    # (``celery worker`` does while it parses its options): a bad value is one
    # line and exit 1 there (models.startup), not a traceback from Celery's CLI.
    app.add_defaults(lambda: celery_config(settings or startup.service_settings()))
    app.Beat = app.subclass_with_self(_Beat)
    app.Worker = app.subclass_with_self(_Worker)
    return app


@celeryd_init.connect
def _worker_reaches_its_stores(sender: str | None = None, **_: object) -> None:
    logs.set_process_role(sender or "worker")  # its node name: deliveries@host, live@host
    # Before the worker connects or says "ready": its database and its broker
    # answer, or one line and exit 1. A worker with beat embedded (-B) is
    # checked once, here.
    global _checked
    if logs.wants_json():  # before Celery's first warning (running as root, say)
        logs.install_json_handler()
    startup.service_ready(runtime.settings())
    _checked = True


def _beat_reaches_its_broker(**_: object) -> None:
    # Beat only sends messages; the database is the worker's. Connected to
    # import_modules below, not beat_init: beat logs "Starting..." before that.
    if not _checked:
        logs.set_process_role("beat")
        startup.service_ready(runtime.settings(), database=False)


#: Whether this process checked its database and broker at its start already.
_checked = False


@worker_init.connect
def _declare_every_queue(sender: Any = None, **_: object) -> None:
    # A worker declares the queues it consumes; Celery's delayed delivery then
    # binds every queue the app knows to its exchanges, and a queue no process
    # declared yet (the operator's, on a fresh virtual host, when this worker
    # takes only deliveries) would fail that step. So each worker on RabbitMQ
    # declares them all, before its consumer starts.
    settings = runtime.settings()
    if not settings.uses_rabbitmq or sender is None:
        return
    with sender.app.connection_for_write() as connection:
        for queue in broker_queues(settings):
            queue(connection.default_channel).declare()


@worker_init.connect
def _trace_the_threads(sender: Any = None, **_: object) -> None:
    # Threads and solo run tasks in this process: traced from here. Prefork's
    # children start their own after the fork (below): the span exporter's
    # thread does not survive one.
    if "prefork" not in str(getattr(sender, "pool_cls", "")):
        tracing.start("worker")


@worker_process_init.connect
def _build_engine_in_the_child(**_: object) -> None:
    # After the fork: trace from this process (before its engine, which the
    # SQLAlchemy instrumentation then sees), drop (without closing) anything
    # inherited from the parent, then connect from this process.
    tracing.start("worker")
    runtime.reset(close=False)
    runtime.sessions()


@worker_process_shutdown.connect
def _dispose_engine(**_: object) -> None:
    runtime.reset()


@worker_shutting_down.connect
def _said_shutting_down(sender: str | None = None, how: str = "Warm", **_: object) -> None:
    # Celery says it with a bare write, from its signal handler; with JSON
    # lines so do we (logging's locks are not for signal handlers).
    if logs.wants_json():
        logs.say("celery.worker", f"worker: {how} shutdown (MainProcess)")


@worker_shutting_down.connect
def _stop_waiting_for_messages(**_: object) -> None:
    # Sent from the SIGTERM handler. On the embedded broker Celery's loop
    # would wait up to 2 s for a message, twice, before it stops: honcho kills
    # at 5 s (models.broker.filesystem_transport explains). A no-op elsewhere.
    filesystem_transport.stop_waiting()


#: Celery's loggers of its INFO lines for every task: "received"
#: (``celery.worker.strategy``) and "succeeded" (``celery.app.trace``).
PER_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


class _Beat(Beat):
    """``celery beat``, whose start-up banner (printed to stdout, before any
    handler exists) becomes one log line when the lines are JSON."""

    def __init__(self, *args: Any, quiet: bool = False, **kwargs: Any) -> None:
        self.json_lines = logs.wants_json()
        if self.json_lines:
            logs.install_json_handler()
        super().__init__(*args, quiet=quiet or self.json_lines, **kwargs)

    def run(self) -> None:
        if self.json_lines:
            logging.getLogger("celery.beat").info("celery beat is starting")
        super().run()


class _Worker(Worker):
    """``celery worker``, whose banner and "Warm shutdown" (printed to the
    terminal, past every handler) are log lines when the lines are JSON."""

    def emit_banner(self) -> None:
        if not logs.wants_json():
            return super().emit_banner()
        logging.getLogger("celery.worker").info(
            "%s starting", self.hostname, extra={"banner": self.startup_info(artlines=False)}
        )

    def install_platform_tweaks(self, worker: Any) -> None:
        super().install_platform_tweaks(worker)
        if logs.wants_json():
            install_worker_term_handler(worker, verbose=False)  # said by _said_shutting_down


@after_setup_logger.connect
@after_setup_task_logger.connect
def _json_lines(logger: logging.Logger | None = None, **_: object) -> None:
    # TASKHOOK_LOG_FORMAT=json: the handlers Celery just made write JSON
    # lines (models.logs), the task logger's as well as the root's.
    if logger is not None and logs.wants_json():
        logs.use_json_on(logger)


@after_setup_logger.connect
def _per_task_lines(loglevel: int | str | None = None, **_: object) -> None:
    # TASKHOOK_WORKER_LOG_EACH_TASK=false: Celery decides whether to log those
    # lines once, from these loggers' levels, when it builds its consumer and
    # tracers (after this signal), so at WARNING they cost nothing. What stays:
    # failures ("raised unexpected", ERROR, from celery.app.trace), rejections
    # (WARNING), and each retry ("Task ...[id] retry: ...", INFO, from
    # celery.worker.request). --loglevel DEBUG brings every line back.
    if runtime.settings().worker_log_each_task:
        return
    if loglevel is not None and mlevel(loglevel) <= logging.DEBUG:
        return
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


app = make_celery_app()
# When the process's app loads its task modules: a worker does after it was
# checked (celeryd_init), beat before it logs a line (``celery beat``).
import_modules.connect(_beat_reaches_its_broker, sender=app)
