"""One SQLite writer at a time, handed over at once rather than polled for.

SQLite lets one connection write at a time. A writer that finds the file
locked waits in SQLite's busy handler, which sleeps 1, 2, 5, 10, 15, 20,
25 ... ms between tries and does not notice the lock freed in between. With
the ingress's request threads and the worker's threads all writing, most of
a delivery's time went to those sleeps (``bench sqlite``: a profile of the
worker and the ingress put ~60 % of their samples in the INSERT or UPDATE
that began a transaction, waiting).

:class:`WriterLock` queues the writers before SQLite sees them: the threads
of one process on a :class:`threading.Lock` (the next one runs as soon as the
holder releases it), the processes on an ``flock`` of a file beside the
database, tried every :data:`CROSS_PROCESS_POLL_SECONDS`. It is taken where
Python's ``sqlite3`` opens a transaction -- before the first INSERT, UPDATE,
DELETE or REPLACE outside one -- and released when that transaction commits
or rolls back. Reads take nothing: in WAL mode they never wait for a writer.

A writer that does not take it (the ``sqlite3`` shell, an older process)
still meets SQLite's own lock and busy timeout, as before. A writer waits
for this lock at most the busy timeout too, then goes on to SQLite's lock,
which fails as it always did; a thread that opens a second write transaction
while it holds one goes to SQLite's lock at once, without waiting for
itself, and gets SQLite's "database is locked" after one busy timeout, not
a hang and not two timeouts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sqlite3
import threading
import time
import weakref
from pathlib import Path

#: How often a writer of another process tries the file lock while one holds
#: it. SQLite's busy handler sleeps 1 ms, then up to 100 ms; a transaction
#: here holds the lock about a millisecond.
CROSS_PROCESS_POLL_SECONDS = 0.0005

#: The statements before which Python's sqlite3 (its legacy transaction
#: control, which SQLAlchemy's pysqlite dialect uses) opens a transaction.
_OPENS_A_TRANSACTION = re.compile(r"\s*(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)


def lock_file_for(database: str) -> Path:
    """The lock file of the SQLite database at path ``database``."""
    return Path(f"{database}.writer-lock")


class WriterLock:
    """The writers' queue of one SQLite database, for one process."""

    def __init__(self, path: Path, *, timeout_seconds: float) -> None:
        self.path = path
        self.timeout_seconds = timeout_seconds
        self._threads = threading.Lock()
        #: The thread that holds ``_threads``: it must not wait for itself.
        self._owner: int | None = None
        self._file: int | None = None
        self._file_pid = 0

    def acquire(self) -> bool:
        """Wait to be the writer; False when the wait ran out (the writer then
        goes on to SQLite's own lock and busy timeout), or at once when this
        thread holds it already, on another connection."""
        if self._owner == threading.get_ident():
            return False
        deadline = time.monotonic() + self.timeout_seconds
        if not self._threads.acquire(timeout=self.timeout_seconds):
            return False
        self._owner = threading.get_ident()
        try:
            descriptor = self._descriptor()
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(CROSS_PROCESS_POLL_SECONDS)
        except BaseException:
            self._release_threads()
            raise
        self._release_threads()
        return False

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._descriptor(), fcntl.LOCK_UN)
        self._release_threads()

    def _release_threads(self) -> None:
        self._owner = None
        self._threads.release()

    def _descriptor(self) -> int:
        # A forked child (a prefork pool) shares its parent's open file, and
        # flock locks belong to the open file: the child opens its own.
        if self._file is None or self._file_pid != os.getpid():
            self._file = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._file_pid = os.getpid()
            # The file is open as long as the lock lives, and the lock as long
            # as its engine. Left open, every engine that ever wrote kept a
            # descriptor: the test suite, with an engine or two per test, ran
            # past 1,024 of them.
            weakref.finalize(self, os.close, self._file)
        return self._file


class WriterConnection(sqlite3.Connection):
    """A ``sqlite3`` connection that releases its :class:`WriterLock` when
    the transaction it took it for ends (``sqlite3.connect(factory=...)``)."""

    writer_lock: WriterLock | None = None
    _holds_writer_lock = False

    def take_writer_lock_before(self, statement: str) -> None:
        """Take the writer lock when ``statement`` opens a write transaction."""
        if (
            self.writer_lock is None
            or self._holds_writer_lock
            or self.in_transaction
            # Autocommit: sqlite3 opens no transaction, so nothing would end it.
            or self.isolation_level is None
            or not _OPENS_A_TRANSACTION.match(statement)
        ):
            return
        self._holds_writer_lock = self.writer_lock.acquire()

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self._release_writer_lock()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self._release_writer_lock()

    def close(self) -> None:
        try:
            super().close()
        finally:
            # Closing rolls back whatever was open.
            self._release_writer_lock(transaction_ended=True)

    def _release_writer_lock(self, *, transaction_ended: bool = False) -> None:
        # A commit that failed leaves its transaction open, and the lock held
        # until the rollback.
        if self._holds_writer_lock and (transaction_ended or not self.in_transaction):
            self._holds_writer_lock = False
            assert self.writer_lock is not None
            self.writer_lock.release()
