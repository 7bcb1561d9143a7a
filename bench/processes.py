"""The processes a benchmark starts -- redis-server, uvicorn, Celery workers, the
load generator -- and the throwaway PostgreSQL database it runs on.

Every process is started in its own session and stopped by its pid (SIGTERM,
then SIGKILL to its own process group), never by name. Redis is a private
``redis-server`` on a free port, so the shared one is never flushed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import httpx
import psutil
import psycopg
import redis
from sqlalchemy.engine import make_url

from migrations import upgrade_to_head
from models.broker.messages import DELIVERY_QUEUES
from models.db import make_engine

ROOT = Path(__file__).resolve().parents[1]
POSTGRES_ADMIN_URL = os.environ.get(
    "TASKHOOK_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
READY_TIMEOUT = 60.0


class BenchError(RuntimeError):
    pass


RABBITMQ_HOST = "127.0.0.1"


def rabbitmqctl(*args: str, node: str | None = None, timeout: float = 60.0) -> str:
    """``rabbitmqctl`` against the machine's RabbitMQ (or ``node``); its output.
    Raises :class:`BenchError` saying what failed."""
    command = ["rabbitmqctl", *(["-n", node] if node else []), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BenchError(f"{' '.join(command)}: {error}") from None
    if done.returncode != 0:
        raise BenchError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(check: Callable[[], object], *, timeout: float, what: str, every=0.05) -> object:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def clean_environment(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TASKHOOK_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def python_module(module: str, *args: str, stderr: IO[bytes]) -> subprocess.Popen:
    """``python -m module args`` from the repository, talking over pipes on
    stdin and stdout: in a clean environment (no TASKHOOK_* of ours) and a
    session of its own, so it is killed as a group (``os.killpg``)."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=clean_environment(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
    )


class Process:
    """One subprocess of ours and its log."""

    def __init__(self, name: str, args: list[str], *, logs: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        with self.log.open("wb") as output:
            self.popen = subprocess.Popen(
                args,
                cwd=ROOT,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.peak_rss: dict[int, int] = {}

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} (pid {self.pid}) ---\n" + "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        if not self.alive():
            raise BenchError(f"{self.name} exited early\n{self.tail()}")

    def _members(self) -> list[psutil.Process]:
        """This process and its live children (a prefork pool); none once it is gone."""
        try:
            parent = psutil.Process(self.pid)
            return [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def rss(self) -> dict[int, int]:
        """RSS in bytes of this process and its children, by pid."""
        sizes = {}
        for member in self._members():
            with contextlib.suppress(psutil.NoSuchProcess):
                sizes[member.pid] = member.memory_info().rss
        for pid, size in sizes.items():
            self.peak_rss[pid] = max(self.peak_rss.get(pid, 0), size)
        return sizes

    def cpu_seconds(self) -> float:
        """User and system CPU of this process and its live children, so far."""
        total = 0.0
        for member in self._members():
            with contextlib.suppress(psutil.NoSuchProcess):
                times = member.cpu_times()
                total += times.user + times.system
        return total

    def stop(self) -> None:
        """SIGTERM by pid, then SIGKILL to its own group if it does not go in time."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)


class Processes:
    """Everything one benchmark started; ``stop_all`` stops each by pid, newest first."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[Process] = []
        #: What is undone at ``stop_all`` besides processes (a RabbitMQ vhost).
        self.cleanups: list[Callable[[], None]] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> Process:
        process = Process(f"{name}-{len(self.started)}", args, logs=self.logs, env=env)
        self.started.append(process)
        return process

    def stop(self, process: Process) -> None:
        process.stop()
        if process in self.started:
            self.started.remove(process)

    def stop_all(self) -> None:
        while self.started:
            self.started.pop().stop()
        while self.cleanups:
            self.cleanups.pop()()

    # --- what the benchmarks start ------------------------------------------------

    def redis(self) -> str:
        port = free_port()
        process = self.start(
            "redis",
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ],
            clean_environment(),
        )
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)

        def up() -> bool:
            process.check_alive()
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(up, timeout=READY_TIMEOUT, what="redis-server")
        client.close()
        return url

    def rabbitmq(self) -> str:
        """A virtual host of the benchmark's own on the machine's RabbitMQ
        (127.0.0.1:5672, guest), deleted at ``stop_all``; its URL."""
        vhost = f"taskhook-bench-{uuid.uuid4().hex[:8]}"
        rabbitmqctl("add_vhost", vhost)
        self.cleanups.append(lambda: rabbitmqctl("delete_vhost", vhost))
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        return f"amqp://guest:guest@{RABBITMQ_HOST}:5672/{vhost}"

    def uvicorn(
        self, name: str, app: str, env: dict[str, str], *, factory: bool = False
    ) -> tuple[Process, str]:
        port = free_port()
        args = [sys.executable, "-m", "ingest.server", app, "--host", "127.0.0.1"]
        args += ["--port", str(port)]
        args += ["--no-access-log", "--log-level", "warning"]
        args += ["--loop", env.get("BENCH_UVICORN_LOOP", "auto")]
        args += ["--http", env.get("BENCH_UVICORN_HTTP", "auto")]
        if factory:
            args.append("--factory")
        process = self.start(name, args, env)
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            process.check_alive()
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout=READY_TIMEOUT, what=f"uvicorn {name}", every=0.1)
        return process, url

    def celery_worker(
        self,
        name: str,
        app: str,
        env: dict[str, str],
        *,
        queues: str = ",".join(DELIVERY_QUEUES),
        wait: bool = True,
    ) -> Process:
        """One Celery worker process, in the shape taskhook's settings give it
        (``TASKHOOK_WORKER_POOL``, ``TASKHOOK_WORKER_CONCURRENCY`` in ``env``);
        ready unless ``wait`` is False (then see :meth:`wait_ready`)."""
        unique = f"{name}-{uuid.uuid4().hex[:6]}"
        args = [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", queues]
        args += ["-n", f"{unique}@%h", "-l", "INFO"]
        # With its heartbeat, as the Procfile runs it: without one, an idle
        # worker on RabbitMQ has no timer in its event loop, polls up to 10 s
        # at a time, and sees a SIGTERM only after the poll (a 9-10 s stop).
        args += ["--without-gossip", "--without-mingle"]
        process = self.start(name, args, env)
        if wait:
            self.wait_ready(process)
        return process

    @staticmethod
    def wait_ready(worker: Process) -> None:
        def ready() -> bool:
            worker.check_alive()
            return " ready." in worker.log.read_text(errors="replace")

        wait_until(ready, timeout=READY_TIMEOUT, what=f"celery worker {worker.name}", every=0.05)

    def loadgen(self, spec: dict) -> dict:
        """Run the load generator to completion and return its result."""
        log = self.logs / f"loadgen-{uuid.uuid4().hex[:6]}.log"
        with log.open("wb") as errors:
            popen = python_module("bench.loadgen", stderr=errors)
            try:
                out, _ = popen.communicate(
                    json.dumps(spec).encode(), timeout=spec.get("timeout", 600) + 60
                )
            except subprocess.TimeoutExpired:
                os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
                raise BenchError("the load generator did not finish in time") from None
        if popen.returncode != 0:
            raise BenchError(f"the load generator failed:\n{log.read_text()[-3000:]}")
        return json.loads(out)


def server_cpu_seconds(name: str) -> float:
    """User and system CPU so far of every process called ``name`` (``postgres``,
    ``redis-server``): the servers are shared, so this is all of their work."""
    total = 0.0
    for process in psutil.process_iter(["name", "cpu_times"]):
        if process.info["name"] == name and process.info["cpu_times"] is not None:
            total += process.info["cpu_times"].user + process.info["cpu_times"].system
    return total


@contextlib.contextmanager
def throwaway_database() -> Iterator[str]:
    """A PostgreSQL database of our own, migrated to head; dropped afterwards."""
    name = f"taskhook_bench_{uuid.uuid4().hex[:10]}"
    admin_url = make_url(POSTGRES_ADMIN_URL).set(drivername="postgresql")
    libpq = admin_url.render_as_string(hide_password=False)
    with psycopg.connect(libpq, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        engine = make_engine(url)
        with engine.begin() as connection:
            upgrade_to_head(connection)
        engine.dispose()
        yield url
    finally:
        with psycopg.connect(libpq, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
