"""taskhook's one settings class: every knob is a ``TASKHOOK_``-prefixed variable.

The defaults give the embedded setup -- a SQLite file and a broker in files
under ``./var/``, no servers -- so a fresh checkout runs with nothing set.

One way to read them: a process reads the environment once, at its edge --
:func:`get_settings` for the ingress, the worker and beat, a fresh
``Settings()`` per command in the CLI (``worker.cli.runtime``), so that each
invocation sees the environment as it is then -- and passes them down as an
argument. Nothing below the edge reads the environment; a test injects its
own ``Settings`` where the edge would have read them.

Reading them checks them: a broker or a database taskhook does not run on
is refused here, by URL scheme, and :func:`invalid_settings` says any refusal
in one line that names the variable and what it takes; :func:`unknown_variables`
names the ``TASKHOOK_`` variables that are not settings. Each process says
those at its start (``models.startup``).

Settings are values only: they import no broker library and touch no disk.
What a broker URL means to kombu is ``models.broker.connection``'s; the
folders of the embedded setup are made where they are opened (the SQLite
file by ``models.db``, the broker's by its transport).
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

import annotated_types
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from models.postgres_hosts import spread_hosts

#: Deliveries one worker process runs at once, unless set: on PostgreSQL its
#: threads overlap their waits on the server; on SQLite's one write lock two
#: let one thread's Python run while the other writes, and more only queue.
DEFAULT_WORKER_CONCURRENCY = 4
SQLITE_WORKER_CONCURRENCY = 2

#: A retention setting beyond a century is a typo, not a policy.
MAX_RETENTION_DAYS = 36_500
#: TASKHOOK_INBOX_RETENTION_DAYS's least value but 0: longer than any provider
#: keeps a delivery it may send again (GitHub Enterprise Server: 7 days).
MIN_INBOX_RETENTION_DAYS = 8

#: The databases taskhook runs on, by URL scheme. ``postgresql://`` is taken
#: as ``postgresql+psycopg://``: psycopg (3) is the driver taskhook installs,
#: and SQLAlchemy would otherwise look for psycopg2.
DATABASE_SCHEMES = {
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite+pysqlite",
    "postgresql": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
}
#: The brokers taskhook runs on, by URL scheme (``models.broker.connection``):
#: the embedded one, Redis, RabbitMQ (``pyamqp`` is kombu's other name for
#: ``amqp``), and kombu's in-process one, which only tests can use.
BROKER_SCHEMES = ("filesystem", "redis", "rediss", "amqp", "amqps", "pyamqp", "memory")

#: ``TASKHOOK_`` variables that are not settings yet mean something: the
#: Procfile's beat schedule, the CLI's MCP token, scripts/lib.sh's virtualenv,
#: the worker's fail points (tests), the migration lint's squawk, and the test
#: suite's own switches. Every
#: other unknown name is warned about (:func:`unknown_variables`).
OTHER_VARIABLES = frozenset(
    {
        "TASKHOOK_BEAT_SCHEDULE",
        "TASKHOOK_MCP_TOKEN",
        "TASKHOOK_VENV",
        "TASKHOOK_FAILPOINT",
        "TASKHOOK_CONSOLE_SCREENSHOTS",
        "TASKHOOK_HOSTS_SOAK",
        "TASKHOOK_UPGRADE_SOAK",
        "TASKHOOK_FULL_MIGRATION_TEST",
        "TASKHOOK_SQUAWK",
    }
)
#: Prefixes of the test suite's and the benchmarks' variables.
OTHER_PREFIXES = ("TASKHOOK_TEST_", "TASKHOOK_BENCH_", "TASKHOOK_RELIABILITY_")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TASKHOOK_", extra="ignore")

    # --- stores ---------------------------------------------------------------------
    database_url: str = Field(
        default="sqlite:///./var/taskhook.db",
        description="SQLAlchemy URL of the task store: sqlite:///... or postgresql+psycopg://...",
    )
    database_pooler: Literal["none", "pgbouncer"] = Field(
        default="none",
        description="What stands between taskhook and PostgreSQL. pgbouncer: a PgBouncer in "
        "transaction mode (or any pooler that hands a server connection to another client "
        "between transactions), so taskhook keeps no state in a server session: no prepared "
        "statements, no statement_timeout startup option (set the role's default instead), "
        "and the LISTEN/NOTIFY listener on TASKHOOK_DATABASE_DIRECT_URL (docs/deploy.md, "
        '"Behind PgBouncer").',
    )
    database_direct_url: str | None = Field(
        default=None,
        description="A URL that reaches PostgreSQL itself, not through the pooler: the "
        "event streams' LISTEN/NOTIFY listener connects there, since a LISTEN lives in a "
        "server session. Unset: TASKHOOK_DATABASE_URL, or, with TASKHOOK_DATABASE_POOLER="
        "pgbouncer, no listener (streams poll every TASKHOOK_STREAM_POLL_SECONDS).",
    )
    sqlite_busy_timeout_ms: int = Field(
        default=5000, ge=0, description="How long a SQLite writer waits for the lock."
    )
    sqlite_synchronous: Literal["FULL", "NORMAL"] = Field(
        default="FULL",
        description="SQLite's PRAGMA synchronous (WAL mode). FULL (the default): every "
        "commit is fsynced, so a delivery answered 202 survives a power cut. NORMAL: a "
        "commit survives a process crash (kill -9), but a power cut or OS crash may undo "
        "the last commits before a checkpoint (the database stays consistent); no fsync "
        "per commit (docs/performance.md, §6).",
    )
    sqlite_writer_lock: bool = Field(
        default=True,
        description="Queue SQLite writers on a lock beside the database file, handed over "
        "within half a millisecond (models/sqlite_writer.py), rather than in SQLite's busy "
        "handler, which sleeps 1, 2, 5, 10 ... up to 100 ms between tries, blind to the lock "
        "coming free: with the ingress's and the worker's commits shared (docs/performance.md, "
        "§6) the lock is free most of the time, and those sleeps were most of a write's wait. "
        "false: SQLite's busy handler alone.",
    )
    broker_url: str = Field(
        default="filesystem://",
        description="Celery broker: filesystem:// (embedded, files under var/broker), "
        "redis://host:6379/0, or amqp://...",
    )
    result_backend_url: str | None = Field(
        default=None,
        description="Where operator tasks leave their results for the CLI; by default "
        "the broker's Redis, or files under var/results for the embedded broker.",
    )
    broker_folder: Path = Field(
        default=Path("var/broker"), description="Where the filesystem:// broker keeps messages."
    )

    # --- ingress --------------------------------------------------------------------
    host: str = Field(
        default="127.0.0.1", description="Where the ingress listens (the Procfile's web)."
    )
    port: int = Field(default=8000, ge=1, le=65535, description="The port the ingress listens on.")
    public_url: str = Field(
        default="",
        description="Where GitHub, GitLab and Jira reach the ingress; used to print webhook URLs. "
        "Unset, it is the ingress's own address: http://HOST:PORT (127.0.0.1 for a "
        "wildcard host).",
    )
    max_body_bytes: int = Field(
        default=25 * 1024 * 1024, gt=0, description="Largest delivery accepted (GitHub's cap)."
    )
    enqueue_timeout_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How long the ingress waits for the broker before answering anyway "
        "(the row is durable; the sweeper enqueues it later).",
    )
    relay_keys_per_message: int = Field(
        default=16,
        gt=0,
        le=100,
        description="Most inbox keys the relay puts in one worker message. Keys that arrive "
        "together (a burst) share messages, so the queue's own cost per message is paid once "
        "for several deliveries; a lone delivery still goes alone, at once.",
    )
    background_keys_per_message: int = Field(
        default=16,
        gt=0,
        le=100,
        description="Most inbox keys in one message on the background lane (a flood, a "
        "catch-up, a bulk replay). Each message costs a worker about what a task costs "
        "Celery, so more keys drain a flood faster; fewer make a live delivery that a "
        "worker of both lanes took wait less for a thread (docs/performance.md, "
        "sections 18 and 27).",
    )
    live_lane_rate: float = Field(
        default=50.0,
        gt=0,
        description="Deliveries a second one source may send on the live lane, sustained "
        "(per ingress process). A source above it is flooding: its deliveries go to the "
        "background lane until it has kept under this rate for a while, so its flood never "
        "stands in front of another source's deliveries (docs/architecture.md, "
        '"Fair share").',
    )
    live_lane_burst: int = Field(
        default=200,
        gt=0,
        description="Deliveries one source may send on the live lane at once, above its "
        "rate (TASKHOOK_LIVE_LANE_RATE), before it counts as flooding.",
    )

    source_cache_seconds: float = Field(
        default=5.0,
        ge=0,
        description="How long the ingress reuses what it read of a source -- its secrets, "
        "or that no enabled source has the name -- before reading it again; a source "
        "added, enabled or disabled, or a retired secret, takes effect within this time.",
    )
    retry_after_seconds: int = Field(
        default=5, ge=1, description="Retry-After of a 503 while the database is unreachable."
    )
    max_delivery_age_seconds: float = Field(
        default=24 * 3600,
        ge=0,
        description="Oldest delivery taken, for bodies that say when they were sent "
        "(Jira's timestamp): older ones are refused with 400, so a captured body cannot be "
        "replayed for ever. Jira's own retries come within minutes. 0 takes any age.",
    )
    metrics_token: str | None = Field(
        default=None,
        description="When set, /metrics answers only 'Authorization: Bearer <token>' "
        "(Prometheus: authorization.credentials); unset, it is open to whoever reaches "
        "the ingress.",
    )
    encryption_keys: SecretStr | None = Field(
        default=None,
        description="Keys that seal stored credentials (signing secrets, catch-up tokens, "
        "App private keys), comma-separated: the first seals, every one opens. Make one "
        "with `taskhook secrets new-key`; rotate with `taskhook secrets rotate` "
        "(docs/runbook.md). Unset: the lines of TASKHOOK_ENCRYPTION_KEY_FILE.",
    )
    encryption_key_file: str = Field(
        default="var/encryption.key",
        description="A file of keys, one a line, read when TASKHOOK_ENCRYPTION_KEYS is "
        "unset. `scripts/run` (and `taskhook secrets init`) makes it, mode 0600, when "
        "no key is set. With neither, a service refuses to start.",
    )
    max_api_body_bytes: int = Field(
        default=1024 * 1024,
        gt=0,
        description="Largest REST or MCP request body accepted (413 beyond it); the "
        "webhook routes take up to TASKHOOK_MAX_BODY_BYTES.",
    )
    max_event_streams: int = Field(
        default=1000, gt=0, description="Most event streams one ingress process keeps open."
    )
    max_event_streams_per_token: int = Field(
        default=10, gt=0, description="Most event streams one API token may hold open."
    )
    stream_listener: bool = Field(
        default=True,
        description="On PostgreSQL, wake the event streams with one LISTEN/NOTIFY "
        "listener per ingress process; off, every open stream polls every "
        "TASKHOOK_STREAM_POLL_SECONDS (as on SQLite).",
    )
    stream_poll_seconds: float = Field(
        default=0.5,
        gt=0,
        description="How often an event stream reads the database when nothing wakes it: "
        "on SQLite, or while the PostgreSQL listener is down or turned off.",
    )
    mcp_stream_seconds: float = Field(
        default=300.0,
        gt=0,
        description="When the MCP GET stream (idle in stateless mode) is closed; the "
        "client reconnects if it wants one.",
    )
    metrics_source_labels: bool = Field(
        default=False,
        description="Label taskhook_deliveries by source name. Off, the label is '-': "
        "default source names are guessable (WORKSPACE-github), and /metrics would list "
        "every one to an anonymous caller.",
    )

    # --- console and browsers -------------------------------------------------------
    console_session_hours: float = Field(
        default=8.0,
        gt=0,
        le=24 * 30,
        description="How long a console sign-in lasts (ingest/console); then the browser "
        "signs in again.",
    )
    console_sign_in_failures: int = Field(
        default=10,
        gt=0,
        le=10_000,
        description="Wrong tokens the console's sign-in takes from one client address, and "
        "for one token prefix (its first 10 characters), within "
        "TASKHOOK_CONSOLE_SIGN_IN_WINDOW_SECONDS; past them it answers 429 with Retry-After, "
        "whatever the token, until the oldest leaves the window. Counted in each ingress "
        "process's memory.",
    )
    console_sign_in_window_seconds: float = Field(
        default=300.0,
        gt=0,
        le=24 * 3600,
        description="The sliding window of TASKHOOK_CONSOLE_SIGN_IN_FAILURES.",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins (https://app.example.com, comma-separated) whose pages may call "
        "the REST API and its event stream from a browser. Unset, none may: the API sends no "
        "CORS headers. Each is an exact origin; '*' is refused.",
    )

    # --- ingress server -------------------------------------------------------------
    max_header_bytes: int = Field(
        default=64 * 1024,
        gt=0,
        description="Largest request head (request line and headers) the ingress reads; a "
        "longer one is answered 431 and closed before the app runs (ingest/server.py). "
        "GitHub and Jira send a few KiB.",
    )
    header_read_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="How long a request's head may take to arrive, from its first byte (from "
        "the connection, for a connection's first request); then 408 and closed.",
    )
    body_read_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How long a whole request, body included, may take to arrive, from its "
        "first byte; then 408 (unless the app has begun an answer) and closed. The largest "
        "body (TASKHOOK_MAX_BODY_BYTES) must come at about 1 MB/s.",
    )

    max_connections: int | None = Field(
        default=None,
        gt=0,
        description="Most connections the ingress holds at once (ingest/connections.py); "
        "past it a connection waits in the listen queue, and at it the connection waiting "
        "longest for a request head is answered 503 and closed to make room. Unset: the "
        "soft limit of open files (raised to the hard one at start) less 128 for the "
        "database, the broker and log files.",
    )

    # --- worker ---------------------------------------------------------------------
    worker_pool: Literal["threads", "prefork", "solo"] = Field(
        default="threads",
        description="Celery's execution pool for the deliveries worker. A delivery mostly "
        "waits on the database, so threads let one process overlap several.",
    )
    worker_concurrency: int | None = Field(
        default=None,
        gt=0,
        description="Deliveries one worker process runs at once. Unset: "
        f"{DEFAULT_WORKER_CONCURRENCY}, or {SQLITE_WORKER_CONCURRENCY} on SQLite, whose one "
        "write lock takes one writer at a time: more threads there only queue on it "
        "(docs/performance.md, §6).",
    )
    worker_fast_path: bool = Field(
        default=True,
        description="Run the plain create (an identity nobody holds, an intake step without "
        "a WIP limit, a row with the draft the ingress read) in two transactions "
        "(models/fastpath.py): two statements on PostgreSQL, a few on SQLite. false sends "
        "every delivery down the general path, which makes the same decisions in more "
        "statements: for diagnosis, and for the tests that prove both paths agree.",
    )
    worker_log_each_task: bool = Field(
        default=False,
        description="Celery's INFO lines for every task (received, succeeded) from the "
        "deliveries worker. Off by default: at a few hundred deliveries a second they are "
        "two lines a message that say what each delivery's row says already, and cost about "
        "0.08 ms of CPU a message (docs/performance.md, section 11). Failures (ERROR) and "
        "retries (INFO) are logged either way; --loglevel DEBUG brings every line back.",
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="How every process writes its log lines: text, for a person at a "
        "terminal; json, one object a line with the time, level, process and the ids of "
        "the delivery it is about (inbox id, delivery id, source, workspace, external id, "
        'task), for a machine (models/logs.py; docs/runbook.md, "Follow one delivery").',
    )
    log_each_delivery: bool = Field(
        default=False,
        description="One INFO line per delivery from the ingress (stored, with its ids) and "
        "one from the worker (what its run recorded): with log_format json, a delivery's "
        "lines join across processes by its inbox id. Off by default, like "
        "worker_log_each_task: each row already says what the line would.",
    )
    task_time_limit_seconds: int = Field(
        default=60,
        gt=0,
        description="Longest a delivery may run. Under prefork Celery enforces it; under "
        "threads each PostgreSQL statement is cut off at it (statement_timeout).",
    )
    lease_seconds: int = Field(
        default=90,
        gt=0,
        description="How long a worker owns a delivery; above the task time limit, so a "
        "live worker never loses its lease.",
    )
    visibility_timeout_seconds: int = Field(
        default=3600,
        gt=0,
        description="Redis: when an unacknowledged message is handed out again; above "
        "the task time limit.",
    )
    broker_consumer_timeout_seconds: float = Field(
        default=1800.0,
        gt=0,
        description="RabbitMQ: the broker's consumer_timeout, as it is configured there "
        "(RabbitMQ's default is 30 minutes). A worker holds a message at most twice the "
        "task time limit (one waiting for a thread, then its run); the worker refuses to "
        "start when this is not above that, since RabbitMQ would close its channel.",
    )
    broker_delivery_limit: int = Field(
        default=20,
        gt=0,
        description="RabbitMQ: how often a quorum queue hands out one message before it "
        "drops it (x-delivery-limit), so a message that kills its worker does not loop "
        "on the broker. Its inbox row is kept: the sweeper sends it again, and the "
        "worker parks it once TASKHOOK_MAX_LOST_ATTEMPTS attempts ended without an answer.",
    )
    max_lost_attempts: int = Field(
        default=5,
        ge=1,
        le=1000,
        description="Attempts at one delivery that may end without an answer (the worker "
        "killed, crashed, or past its lease) before the next worker parks it as "
        "needs_operator instead of running it again: on any broker, a delivery that "
        "kills its worker stops there.",
    )
    retry_base_seconds: float = Field(default=1.0, gt=0)
    retry_max_seconds: float = Field(default=300.0, gt=0)
    unsettled_max_retries: int = Field(
        default=8,
        ge=0,
        description="Retries while another delivery's create is unfinished, before the "
        "delivery is parked as needs_operator.",
    )
    database_max_retries: int = Field(
        default=10, ge=0, description="Retries on database errors before a delivery is dead."
    )
    sweep_interval_seconds: float = Field(default=30.0, gt=0)
    ingress_heartbeat_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How often each ingress process records that it is up; a window no "
        "process covered is shown in taskhook stats until a catch-up covers it.",
    )
    catchup_interval_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="How often beat catches up every source with access to its provider's "
        "delivery log (taskhook source catch-up); 0 turns it off.",
    )
    queued_grace_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How old a queued delivery must be before the sweeper enqueues it again.",
    )

    # --- retention (models/retention.py; docs/runbook.md, "Retention") ----------------
    idempotency_window_hours: float = Field(
        default=24.0,
        gt=0,
        le=24 * 30,
        description="How long a change's Idempotency-Key is kept (models/idempotency.py): a "
        "retry within it replays the first answer; after it the same key is a new request.",
    )
    body_retention_days: int = Field(
        default=30,
        ge=0,
        le=MAX_RETENTION_DAYS,
        description="Days after a done or ignored delivery was finished that its body is "
        "dropped; its row stays, so a late redelivery is still answered as a duplicate. "
        "0 keeps bodies until their rows are deleted. At most TASKHOOK_INBOX_RETENTION_DAYS.",
    )
    inbox_retention_days: int = Field(
        default=90,
        ge=0,
        le=MAX_RETENTION_DAYS,
        description="Days after a finished delivery (done, ignored, replay, mismatch) was "
        "last changed that its row is deleted; needs_operator, dead, queued and processing "
        f"rows never are. 0 never deletes; else at least {MIN_INBOX_RETENTION_DAYS}, beyond "
        "the week a provider may still send a delivery again.",
    )
    retention_interval_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="How often beat runs the retention policy (taskhook deliveries prune); "
        "0 turns it off.",
    )
    retention_batch: int = Field(
        default=1000,
        ge=1,
        le=10_000,
        description="Most rows the retention policy drops or deletes in one transaction.",
    )
    retention_pause_seconds: float = Field(
        default=0.05,
        ge=0,
        le=60,
        description="The retention policy's least pause between two batches; the pause is "
        "19 times the batch's own time when that is longer, so a prune works at most a "
        "twentieth of the time and the ingress and the workers keep the database.",
    )

    @field_validator("database_url")
    @classmethod
    def _a_database_taskhook_runs_on(cls, value: str) -> str:
        scheme, separator, rest = value.partition("://")
        if not separator or scheme.lower() not in DATABASE_SCHEMES:
            raise ValueError(
                f"TASKHOOK_DATABASE_URL={for_people(value)!r}: must be a SQLite or PostgreSQL "
                "URL: sqlite:///path/to/taskhook.db or postgresql+psycopg://user:password@host/db"
            )
        # Several hosts (a primary and its standbys) in the form SQLAlchemy reads.
        return spread_hosts(f"{DATABASE_SCHEMES[scheme.lower()]}://{rest}")

    @field_validator("database_direct_url")
    @classmethod
    def _a_postgresql_server(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        scheme, separator, rest = value.partition("://")
        if not separator or not scheme.lower().startswith("postgresql"):
            raise ValueError(
                f"TASKHOOK_DATABASE_DIRECT_URL={for_people(value)!r}: must be a PostgreSQL URL "
                "that bypasses the pooler: postgresql+psycopg://user:password@host:5432/db"
            )
        if scheme.lower() not in DATABASE_SCHEMES:
            raise ValueError(
                f"TASKHOOK_DATABASE_DIRECT_URL={for_people(value)!r}: postgresql:// or "
                "postgresql+psycopg:// (psycopg is the driver taskhook installs)"
            )
        return f"{DATABASE_SCHEMES[scheme.lower()]}://{rest}"

    def listener_url(self) -> str | None:
        """Where the LISTEN/NOTIFY listener connects: PostgreSQL itself. None
        when that is not known: behind a pooler with no direct URL given
        (a LISTEN through PgBouncer in transaction mode would hear nothing)."""
        if self.database_direct_url is not None:
            return self.database_direct_url
        return None if self.database_pooler != "none" else self.database_url

    @field_validator("broker_url")
    @classmethod
    def _a_broker_taskhook_runs_on(cls, value: str) -> str:
        scheme, separator, _ = value.partition("://")
        if not separator or scheme.lower() not in BROKER_SCHEMES:
            raise ValueError(
                f"TASKHOOK_BROKER_URL={for_people(value)!r}: must be filesystem:// (the "
                "embedded broker), amqp:// or amqps:// (RabbitMQ: amqp://user:password@host:5672/"
                "vhost), redis:// or rediss:// (redis://host:6379/0), or memory:// (tests)"
            )
        return value

    @model_validator(mode="after")
    def _worker_concurrency_defaults_to_the_store(self) -> Settings:
        if self.worker_concurrency is None:
            on_sqlite = self.database_url.startswith("sqlite")
            self.worker_concurrency = (
                SQLITE_WORKER_CONCURRENCY if on_sqlite else DEFAULT_WORKER_CONCURRENCY
            )
        return self

    @model_validator(mode="after")
    def _a_pooler_is_postgresql_s(self) -> Settings:
        if self.database_pooler != "none" and self.database_url.startswith("sqlite"):
            raise ValueError(
                f"TASKHOOK_DATABASE_POOLER={self.database_pooler} is for PostgreSQL behind a "
                "pooler; TASKHOOK_DATABASE_URL is a SQLite file: unset the pooler"
            )
        return self

    @model_validator(mode="after")
    def _public_url_defaults_to_the_ingress(self) -> Settings:
        if not self.public_url:
            # A wildcard address is where the ingress listens, not where anyone reaches it.
            host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
            host = f"[{host}]" if ":" in host else host
            self.public_url = f"http://{host}:{self.port}"
        return self

    @model_validator(mode="after")
    def _retention_is_coherent(self) -> Settings:
        rows, bodies = self.inbox_retention_days, self.body_retention_days
        if 0 < rows < MIN_INBOX_RETENTION_DAYS:
            raise ValueError(
                f"TASKHOOK_INBOX_RETENTION_DAYS is {rows}: it must be 0 (never delete) or at "
                f"least {MIN_INBOX_RETENTION_DAYS}; a provider may send a delivery again for a "
                "week (GitHub Enterprise Server keeps 7 days), and a row deleted sooner would "
                "be stored and processed again as a new delivery"
            )
        if rows and bodies > rows:
            raise ValueError(
                f"TASKHOOK_BODY_RETENTION_DAYS ({bodies}) must not exceed "
                f"TASKHOOK_INBOX_RETENTION_DAYS ({rows}): the row goes, body and all, after "
                f"{rows} days; set it to at most {rows}, or to 0 to keep bodies until then"
            )
        return self

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list):
            return value
        return [_checked_origin(origin) for origin in value]

    @model_validator(mode="after")
    def _lease_outlives_the_task(self) -> Settings:
        if self.lease_seconds <= self.task_time_limit_seconds:
            raise ValueError(
                f"TASKHOOK_LEASE_SECONDS ({self.lease_seconds}) must exceed "
                f"TASKHOOK_TASK_TIME_LIMIT_SECONDS ({self.task_time_limit_seconds})"
            )
        if self.visibility_timeout_seconds <= self.task_time_limit_seconds:
            raise ValueError(
                f"TASKHOOK_VISIBILITY_TIMEOUT_SECONDS ({self.visibility_timeout_seconds}) must "
                f"exceed TASKHOOK_TASK_TIME_LIMIT_SECONDS ({self.task_time_limit_seconds})"
            )
        if self.uses_rabbitmq and self.broker_consumer_timeout_seconds <= (
            held := 2 * self.task_time_limit_seconds
        ):
            raise ValueError(
                f"RabbitMQ's consumer_timeout ({self.broker_consumer_timeout_seconds:g} s, "
                "TASKHOOK_BROKER_CONSUMER_TIMEOUT_SECONDS) must exceed twice "
                f"TASKHOOK_TASK_TIME_LIMIT_SECONDS ({held} s): a worker holds a message that "
                "long, and RabbitMQ closes the channel of a consumer that holds one longer. "
                "Raise consumer_timeout in rabbitmq.conf and say so here, or lower the limit."
            )
        return self

    def webhook_url(self, provider: str, slug: str) -> str:
        """Where ``provider`` sends source ``slug``'s deliveries."""
        return f"{self.public_url.rstrip('/')}/webhooks/{provider}/{slug}"

    @property
    def uses_rabbitmq(self) -> bool:
        return self.broker_url.startswith(("amqp://", "amqps://", "pyamqp://"))


def _checked_origin(origin: object) -> str:
    """``origin`` as a browser sends it in ``Origin:`` (scheme://host[:port]),
    else a ValueError saying what is wrong."""
    text = str(origin).strip().rstrip("/")
    if text == "*":
        raise ValueError(
            "TASKHOOK_CORS_ORIGINS: '*' would let every site's pages call the API; "
            "list the origins, e.g. https://app.example.com"
        )
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query:
        raise ValueError(
            f"TASKHOOK_CORS_ORIGINS: {text!r} is not an origin; write scheme://host[:port], "
            "e.g. https://app.example.com"
        )
    return text


def setting_names() -> frozenset[str]:
    """Every setting's variable: ``TASKHOOK_`` and the field's name in capitals."""
    return frozenset(f"TASKHOOK_{name.upper()}" for name in Settings.model_fields)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each ``TASKHOOK_`` variable in ``environ`` that no part of
    taskhook reads (a misspelled setting is ignored, and its default used),
    naming the closest known name when there is one."""
    known = setting_names() | OTHER_VARIABLES
    warnings = []
    for name in sorted(environ):
        upper = name.upper()  # pydantic-settings reads the names in any case
        if not upper.startswith("TASKHOOK_") or upper in known or upper.startswith(OTHER_PREFIXES):
            continue
        # Matched without the prefix, which every name shares.
        close = difflib.get_close_matches(
            upper.removeprefix("TASKHOOK_"), sorted(k.removeprefix("TASKHOOK_") for k in known), n=1
        )
        hint = f"; did you mean TASKHOOK_{close[0]}?" if close else " and is ignored"
        warnings.append(f"{name} is not a setting{hint}")
    return warnings


def invalid_settings(error: ValidationError) -> str:
    """One line that says what is wrong with the settings and what is allowed:
    ``TASKHOOK_LEASE_SECONDS='abc': must be a whole number of seconds >= 1``,
    the problems joined by "; " when there are several."""
    return "; ".join(_problem(problem) for problem in error.errors())


def _problem(problem: Mapping) -> str:
    message = str(problem["msg"]).removeprefix("Value error, ")
    field = problem["loc"][0] if problem["loc"] else None
    if problem["type"] == "value_error" or field not in Settings.model_fields:
        return message  # taskhook's own checks name the settings they are about
    value = problem["input"]
    shown = for_people(value) if isinstance(value, str) else value
    return f"TASKHOOK_{str(field).upper()}={shown!r}: must be {_allowed(str(field))}"


#: The unit of a setting, by the end of its name.
_UNITS = {
    "_seconds": "seconds",
    "_ms": "milliseconds",
    "_hours": "hours",
    "_days": "days",
    "_bytes": "bytes",
}


def _allowed(field: str) -> str:
    """What a setting takes, in words: "a whole number of seconds >= 1"."""
    info = Settings.model_fields[field]
    annotation = info.annotation
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(arg for arg in get_args(annotation) if arg is not type(None))
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(str(choice) for choice in get_args(annotation))
    if annotation is bool:
        return "true or false"
    if annotation not in (int, float):
        return "a path" if annotation is Path else "text"
    whole = annotation is int
    low = high = None
    for bound in info.metadata:
        if isinstance(bound, annotated_types.Ge):
            low = f">= {bound.ge}"
        elif isinstance(bound, annotated_types.Gt):
            low = f">= {bound.gt + 1}" if whole else f"> {bound.gt}"
        elif isinstance(bound, annotated_types.Le):
            high = f"<= {bound.le}"
    unit = next((f" of {unit}" for end, unit in _UNITS.items() if field.endswith(end)), "")
    words = f"{'a whole number' if whole else 'a number'}{unit}"
    if low and high and low.startswith(">= ") and whole:
        return f"{words} from {low[3:]} to {high[3:]}"
    return " ".join(part for part in (words, low, high and f"and {high}") if part)


def for_people(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: safe to print."""
    url = re.sub(r"([?&]password=)[^&]*", r"\1***", url)  # libpq takes it as a parameter too
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings()
