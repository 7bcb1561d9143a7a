"""Servers of the suite's own: a private Redis, a private PostgreSQL cluster, and
throwaway databases on the shared PostgreSQL.

Other engineers run their suites on this machine at the same time, against the
shared PostgreSQL on 5432 and the shared Redis on 6379. A scenario that
flushes, restarts or freezes a server must not do it to theirs, so it gets a
server of its own, started here, stopped here by its pid, and never reused by
anyone else. Scenarios that only need a database make one on the shared
PostgreSQL and drop it afterwards, as the rest of the suite does.

A server that cannot be started fails the test that needs it: nothing skips.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest
import redis
from sqlalchemy.engine import make_url

from migrations import upgrade_to_head
from models.broker.messages import DELIVERY_QUEUES
from models.db import make_engine
from tests.support.processes import free_port
from tests.support.stores import POSTGRES_ADMIN_URL

#: Where PostgreSQL's server programs live (initdb, pg_ctl).
POSTGRES_BIN = Path(os.environ.get("TASKHOOK_TEST_POSTGRES_BIN", "/usr/lib/postgresql/15/bin"))
START_TIMEOUT = 30.0


def _wait(check, *, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            pytest.fail(f"timed out after {timeout} s waiting for {what}\n{tail}", pytrace=False)
        time.sleep(0.05)


# --- Redis --------------------------------------------------------------------------------


class PrivateRedis:
    """A ``redis-server`` of our own on a free port, with a password and no disk.

    FLUSHALL it, restart it, SIGSTOP it: nobody else talks to it. Its
    configuration goes in on stdin, so the password is in no process list.
    """

    def __init__(self, folder: Path, password: str, name: str = "redis") -> None:
        self.folder, self.password, self.name = folder, password, name
        self.port = free_port()
        self.log = folder / f"{name}-{self.port}.log"
        self.process: subprocess.Popen | None = None
        self.frozen = False

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def client(self, **options: object) -> redis.Redis:
        options = {"socket_connect_timeout": 3, "socket_timeout": 5} | options
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **options)

    def start(self) -> PrivateRedis:
        if shutil.which("redis-server") is None:
            pytest.fail("redis-server is not installed; the reliability suite needs it", False)
        config = "\n".join(
            [
                f"port {self.port}",
                "bind 127.0.0.1",
                'save ""',
                "appendonly no",
                f"requirepass {self.password}",
                f"dir {self.folder}",
                "",
            ]
        )
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(
                ["redis-server", "-"],
                stdin=subprocess.PIPE,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.process.stdin.write(config.encode())
        self.process.stdin.close()
        _wait(self._answers, timeout=START_TIMEOUT, what=f"{self.name} to start", log=self.log)
        self.frozen = False
        return self

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            pytest.fail(f"{self.name} exited early\n{self.log.read_text()[-2000:]}", False)
        try:
            with contextlib.closing(self.client(socket_timeout=1)) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def flushall(self) -> None:
        with contextlib.closing(self.client()) as client:
            client.flushall()

    def dbsize(self) -> int:
        with contextlib.closing(self.client()) as client:
            return int(client.dbsize())

    def queue_length(self, queue: str = "deliveries") -> int:
        with contextlib.closing(self.client()) as client:
            return int(client.llen(queue))

    def keys_queued(self, queues: Sequence[str] = DELIVERY_QUEUES) -> int:
        """How many inbox keys the queues' messages hold (both lanes of the
        deliveries queue, unless told): a message of the relay's may hold
        several (PROCESS_DELIVERIES)."""
        with contextlib.closing(self.client()) as client:
            messages = [raw for queue in queues for raw in client.lrange(queue, 0, -1)]
        keys = 0
        for raw in messages:
            message = json.loads(raw)
            args = json.loads(base64.b64decode(message["body"]))[0]
            keys += len(args[0]) if isinstance(args[0], list) else 1
        return keys

    def freeze(self) -> None:
        """SIGSTOP: the socket stays open and answers nothing, like a hung host."""
        os.kill(self.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.frozen = False

    def restart(self) -> None:
        """Stop (everything it held is gone: no disk) and start again on the same port."""
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.frozen:
                self.thaw()
            if self.process.poll() is None:
                os.kill(self.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None


# --- PostgreSQL -------------------------------------------------------------------------------


class PrivatePostgres:
    """A PostgreSQL cluster of our own: ``initdb`` into a temporary folder, a
    free port, password authentication, and ``pg_ctl`` to start, restart
    (``-m immediate``, which is what ``pg_ctlcluster ... restart -m immediate``
    does) and stop it.

    Run as root, the server programs run as the ``postgres`` user (PostgreSQL
    refuses root); the folder is then outside pytest's root-only temp folder.
    """

    def __init__(self, password: str, logs: Path) -> None:
        for program in ("initdb", "pg_ctl"):
            if not (POSTGRES_BIN / program).is_file():
                pytest.fail(
                    f"{POSTGRES_BIN / program} not found: set TASKHOOK_TEST_POSTGRES_BIN to "
                    "the folder of PostgreSQL's server programs",
                    pytrace=False,
                )
        self.password = password
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="taskhook-pg-"))
        self.data = self.folder / "data"
        # The server writes its log where it may (pytest's folders are root's);
        # destroy() copies it next to the other logs of the run.
        self.log = self.folder / "postgres.log"
        self.kept_log = logs / f"postgres-{self.port}.log"
        #: More server settings, ``-c name=value`` each (a standby's, say).
        self.settings: dict[str, str] = {}
        self._owner = None
        if os.geteuid() == 0:
            self._owner = pwd.getpwnam("postgres")
            os.chown(self.folder, self._owner.pw_uid, self._owner.pw_gid)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres:{self.password}@127.0.0.1:{self.port}/{database}"

    def _run(
        self, *args: str, timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        command = [str(POSTGRES_BIN / args[0]), *args[1:]]
        if self._owner is not None:
            command = ["runuser", "-u", "postgres", "--", *command]
        environment = None if env is None else os.environ | env
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=environment
        )
        if done.returncode != 0:
            pytest.fail(f"{' '.join(args[:2])} failed: {done.stdout}{done.stderr}", False)
        return done

    def _options(self) -> str:
        more = "".join(f" -c {name}={value}" for name, value in self.settings.items())
        return f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=on{more}"

    def init(self) -> PrivatePostgres:
        password_file = self.folder / "pw"
        password_file.write_text(self.password + "\n")
        if self._owner is not None:
            os.chown(password_file, self._owner.pw_uid, self._owner.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=scram-sha-256",
            f"--pwfile={password_file}",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        )
        password_file.unlink()
        return self

    def start(self) -> None:
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            self._options(),
            "-l",
            str(self.log),
            "-w",
            "start",
        )
        _wait(self.ready, timeout=START_TIMEOUT, what="the private PostgreSQL", log=self.log)

    def restart_immediate(self) -> None:
        """Crash and come back: no checkpoint, open connections cut, WAL replayed."""
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-m",
            "immediate",
            "-w",
            "restart",
            "-o",
            self._options(),
            "-l",
            str(self.log),
        )

    def ready(self) -> bool:
        try:
            with psycopg.connect(libpq(self.url()), connect_timeout=2) as connection:
                connection.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def postmaster_pid(self) -> int | None:
        pid_file = self.data / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(pid_file.read_text().splitlines()[0])
        return None

    def create_database(self, name: str = "taskhook") -> str:
        """A migrated database; its SQLAlchemy URL."""
        with psycopg.connect(libpq(self.url()), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        url = self.url(name)
        engine = make_engine(url)
        with engine.begin() as connection:
            upgrade_to_head(connection)
        engine.dispose()
        return url

    def destroy(self) -> None:
        pid = self.postmaster_pid()
        if pid is not None and self.data.exists():
            with contextlib.suppress(Exception):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop", timeout=30)
            # pg_ctl may have failed (or the server hung): the postmaster is ours,
            # if that pid still runs on our data folder.
            if _runs_on(pid, self.data):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            shutil.copyfile(self.log, self.kept_log)
        shutil.rmtree(self.folder, ignore_errors=True)


def _runs_on(pid: int, data: Path) -> bool:
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(data).encode() in command_line


# --- the shared PostgreSQL ----------------------------------------------------------------------


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class ThrowawayDatabase:
    """A migrated database of our own on the shared PostgreSQL, dropped at the end
    (``migrated=False``: an empty one, for another release's code to migrate)."""

    def __init__(self, label: str, *, migrated: bool = True) -> None:
        self.name = f"taskhook_rel_{label}_{uuid.uuid4().hex[:8]}"
        try:
            admin = psycopg.connect(libpq(POSTGRES_ADMIN_URL), autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as error:
            pytest.fail(f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL} ({error})", False)
        with admin:
            admin.execute(f'CREATE DATABASE "{self.name}"')
        self.url = (
            make_url(POSTGRES_ADMIN_URL)
            .set(database=self.name)
            .render_as_string(hide_password=False)
        )
        if not migrated:
            return
        engine = make_engine(self.url)
        with engine.begin() as connection:
            upgrade_to_head(connection)
        engine.dispose()

    def drop(self) -> None:
        with psycopg.connect(libpq(POSTGRES_ADMIN_URL), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
