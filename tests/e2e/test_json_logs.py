"""TASKHOOK_LOG_FORMAT=json on a real stack: the ingress, a worker with beat,
and the CLI each write one JSON object a line, and one delivery's lines join
across the processes by its ids (docs/runbook.md, "Follow one delivery")."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable

import httpx
import pytest

from models.db import session_scope
from models.sources import add_source
from models.tables import Task
from models.workspaces import create_workspace
from tests.support.deliveries import fixture, github_headers
from tests.support.processes import (
    ROOT,
    Ingress,
    StartWorker,
    finished,
    wait_until,
    worker_environment,
)

pytestmark = pytest.mark.e2e

SECRET = "json-logs-secret"
JSON_LINES = {"TASKHOOK_LOG_FORMAT": "json", "TASKHOOK_LOG_EACH_DELIVERY": "true"}


def json_lines(text: str, process: str) -> list[dict]:
    """Every line of a process's log as JSON: a line that is not fails the test."""
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"{process}'s line {number} is not JSON: {line!r}", pytrace=False)
    return lines


def test_one_deliverys_lines_join_across_processes_by_its_ids(
    sessions,
    start_worker: StartWorker,
    start_ingress: Callable[..., Ingress],
    postgres_url,
    redis_url,
):
    with session_scope(sessions) as session:
        workspace = create_workspace(session=session, slug="jl", name="JSON logs", task_prefix="JL")
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug="jl-github",
            secret=SECRET,
            create_events=["issues.opened"],
        )
        workspace_id = workspace.id
    worker = start_worker("json-logs", beat=True, **JSON_LINES)
    ingress = start_ingress(**JSON_LINES)

    delivery_id = str(uuid.uuid4())
    body = fixture("github", "issues__opened")
    answer = httpx.post(
        f"{ingress.url}/webhooks/github/jl-github",
        content=body,
        headers=github_headers("issues__opened", body, SECRET, delivery=delivery_id),
        timeout=10,
    )
    assert answer.status_code == 202, answer.text
    inbox_id = answer.json()["delivery"]
    # A bad signature: a warning-free refusal, and still JSON (nothing logged raw).
    refused = httpx.post(
        f"{ingress.url}/webhooks/github/jl-github",
        content=body,
        headers=github_headers("issues__opened", body, "not-the-secret"),
        timeout=10,
    )
    assert refused.status_code == 401
    wait_until(
        finished(sessions, inbox_id),
        timeout=60,
        what="the delivery",
        logs=[worker, ingress.process],
    )
    with sessions() as session:
        task = session.query(Task).filter_by(created_by_delivery=inbox_id).one()

    # The CLI: a warning to stderr as JSON, its output on stdout untouched.
    cli = subprocess.run(
        [sys.executable, "-m", "worker.cli", "stats", "--json"],
        cwd=ROOT,
        env=worker_environment(postgres_url, redis_url, **JSON_LINES),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    json.loads(cli.stdout)
    json_lines(cli.stderr, "the CLI")

    wait_until(
        lambda: "recorded" in worker.text(), timeout=10, what="the worker's line", logs=[worker]
    )
    # Stopped first, so that what they write as they go is read too.
    worker.stop()
    ingress.stop()
    ingress_lines = json_lines(ingress.process.text(), "the ingress")
    worker_lines = json_lines(worker.text(), "the worker")
    for line in ingress_lines + worker_lines:
        assert {"time", "level", "process", "pid", "logger", "message"} <= line.keys(), line

    # From the sender's delivery id to the ingress's line, and by its inbox id
    # to the worker's: the task and its external id.
    (stored,) = [line for line in ingress_lines if line.get("delivery_id") == delivery_id]
    assert stored["process"] == "ingress"
    assert (stored["inbox_id"], stored["source"], stored["workspace"]) == (
        inbox_id,
        "jl-github",
        workspace_id,
    )
    about_it = [line for line in worker_lines if line.get("inbox_id") == inbox_id]
    assert about_it, "no worker line names the delivery"
    recorded = about_it[-1]
    assert recorded["process"].startswith("json-logs-")  # the worker's node name
    assert (recorded["task"], recorded["external_id"], recorded["workspace"]) == (
        task.id,
        "gh-issue/Codertocat/Hello-World#1",
        workspace_id,
    )
    assert recorded["outcome"] == "created"
    # Beat, embedded in the worker, wrote JSON lines too (its sweeps).
    assert any(line["logger"].startswith("celery.beat") for line in worker_lines)
    assert any("Warm shutdown" in line["message"] for line in worker_lines)
    assert any("Started server process" in line["message"] for line in ingress_lines)
    assert SECRET not in ingress.process.text() + worker.text() + cli.stderr
