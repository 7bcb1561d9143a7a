"""A Celery worker loads neither the ingress nor its web framework: what the
worker shares with the ingress (the intake, the inbox, the providers) lives
in ``models`` (docs/architecture.md, the rooms)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from worker.celery_app import TASK_MODULES

ROOT = Path(__file__).resolve().parents[2]
#: What only the ingress needs: a worker that loads them pays their import
#: time and memory in every process, and depends on the web app's code.
INGRESS_ONLY = ("ingest", "fastapi", "starlette")


def modules_loaded_by_importing(*modules: str) -> set[str]:
    """The top-level packages in ``sys.modules`` of a fresh interpreter after
    it imports ``modules`` (a fresh one: this test process has imported the
    ingress for other tests)."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({name.partition('.')[0] for name in sys.modules})))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(json.loads(ran.stdout))


def test_the_worker_s_task_modules_load_no_ingress_and_no_web_framework():
    loaded = modules_loaded_by_importing("worker.celery_app", *TASK_MODULES)
    assert loaded.isdisjoint(INGRESS_ONLY), sorted(loaded & set(INGRESS_ONLY))


def test_the_catch_up_loads_no_ingress_and_no_web_framework():
    loaded = modules_loaded_by_importing("worker.catchup.service")
    assert loaded.isdisjoint(INGRESS_ONLY), sorted(loaded & set(INGRESS_ONLY))


def test_the_check_sees_the_ingress_when_it_is_loaded():
    # Guards against a check that silently finds nothing.
    assert {"ingest", "fastapi", "starlette"} <= modules_loaded_by_importing("ingest.webhooks")
