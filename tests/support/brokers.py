"""The brokers the suite runs taskhook on: Redis and RabbitMQ, for real.

RabbitMQ is the machine's own (127.0.0.1:5672, guest/guest): each test module
that needs it gets a virtual host of its own, made with ``rabbitmqctl`` and
deleted afterwards, as each gets a Redis database of its own. A scenario that
must stop or restart its broker starts a :class:`PrivateRabbitMQ` node
instead, on free ports, which nobody else uses. A RabbitMQ that is missing or
down fails the tests that need it; they never skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.processes import BenchError
from bench.processes import rabbitmqctl as bench_rabbitmqctl

BROKERS = ("redis", "rabbitmq")
RABBITMQ_HOST = os.environ.get("TASKHOOK_TEST_RABBITMQ_HOST", "127.0.0.1")
RABBITMQ_PORT = int(os.environ.get("TASKHOOK_TEST_RABBITMQ_PORT", "5672"))
#: rabbitmqctl starts an Erlang VM per call: a second or two, more on a busy machine.
RABBITMQCTL_TIMEOUT = 60.0
READY_TIMEOUT = 60.0


def rabbitmqctl(*args: str, node: str | None = None) -> str:
    """``rabbitmqctl`` (against ``node``, else the machine's); its output, or a
    failure that says what went wrong."""
    if shutil.which("rabbitmqctl") is None:
        pytest.fail("rabbitmqctl is not installed: the RabbitMQ tests need RabbitMQ", False)
    try:
        return bench_rabbitmqctl(*args, node=node, timeout=RABBITMQCTL_TIMEOUT)
    except BenchError as error:
        pytest.fail(str(error), False)


def _reachable(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=2):
        return True
    return False


@contextlib.contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """A fresh virtual host on the machine's RabbitMQ, for guest; its amqp:// URL."""
    if not _reachable(RABBITMQ_HOST, RABBITMQ_PORT):
        pytest.fail(
            f"RabbitMQ is not reachable at {RABBITMQ_HOST}:{RABBITMQ_PORT}. "
            "Start it: rabbitmq-server -detached",
            False,
        )
    vhost = f"taskhook-test-{uuid.uuid4().hex[:10]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@{RABBITMQ_HOST}:{RABBITMQ_PORT}/{vhost}"
    finally:
        rabbitmqctl("delete_vhost", vhost)


def free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrivateRabbitMQ:
    """A RabbitMQ node of our own: its own name, free ports, its data under
    ``folder``. Stop it, restart it (the queues and their messages survive,
    as on a real restart), kill it: nobody else talks to it.

    RabbitMQ's start script runs the node as the ``rabbitmq`` user, so its
    data lives in a folder of its own under the system's temporary folder,
    handed to that user (a test's own folder is root's, closed to others),
    and removed by :meth:`remove`. What the node prints goes to ``logs``."""

    def __init__(self, logs: Path) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix="taskhook-rabbitmq-"))
        self.name = f"taskhook-{uuid.uuid4().hex[:8]}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.process: subprocess.Popen | None = None
        self.log = logs / f"rabbitmq-{self.port}.out"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def _environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.folder / "rabbitmq.pid"),
            "RABBITMQ_CONF_ENV_FILE": str(self.folder / "rabbitmq-env.conf"),
        }

    def start(self) -> PrivateRabbitMQ:
        if shutil.which("rabbitmq-server") is None:
            pytest.fail("rabbitmq-server is not installed; this scenario needs it", False)
        (self.folder / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\nloopback_users = none\n"
        )
        (self.folder / "enabled_plugins").write_text("[].\n")
        (self.folder / "rabbitmq-env.conf").write_text("")
        shutil.chown(self.folder, "rabbitmq", "rabbitmq")
        for path in self.folder.rglob("*"):
            shutil.chown(path, "rabbitmq", "rabbitmq")
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(
                ["rabbitmq-server"],
                env=self._environment(),
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: the VM and its helpers go with it
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while not _reachable("127.0.0.1", self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-3000:]
                self.kill()
                pytest.fail(f"RabbitMQ node {self.name} did not start:\n{tail}", False)
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        """A clean stop (what a restart or an upgrade does), then the group's end."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                subprocess.run(
                    ["rabbitmqctl", "-n", self.name, "stop"],
                    capture_output=True,
                    timeout=RABBITMQCTL_TIMEOUT,
                )
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)
        self.kill()

    def kill(self) -> None:
        """SIGKILL to the node's own process group: a crash, or the last resort."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        """Stop the node and delete its data."""
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
