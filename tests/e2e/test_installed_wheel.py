"""taskhook installed, not cloned: ``python -m build`` makes the wheel, a fresh
virtualenv outside the repository installs it with its dependencies (pip
resolves them from the package index: the wheel's metadata must name every
one), and the README's demo runs from a folder outside the repository, on the
embedded default: a key, the migrations, the demo workspace, the Procfile's
``web`` and ``worker`` from the virtualenv's own programs, a signed delivery
that becomes a task, and the console's page and static files.

Nothing here can pass by importing the checkout: the processes run in a
temporary folder, with no ``PYTHONPATH``, and the test asserts that the
packages they import are the virtualenv's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from models.db import make_engine, make_session_factory
from models.inbox import FINISHED
from models.tables import Delivery
from tests.support.processes import ROOT, WorkerProcess, free_port, wait_until
from tests.support.procfile import expanded, procfile

pytestmark = pytest.mark.e2e

#: taskhook's packages: what the wheel must hold, every file of them.
PACKAGES = ("models", "ingest", "worker", "migrations")
EXTERNAL_ID = "gh-issue/Codertocat/Hello-World#1"
#: Prints where each package is imported from.
WHERE_FROM = "\n".join(f"import {package}; print({package}.__file__)" for package in PACKAGES)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``python -m build`` makes of the checkout (through its sdist)."""
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    (found,) = dist.glob("taskhook-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv, outside the repository, with the wheel installed."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    assert not venv.is_relative_to(ROOT)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # This virtualenv's pip installs into the new one (--python): the same
    # resolution from the index, without bootstrapping a pip there. No
    # bytecode compiled ahead: what runs compiles what it imports.
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    installed = subprocess.run(
        [*pip, "install", "--quiet", "--no-compile", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout[-4000:] + installed.stderr[-4000:]
    return venv


def test_the_wheel_holds_every_file_of_taskhooks_packages(wheel: Path) -> None:
    """Templates, static files, the vendored chart, the migrations and their
    template, the demo's samples: whatever git tracks in the packages."""
    tracked = subprocess.run(
        ["git", "ls-files", *PACKAGES], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "ingest/console/static/vendor/uPlot.iife.min.js" in tracked
    assert "migrations/script.py.mako" in tracked
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    assert sorted(set(tracked) - in_wheel) == []


def test_the_demo_runs_from_the_installed_wheel(venv: Path, tmp_path: Path) -> None:
    here = tmp_path / "run"  # the working directory: var/ is made here
    here.mkdir()
    bin_ = venv / "bin"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TASKHOOK_", "PYTHON", "VIRTUAL_ENV"))
    }
    env |= {
        "PATH": f"{bin_}{os.pathsep}{env.get('PATH', '')}",
        "TASKHOOK_PORT": str(free_port()),
        "TASKHOOK_WORKER_CONCURRENCY": "1",
        "PYTHONUNBUFFERED": "1",
    }

    def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(word) for word in argv],
            cwd=here,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def taskhook(*args: str) -> str:
        ran = run(bin_ / "taskhook", *args)
        assert ran.returncode == 0, (args, ran.stdout, ran.stderr)
        return ran.stdout

    # What the processes import is the virtualenv's, not the checkout's.
    where = run(bin_ / "python", "-c", WHERE_FROM)
    assert where.returncode == 0, where.stderr
    imported = where.stdout.split()
    assert len(imported) == len(PACKAGES)
    assert all(Path(file).is_relative_to(venv) for file in imported), imported

    taskhook("secrets", "init")
    taskhook("db", "upgrade")
    assert "demo workspace created" in taskhook("demo", "setup")

    # The Procfile's web and worker, each program the virtualenv's own.
    started: list[WorkerProcess] = []
    try:
        for name in ("web", "worker"):
            program, *args = expanded(procfile()[name], env)
            assert (bin_ / program).exists(), f"{program} is not installed in the virtualenv"
            started.append(
                WorkerProcess(
                    name, tmp_path / f"{name}.log", [str(bin_ / program), *args], env, cwd=here
                )
            )
        web, worker = started
        url = f"http://127.0.0.1:{env['TASKHOOK_PORT']}"
        wait_until(lambda: _answers(f"{url}/readyz", web), timeout=60, what="web", logs=[web])
        worker.wait_ready()

        sent = json.loads(taskhook("demo", "send", "github", "--json"))
        assert sent["status"] == 202, sent

        # Watched in the database (a CLI call per look would cost a second
        # each); then looked up as a person would.
        engine = make_engine(f"sqlite:///{here / 'var' / 'taskhook.db'}")
        try:
            wait_until(
                lambda: _all_finished(make_session_factory(engine)),
                timeout=60,
                what="the delivery to be done",
                logs=started,
            )
        finally:
            engine.dispose()
        found = json.loads(taskhook("task", "lookup", "--workspace=demo", EXTERNAL_ID, "--json"))
        assert found["task"]["identifier"] == "DEMO-1"

        # The console's page, and the static files it links, from the wheel.
        page = httpx.get(f"{url}/console/", follow_redirects=True, timeout=10)
        assert page.status_code == 200
        assert "/console/static/console.css" in page.text
        for asset in ("console.css", "console.js", "vendor/uPlot.iife.min.js"):
            served = httpx.get(f"{url}/console/static/{asset}", timeout=10)
            assert served.status_code == 200, asset
            assert served.content == (ROOT / "ingest/console/static" / asset).read_bytes()
    finally:
        for process in started:
            process.stop()


def _all_finished(sessions: sessionmaker[Session]) -> bool:
    with sessions() as session:
        statuses = session.scalars(select(Delivery.status)).all()
    return bool(statuses) and all(status in FINISHED for status in statuses)


def _answers(url: str, process: WorkerProcess) -> bool:
    if process.process.poll() is not None:
        pytest.fail(f"{process.name} exited early\n{process.tail()}", pytrace=False)
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
