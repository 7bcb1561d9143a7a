"""A PgBouncer of the suite's own, in transaction mode, in front of the
machine's PostgreSQL: the tests that run taskhook behind one (docs/deploy.md,
"Behind PgBouncer").

Each run starts its own ``pgbouncer`` (Debian's package, installed by
scripts/test: ``ensure_pgbouncer``) on a free port, with its ini and user list
in a folder of its own, and stops it by its pid afterwards; never the packaged
service. Any database name is passed through to 127.0.0.1:5432 as the same
user, so the suite's throwaway database is reachable through it.

``routed_through`` sends the processes the e2e tests start
(``tests.support.processes.worker_environment``) through it: their
``TASKHOOK_DATABASE_URL`` becomes the PgBouncer's, with the settings taskhook
needs there, and the direct URL for what must bypass it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

#: The full e2e suite through a PgBouncer, instead of straight to PostgreSQL.
EVERY_TEST_THROUGH_PGBOUNCER = os.environ.get("TASKHOOK_TEST_PGBOUNCER") == "1"
READY_TIMEOUT = 15.0
#: PgBouncer will not run as root; as root it is started as this user.
UNPRIVILEGED_USER = "postgres"


def pgbouncer_path() -> str:
    """The pgbouncer binary (Debian puts it in /usr/sbin), or a failure."""
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if found is None:
        pytest.fail(
            "pgbouncer is not installed: the tests behind PgBouncer need it "
            "(scripts/test installs it: apt-get install pgbouncer)",
            pytrace=False,
        )
    return found


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PgBouncer:
    """One pgbouncer process in transaction mode, its folder and its port."""

    def __init__(
        self, server_url: str, *, pool_size: int = 10, users: tuple[str, ...] = ()
    ) -> None:
        server = make_url(server_url)
        self.server = (server.host or "127.0.0.1", server.port or 5432)
        self.user = server.username or "postgres"
        self.port = _free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="taskhook-pgbouncer-"))
        # Trust still wants each user named in the user list.
        users = sorted({self.user, UNPRIVILEGED_USER, *users})
        (self.folder / "userlist.txt").write_text("".join(f'"{user}" ""\n' for user in users))
        (self.folder / "pgbouncer.ini").write_text(
            "[databases]\n"
            # Any database, as the client's user: the suite's throwaway one too.
            f"* = host={self.server[0]} port={self.server[1]}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.folder / 'userlist.txt'}\n"
            f"admin_users = {', '.join(sorted({self.user, UNPRIVILEGED_USER}))}\n"
            "pool_mode = transaction\n"
            # Few server connections for many clients, as in production: the
            # shared PostgreSQL takes 100 in all, and other tests use it too.
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 500\n"
            # No ignore_startup_parameters: a client that sends one PgBouncer
            # does not know (libpq's options) is refused, as in production.
            f"pidfile = {self.folder / 'pgbouncer.pid'}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        args = [pgbouncer_path(), str(self.folder / "pgbouncer.ini")]
        if os.geteuid() == 0:
            account = pwd.getpwnam(UNPRIVILEGED_USER)
            for path in (self.folder, *self.folder.iterdir()):
                os.chown(path, account.pw_uid, account.pw_gid)
            args[1:1] = ["-u", UNPRIVILEGED_USER]
        self.log = self.folder / "pgbouncer.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                pytest.fail(f"pgbouncer exited at start:\n{self.log.read_text()}", pytrace=False)
            with contextlib.suppress(psycopg.Error):
                with self.admin() as admin:
                    admin.execute("SHOW VERSION")
                return
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"pgbouncer did not come up:\n{self.log.read_text()}", pytrace=False)

    def admin(self) -> psycopg.Connection:
        """A connection to PgBouncer's admin console (SHOW SERVERS ...)."""
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            dbname="pgbouncer",
            autocommit=True,
            connect_timeout=2,
        )

    def server_ports(self) -> set[int]:
        """The local ports of PgBouncer's connections to PostgreSQL: the
        ``client_port`` of their backends in pg_stat_activity."""
        with self.admin() as admin, admin.cursor() as cursor:
            cursor.execute("SHOW SERVERS")
            columns = [column.name for column in cursor.description]
            return {int(row[columns.index("local_port")]) for row in cursor.fetchall()}

    def serves(self, url: str) -> bool:
        """Whether ``url`` is a database of the server this PgBouncer is in front of
        (not, say, a private PostgreSQL a reliability scenario started)."""
        parsed = make_url(url)
        if parsed.get_backend_name() != "postgresql":
            return False
        return (parsed.host or "127.0.0.1", parsed.port or 5432) == self.server

    def url(self, direct_url: str) -> str:
        """``direct_url`` (a PostgreSQL URL), reached through this PgBouncer."""
        return (
            make_url(direct_url)
            .set(host="127.0.0.1", port=self.port)
            .render_as_string(hide_password=False)
        )

    def environment(self, direct_url: str) -> dict[str, str]:
        """What a taskhook process behind this PgBouncer is given."""
        return {
            "TASKHOOK_DATABASE_URL": self.url(direct_url),
            "TASKHOOK_DATABASE_POOLER": "pgbouncer",
            "TASKHOOK_DATABASE_DIRECT_URL": direct_url,
        }

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def running_pgbouncer(server_url: str, **options: object) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(server_url, **options)
    try:
        yield bouncer
    finally:
        bouncer.stop()


#: The PgBouncer the processes started now go through (``routed_through``).
_route: PgBouncer | None = None


@contextlib.contextmanager
def routed_through(bouncer: PgBouncer | None) -> Iterator[None]:
    """While the block runs, the processes ``worker_environment`` starts reach
    PostgreSQL through ``bouncer`` (None: directly)."""
    global _route
    before, _route = _route, bouncer
    try:
        yield
    finally:
        _route = before


def database_environment(database_url: str) -> dict[str, str]:
    """A process's database variables: ``database_url`` itself, or, while
    routed through a PgBouncer, that PgBouncer's URL for one of its server's."""
    if _route is None or not _route.serves(database_url):
        return {"TASKHOOK_DATABASE_URL": database_url}
    return _route.environment(database_url)
