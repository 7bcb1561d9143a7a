"""The README's run command on the embedded default: no servers, a posted
sample becomes a task. ``scripts/run`` is started exactly as a user starts it,
with only its files (database, broker, beat schedule) and port moved into the
test's temporary directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import ROOT, WorkerProcess, free_port, wait_until

pytestmark = pytest.mark.e2e


def test_the_run_command_turns_a_posted_sample_into_a_task(tmp_path):
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("TASKHOOK_")}
    env.update(
        TASKHOOK_DATABASE_URL=f"sqlite:///{tmp_path / 'taskhook.db'}",
        TASKHOOK_BROKER_FOLDER=str(tmp_path / "broker"),
        TASKHOOK_BEAT_SCHEDULE=str(tmp_path / "celerybeat-schedule"),
        TASKHOOK_PORT=str(port),
        TASKHOOK_PUBLIC_URL=f"http://127.0.0.1:{port}",
        TASKHOOK_WORKER_CONCURRENCY="1",
        PYTHONUNBUFFERED="1",
    )
    taskhook = [sys.executable, "-m", "worker.cli"]
    run = WorkerProcess("scripts/run", tmp_path / "run.log", ["scripts/run"], env)
    try:
        wait_until(
            lambda: (
                "web.1" in run.text()
                and "Uvicorn running" in run.text()
                and run.text().count(" ready.") >= 2
            ),
            timeout=90,
            what="scripts/run to start every process",
            logs=[run],
        )
        assert "demo workspace created" in run.text()

        sent = subprocess.run(
            [*taskhook, "demo", "send", "github", "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert sent.returncode == 0, sent.stderr
        assert json.loads(sent.stdout)["status"] == 202

        def task_exists():
            found = subprocess.run(
                [
                    *taskhook,
                    "task",
                    "lookup",
                    "--workspace",
                    "demo",
                    "gh-issue/Codertocat/Hello-World#1",
                    "--json",
                ],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            return found.returncode == 0 and json.loads(found.stdout)

        found = wait_until(task_exists, timeout=60, what="the demo task", logs=[run])
        assert found["task"]["external_id"] == "gh-issue/Codertocat/Hello-World#1"
    finally:
        run.stop()  # SIGTERM: honcho stops its children; then the group, by pid
