"""The encryption key rotates while signed deliveries keep arriving.

docs/runbook.md, "Rotate the encryption key": every process runs with the
new key first and the old one after, then ``taskhook secrets rotate``
re-seals every stored credential under the new key, batch by batch. A real
ingress verifies a steady stream of signed deliveries throughout, re-reading
its sources every 0.1 s, so it opens values sealed by either key as the
rotation moves them: not one delivery may fail its verification.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import httpx
import pytest

from models import sealing
from models.credentials import credential_counts
from models.db import session_scope
from models.sources import add_source
from models.workspaces import create_workspace
from tests.support.deliveries import fixture, github_headers
from tests.support.processes import ROOT, Ingress, worker_environment

pytestmark = pytest.mark.e2e

OLD, NEW = sealing.new_key(), sealing.new_key()
SOURCES = 40


@pytest.fixture
def sealed_by_old() -> Iterator[None]:
    before = sealing.installed()
    sealing.install(sealing.Keyring([OLD]))
    yield
    sealing.install(before)


def test_rotating_the_key_under_a_stream_of_signed_deliveries_fails_none(
    sessions, sealed_by_old, start_ingress: Callable[..., Ingress], postgres_url, broker_url
):
    with session_scope(sessions) as session:
        workspace = create_workspace(session=session, slug="rot", name="Rot", task_prefix="ROT")
        for n in range(SOURCES):
            add_source(
                session=session,
                provider="github",
                workspace_id=workspace.id,
                slug=f"rot-{n}",
                secret=f"rot-secret-{n}",
                create_events=["issues.opened"],
            )
    both = f"{NEW},{OLD}"
    ingress = start_ingress(TASKHOOK_ENCRYPTION_KEYS=both, TASKHOOK_SOURCE_CACHE_SECONDS="0.1")

    answers: Counter[int] = Counter()
    stop = threading.Event()
    body = fixture("github", "issues__opened")

    def stream() -> None:
        n = 0
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                source = n % SOURCES
                headers = github_headers(
                    "issues__opened", body, f"rot-secret-{source}", delivery=f"rot-{n}"
                )
                answer = client.post(
                    f"{ingress.url}/webhooks/github/rot-{source}", content=body, headers=headers
                )
                answers[answer.status_code] += 1
                n += 1
                time.sleep(0.01)

    streaming = threading.Thread(target=stream)
    streaming.start()
    try:
        time.sleep(1.0)
        rotated = subprocess.run(
            [sys.executable, "-m", "worker.cli", "secrets", "rotate", "--batch-size", "5"],
            cwd=ROOT,
            env=worker_environment(postgres_url, broker_url, TASKHOOK_ENCRYPTION_KEYS=both),
            capture_output=True,
            text=True,
            timeout=120,
        )
        time.sleep(1.5)  # the ingress re-reads every source, each sealed by NEW now
    finally:
        stop.set()
        streaming.join()
    assert rotated.returncode == 0, rotated.stderr
    assert f"{SOURCES} sealed" in rotated.stdout
    assert rotated.stdout.count("Sealed 5 under key") == SOURCES // 5  # batch by batch

    assert answers[202] > 100 and set(answers) == {202}, answers
    metrics = httpx.get(f"{ingress.url}/metrics", timeout=10).text
    rejected = [
        line
        for line in metrics.splitlines()
        if line.startswith("taskhook_rejected_signatures_total{") and not line.endswith(" 0.0")
    ]
    assert rejected == []
    with session_scope(sessions) as session:
        assert credential_counts(session) == {sealing.key_id(NEW): SOURCES}
    assert f'taskhook_sealed_credentials{{key_id="{sealing.key_id(NEW)}"}} {SOURCES}.0' in metrics
