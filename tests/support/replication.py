"""A PostgreSQL primary and a streaming standby of our own, to fail over.

Both are :class:`PrivatePostgres` clusters (own folders, own free ports,
removed after): the primary from ``initdb``, the standby from
``pg_basebackup -R`` of it, streaming its WAL as ``application_name``
:data:`STANDBY_NAME`. Synchronous, the primary names the standby in
``synchronous_standby_names``: a commit is acknowledged once the standby has
flushed its WAL (``synchronous_commit=on``), so the standby holds every commit
anyone was told of. Asynchronous, the standby streams through a
:class:`TcpProxy`, which :meth:`ReplicatedPostgres.hold_replication` stalls:
the standby then falls behind for as long as the test wants, deterministically,
where a real lag is a matter of luck.

Clients reach them by one URL naming both hosts with
``target_session_attrs=read-write``: libpq keeps whichever accepts writes.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import psycopg
import pytest

from tests.support.proxy import TcpProxy
from tests.support.services import PrivatePostgres, libpq

STANDBY_NAME = "taskhook_standby"
#: A proxy's chunk held that long is held for the rest of the test.
HELD = 3600.0


class ReplicatedPostgres:
    def __init__(self, password: str, logs: Path, *, synchronous: bool) -> None:
        self.password, self.synchronous = password, synchronous
        self.primary = PrivatePostgres(password, logs)
        self.standby = PrivatePostgres(password, logs)
        self.proxy: TcpProxy | None = None
        self.database: str | None = None

    def start(self, database: str = "taskhook") -> ReplicatedPostgres:
        """Both servers up, ``database`` migrated on the primary and streamed."""
        self.primary.init().start()
        self.primary.create_database(database)
        self.database = database
        port = self.primary.port
        if not self.synchronous:
            self.proxy = TcpProxy("127.0.0.1", port, name="replication-proxy").start()
            port = self.proxy.port
        self.standby._run(
            "pg_basebackup",
            "-d",
            f"host=127.0.0.1 port={port} user=postgres",
            "-D",
            str(self.standby.data),
            "-R",  # standby.signal and primary_conninfo: it follows the primary
            "-X",
            "stream",
            "-c",
            "fast",
            env={"PGPASSWORD": self.password},
            timeout=120,
        )
        # The walreceiver's application_name is the cluster's name.
        self.standby.settings["cluster_name"] = STANDBY_NAME
        self.standby.start()
        self._wait_streaming()
        if self.synchronous:
            self._primary_sql(f"ALTER SYSTEM SET synchronous_standby_names = '\"{STANDBY_NAME}\"'")
            self._primary_sql("SELECT pg_reload_conf()")
            self._wait_for(
                lambda: self._replication_state() == ("streaming", "sync"),
                "the standby to be synchronous",
            )
        return self

    def url(self) -> str:
        """One URL for both, as a deployment would write it: the primary first."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return (
            f"postgresql+psycopg://postgres:{self.password}@/{self.database}"
            f"?host={hosts}&target_session_attrs=read-write"
        )

    def primary_url(self) -> str:
        return self.primary.url(self.database or "postgres")

    def standby_url(self) -> str:
        return self.standby.url(self.database or "postgres")

    # --- the failover ---------------------------------------------------------------------

    def hold_replication(self) -> None:
        """Asynchronous only: from now on, the standby receives nothing more."""
        assert self.proxy is not None, "a synchronous standby is not behind a proxy"
        self.proxy.delay(HELD)

    def stop_primary(self) -> None:
        """The primary's host is gone: no checkpoint, every connection cut."""
        self.primary._run("pg_ctl", "-D", str(self.primary.data), "-m", "immediate", "-w", "stop")
        if self.proxy is not None:  # its held WAL goes nowhere now
            self.proxy.stop()

    def promote(self) -> None:
        """The standby becomes the primary (``pg_ctl promote`` waits until it takes writes)."""
        self.standby._run("pg_ctl", "-D", str(self.standby.data), "-w", "promote")

    def destroy(self) -> None:
        if self.proxy is not None:
            with contextlib.suppress(Exception):
                self.proxy.stop()
        self.standby.destroy()
        self.primary.destroy()

    # --- looking -------------------------------------------------------------------------------

    def _primary_sql(self, statement: str) -> None:
        with psycopg.connect(libpq(self.primary.url()), autocommit=True) as connection:
            connection.execute(statement)

    def _replication_state(self) -> tuple[str, str] | None:
        with psycopg.connect(libpq(self.primary.url()), autocommit=True) as connection:
            row = connection.execute(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY_NAME,),
            ).fetchone()
        return None if row is None else (row[0], row[1])

    def _wait_streaming(self) -> None:
        self._wait_for(
            lambda: (self._replication_state() or ("",))[0] == "streaming",
            "the standby to stream",
        )

    def _wait_for(self, check, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                log = self.standby.log.read_text(errors="replace")[-3000:]
                pytest.fail(f"timed out after {timeout} s waiting for {what}\n{log}", False)
            time.sleep(0.1)
