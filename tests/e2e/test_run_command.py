"""The README's run command on the embedded default: no servers, a posted
sample becomes a task, and Ctrl-C stops every process it started, however
its output is redirected. ``scripts/run`` is started exactly as a user starts
it, with only its files (database, broker, beat schedule) and port moved into
the test's temporary directory."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support.processes import ROOT, WorkerProcess, free_port, wait_until

pytestmark = pytest.mark.e2e


def run_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """The user's environment without TASKHOOK_ variables, the files in ``tmp_path``.
    The port is the one knob: the webhook URLs derive from it."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("TASKHOOK_")}
    return env | {
        "TASKHOOK_DATABASE_URL": f"sqlite:///{tmp_path / 'taskhook.db'}",
        "TASKHOOK_BROKER_FOLDER": str(tmp_path / "broker"),
        "TASKHOOK_BEAT_SCHEDULE": str(tmp_path / "celerybeat-schedule"),
        "TASKHOOK_PORT": str(free_port()),
        "TASKHOOK_WORKER_CONCURRENCY": "1",
        "PYTHONUNBUFFERED": "1",
        **more,
    }


EXTERNAL_ID = "gh-issue/Codertocat/Hello-World#1"


def readme_demo_commands() -> list[tuple[str, str]]:
    """The README's first session with the demo (its first code block that
    sends one): each command, and what its comment says it answers."""
    blocks = (ROOT / "README.md").read_text().split("```")[1::2]
    block = next(block for block in blocks if "taskhook demo send" in block)
    found = [
        tuple(part.strip() for part in line.split("#", 1))
        for line in block.splitlines()
        if line.startswith(".venv/bin/taskhook ") and "#" in line
    ]
    assert any("--redeliver" in command for command, _ in found), found
    return found


def newest_delivery_shows(command: str, env: dict[str, str], words: list[str]) -> bool:
    """``command`` (a ``deliveries list``) shows every one of ``words`` on its newest row."""
    listed = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    return len(rows) > 1 and all(word in rows[1] for word in words)


def wait_until_started(run: WorkerProcess, log: Path) -> None:
    def started() -> bool:
        text = log.read_text(errors="replace") if log.exists() else ""
        return "Uvicorn running" in text and text.count(" ready.") >= 2

    wait_until(started, timeout=90, what="scripts/run to start every process", logs=[run])


def test_the_run_command_turns_a_posted_sample_into_a_task(tmp_path):
    env = run_env(tmp_path)
    port = env["TASKHOOK_PORT"]
    taskhook = [sys.executable, "-m", "worker.cli"]
    run = WorkerProcess("scripts/run", tmp_path / "run.log", ["scripts/run"], env)
    try:
        wait_until_started(run, run.log)
        assert "demo workspace created" in run.text()
        # TASKHOOK_PORT alone moves the printed URLs, and the demo's posts, with it.
        assert f"http://127.0.0.1:{port}/webhooks/github/demo-github" in run.text()

        # The README's first commands, run literally, answer what its comments say.
        for command, says in readme_demo_commands():
            if "deliveries list" in command:
                words = [w for w in says.split("(")[0].split() if w != "..."]
                wait_until(
                    lambda command=command, words=words: newest_delivery_shows(command, env, words),
                    timeout=60,
                    what=f"`{command}` to show {words}",
                    logs=[run],
                )
            else:
                sent = subprocess.run(
                    command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True
                )
                answer = says.rsplit(": ", 1)[1]
                assert sent.returncode == 0, sent.stderr
                assert re.search(rf'"status": ?"{answer}"', sent.stdout), (command, sent.stdout)

        found = subprocess.run(
            [*taskhook, "task", "lookup", "--workspace", "demo", EXTERNAL_ID, "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert json.loads(found.stdout)["task"]["identifier"] == "DEMO-1"
        # For a person, a send says how to look the task up: by its external id.
        again = subprocess.run(
            [*taskhook, "demo", "send", "github"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert again.returncode == 0, again.stderr
        assert f"taskhook task lookup --workspace demo '{EXTERNAL_ID}'" in again.stdout
    finally:
        run.stop()  # SIGTERM: honcho stops its children; then the group, by pid


def processes_marked(mark: str) -> list[int]:
    """Every live process whose environment carries ``mark``: whatever
    scripts/run started, even after its parent is gone."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"TASKHOOK_TEST_RUN_MARK={mark}".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                pass
    return found


@pytest.mark.parametrize(
    ("signal_number", "how"),
    [(signal.SIGINT, "Ctrl-C"), (signal.SIGHUP, "a closed terminal")],
    ids=["ctrl-c", "hang-up"],
)
def test_the_run_command_stops_everything_when_its_output_is_piped(tmp_path, signal_number, how):
    """``scripts/run 2>&1 | tee run.log``, then Ctrl-C: the terminal signals
    the whole foreground group, tee included, and every process stops."""
    mark = uuid.uuid4().hex
    env = run_env(tmp_path, TASKHOOK_TEST_RUN_MARK=mark)
    log = tmp_path / "run.log"
    pipeline = WorkerProcess(
        "scripts/run | tee",
        tmp_path / "pipeline.log",
        ["bash", "-c", f"scripts/run 2>&1 | tee {log} >/dev/null"],
        env,
    )
    try:
        wait_until_started(pipeline, log)
        started = processes_marked(mark)
        assert len(started) >= 5, started  # bash, scripts/run, web, worker, operator, beat

        os.killpg(pipeline.pid, signal_number)  # what the terminal sends its foreground group
        deadline = time.monotonic() + 30
        while processes_marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)

        left = processes_marked(mark)
        assert not left, f"after {how}, still running: {left}\n" + "\n".join(
            log.read_text(errors="replace").splitlines()[-20:]
        )
    finally:
        for pid in processes_marked(mark):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        pipeline.stop()
