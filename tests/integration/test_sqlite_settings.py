"""The embedded store's SQLite settings, on real SQLite files: what each
connection is set to, the writers' lock, and what a commit survives."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import OperationalError

from models.db import make_engine, make_session_factory, session_scope
from models.settings import Settings
from models.sqlite_writer import WriterLock, lock_file_for
from models.tables import Workspace

ROOT = Path(__file__).resolve().parents[2]


def _engine(path: Path, **settings: object):
    """An engine with the writers' lock on (an opt-in), unless ``settings`` say otherwise."""
    return make_engine(
        f"sqlite:///{path}", settings=Settings(**{"sqlite_writer_lock": True, **settings})
    )


def _file_lock_is_free(lock_file: Path) -> bool:
    """Whether another process could take the writers' lock now."""
    probe = textwrap.dedent(
        f"""
        import fcntl, os, sys
        fd = os.open({str(lock_file)!r}, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit(1)
        """
    )
    return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


@pytest.mark.parametrize(("level", "value"), [("NORMAL", 1), ("FULL", 2)])
def test_every_connection_gets_the_settings(tmp_path: Path, level: str, value: int):
    engine = _engine(tmp_path / "t.db", sqlite_synchronous=level, sqlite_busy_timeout_ms=1234)
    try:
        # Two connections open at once: the pool's first and a second one.
        with engine.connect() as first, engine.connect() as second:
            for connection in (first, second):
                pragma = connection.exec_driver_sql
                assert pragma("PRAGMA synchronous").scalar() == value
                assert pragma("PRAGMA journal_mode").scalar() == "wal"
                assert pragma("PRAGMA busy_timeout").scalar() == 1234
                assert pragma("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_the_default_is_full_with_the_writer_lock():
    # The declared defaults, whatever this shell's environment says.
    fields = Settings.model_fields
    assert fields["sqlite_synchronous"].default == "FULL"
    assert fields["sqlite_writer_lock"].default is True


@pytest.mark.parametrize(
    ("database_url", "concurrency", "threads"),
    [
        ("sqlite:///./var/taskhook.db", None, 2),
        ("postgresql+psycopg://postgres@127.0.0.1/taskhook", None, 4),
        ("sqlite:///./var/taskhook.db", 6, 6),
    ],
)
def test_a_worker_runs_fewer_threads_on_sqlite_unless_told(database_url, concurrency, threads):
    # SQLite's one write lock takes one writer at a time: two threads let one
    # run its Python while the other writes; more only queue on the lock.
    settings = Settings(database_url=database_url, worker_concurrency=concurrency)
    assert settings.worker_concurrency == threads


def test_a_write_transaction_holds_the_writers_lock_until_it_ends(tmp_path: Path):
    path = tmp_path / "t.db"
    engine = _engine(path)
    lock_file = lock_file_for(str(path))
    sessions = make_session_factory(engine)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE notes (body TEXT)")
        with session_scope(sessions) as session:
            session.execute(text("SELECT count(*) FROM notes")).scalar()
            assert _file_lock_is_free(lock_file)  # a read takes nothing
            session.execute(text("INSERT INTO notes VALUES ('a')"))
            assert not _file_lock_is_free(lock_file)  # held from the first write ...
            session.commit()
            assert _file_lock_is_free(lock_file)  # ... to the commit
            session.execute(text("UPDATE notes SET body = 'b'"))
            assert not _file_lock_is_free(lock_file)
            session.rollback()
            assert _file_lock_is_free(lock_file)  # or the rollback
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as autocommit:
            autocommit.exec_driver_sql("INSERT INTO notes VALUES ('c')")
            assert _file_lock_is_free(lock_file)  # nothing to end, so nothing taken
    finally:
        engine.dispose()


def _open_on(path: Path) -> int:
    """How many of this process's descriptors are open on ``path``."""
    folder = Path("/proc/self/fd")
    return sum(1 for fd in os.listdir(folder) if os.path.realpath(folder / fd) == str(path))


def test_the_lock_file_is_closed_once_its_engine_is_gone(tmp_path: Path):
    """Every engine that wrote kept its lock file open for good: with an engine
    or two per test, the suite ran out of descriptors."""
    path = tmp_path / "t.db"
    lock_file = lock_file_for(str(path)).resolve()
    engine = _engine(path)
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE notes (body TEXT)")
    with engine.begin() as connection:
        connection.exec_driver_sql("INSERT INTO notes VALUES ('a')")  # takes the lock
    assert _open_on(lock_file) == 1  # open while its engine may write again
    engine.dispose()
    del engine, connection
    gc.collect()  # an engine's event listeners and pool refer to one another
    assert _open_on(lock_file) == 0


def test_no_lock_without_the_setting(tmp_path: Path):
    path = tmp_path / "t.db"
    engine = _engine(path, sqlite_writer_lock=False)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE notes (body TEXT)")
            connection.exec_driver_sql("INSERT INTO notes VALUES ('a')")
            assert _file_lock_is_free(lock_file_for(str(path)))
    finally:
        engine.dispose()


def test_a_writer_of_another_process_is_waited_for(tmp_path: Path):
    path = tmp_path / "t.db"
    engine = _engine(path)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE notes (body TEXT)")
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                textwrap.dedent(
                    f"""
                    import fcntl, os, sys, time
                    fd = os.open({str(lock_file_for(str(path)))!r}, os.O_RDWR | os.O_CREAT)
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    print("held", flush=True)
                    time.sleep(0.5)
                    """
                ),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with engine.begin() as connection:
            connection.exec_driver_sql("INSERT INTO notes VALUES ('after the other')")
            # SQLite's own lock was free all along: only our queue held this back.
            waited = time.monotonic() - started
        holder.wait(timeout=10)
        assert holder.returncode == 0
        assert waited >= 0.3
    finally:
        engine.dispose()


def test_threads_of_one_process_write_in_turn(tmp_path: Path):
    engine = _engine(tmp_path / "t.db", sqlite_busy_timeout_ms=10_000)
    sessions = make_session_factory(engine)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE counter (n INTEGER)")
            connection.exec_driver_sql("INSERT INTO counter VALUES (0)")
        errors: list[BaseException] = []
        inside = []
        most_inside = []

        def writer() -> None:
            try:
                for _ in range(30):
                    with session_scope(sessions) as session:
                        session.execute(text("UPDATE counter SET n = n + 1"))
                        inside.append(1)
                        most_inside.append(len(inside))
                        time.sleep(0.001)  # hold the transaction open a moment
                        inside.pop()
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=writer) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert max(most_inside) == 1  # never two write transactions at once
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT n FROM counter").scalar() == 180
    finally:
        engine.dispose()


def test_a_second_write_transaction_in_the_same_thread_fails_rather_than_hangs(tmp_path: Path):
    """It could never succeed on SQLite (the first holds SQLite's write lock);
    it must fail after the busy timeout, as it did before the writers' lock:
    the thread does not wait for the lock it holds itself first."""
    engine = _engine(tmp_path / "t.db", sqlite_busy_timeout_ms=1000)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE notes (body TEXT)")
        with engine.connect() as first, engine.connect() as second:
            first.exec_driver_sql("INSERT INTO notes VALUES ('first')")
            started = time.monotonic()
            with pytest.raises(OperationalError, match="database is locked"):
                second.exec_driver_sql("INSERT INTO notes VALUES ('second')")
            # One busy timeout (SQLite's), not two (ours, then SQLite's).
            assert time.monotonic() - started < 1.9
            second.rollback()
            first.commit()
        with engine.begin() as connection:  # and the lock is free again
            connection.exec_driver_sql("INSERT INTO notes VALUES ('third')")
            assert connection.exec_driver_sql("SELECT count(*) FROM notes").scalar() == 2
    finally:
        engine.dispose()


@pytest.mark.parametrize("level", ["NORMAL", "FULL"])
def test_a_commit_survives_the_process_being_killed(
    tmp_path: Path, sqlite_template: Path, level: str
):
    """kill -9 right after the commit, before anything else: the row is there
    (what the ingress's 202 promises, with either setting)."""
    path = tmp_path / "taskhook.db"
    path.write_bytes(sqlite_template.read_bytes())
    script = textwrap.dedent(
        f"""
        import os, signal
        from models.db import make_engine, make_session_factory, session_scope
        from models.settings import Settings
        from models.tables import Workspace
        engine = make_engine("sqlite:///{path}", settings=Settings(sqlite_synchronous="{level}"))
        with session_scope(make_session_factory(engine)) as session:
            session.add(Workspace(slug="survivor", name="Survivor", task_prefix="S"))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=False)
    assert done.returncode == -signal.SIGKILL
    # Killed before any checkpoint: the commit is in the WAL only.
    assert os.path.getsize(f"{path}-wal") > 0
    engine = _engine(path)
    try:
        with session_scope(make_session_factory(engine)) as session:
            assert session.scalar(select(Workspace.slug)) == "survivor"
    finally:
        engine.dispose()


def test_a_forked_child_takes_the_lock_on_its_own_file(tmp_path: Path):
    """flock belongs to the open file, which a fork shares: a prefork child
    must open its own, or parent and child would not exclude each other."""
    lock = WriterLock(tmp_path / "t.db.writer-lock", timeout_seconds=0.3)
    assert lock.acquire()  # the parent opens the file ...
    lock.release()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # ... the child takes the lock and holds it a while
        os.close(read_end)
        code = 0 if lock.acquire() else 1
        os.write(write_end, b"x")
        time.sleep(1.0)
        os._exit(code)
    os.close(write_end)
    assert os.read(read_end, 1) == b"x"
    try:
        assert lock.acquire() is False  # the child holds it: the parent waits, then gives up
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert lock.acquire()  # the child is gone, and its lock with it
    lock.release()


def test_the_holder_never_waits_for_itself_and_hands_over_at_once(tmp_path: Path):
    lock = WriterLock(tmp_path / "t.db.writer-lock", timeout_seconds=5)
    assert lock.acquire()
    started = time.monotonic()
    assert lock.acquire() is False  # the holder itself: at once, not after 5 s
    assert time.monotonic() - started < 1
    taken = threading.Event()

    def other() -> None:
        if lock.acquire():
            taken.set()
            lock.release()

    thread = threading.Thread(target=other)
    thread.start()
    assert not taken.wait(0.2)  # another thread waits ...
    lock.release()
    assert taken.wait(5)  # ... and runs once the holder is done
    thread.join(5)
    assert lock.acquire()  # free again
    lock.release()
