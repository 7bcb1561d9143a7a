"""Real fixture bodies, signed and dressed in the headers their provider sends.

Shared by the ingress tests, the end-to-end tests and the benchmarks, so a
delivery is built the same way everywhere.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
import uuid
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"

#: The event header GitHub sends with each fixture (the action is in the body).
GITHUB_EVENT_OF = {
    "installation": "installation",
    "issue_comment": "issue_comment",
    "issues": "issues",
    "ping": "ping",
    "pull_request": "pull_request",
    "push": "push",
}

#: The X-Gitlab-Event GitLab sends with each fixture (the action is in the body).
GITLAB_EVENT_OF = {
    "issue_hook": "Issue Hook",
    "merge_request_hook": "Merge Request Hook",
    "note_hook": "Note Hook",
    "push_hook": "Push Hook",
}
#: What GitLab's User-Agent names: its version (``GitLab/<version>``).
GITLAB_VERSION = "18.4.0"


#: When "now" is for this test run: Jira's bodies say when they were sent,
#: and the ingress refuses old ones (TASKHOOK_MAX_DELIVERY_AGE_SECONDS).
SENT_AT_MS = time.time_ns() // 1_000_000
_JIRA_TIMESTAMP = re.compile(rb'("timestamp":\s*)\d+')


def fixture(provider: str, name: str) -> bytes:
    """The recorded body, byte for byte -- but for a Jira body's ``timestamp``,
    which says the test run's start (:data:`SENT_AT_MS`), as a fresh delivery
    would. The same for every call in a run, so a redelivery is the same bytes."""
    body = (FIXTURES / provider / f"{name}.json").read_bytes()
    if provider == "jira":
        body = _JIRA_TIMESTAMP.sub(rb"\g<1>%d" % SENT_AT_MS, body, count=1)
    return body


def fixture_names(provider: str) -> list[str]:
    return sorted(path.stem for path in (FIXTURES / provider).glob("*.json"))


def sign(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_headers(
    name: str, body: bytes, secret: str, *, delivery: str | None = None, **extra: str
) -> dict[str, str]:
    """Headers as GitHub sends them for fixture ``name`` (``issues__opened``)."""
    event = GITHUB_EVENT_OF[name.split("__")[0]]
    return {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/abc123",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-GitHub-Hook-ID": "123456",
        "X-Hub-Signature-256": sign(body, secret),
        **extra,
    }


def jira_headers(
    body: bytes, secret: str, *, delivery: str | None = None, **extra: str
) -> dict[str, str]:
    """Headers as Jira Cloud sends them (the event is in the body)."""
    return {
        "Content-Type": "application/json; charset=UTF-8",
        "User-Agent": "Atlassian Webhook HTTP Client",
        "X-Atlassian-Webhook-Identifier": delivery or str(uuid.uuid4().int % 10**12),
        "X-Hub-Signature": sign(body, secret),
        **extra,
    }


def gitlab_headers(
    name: str, token: str, *, delivery: str | None = None, **extra: str
) -> dict[str, str]:
    """Headers as GitLab sends them for fixture ``name`` (``issue_hook__open``):
    the secret token as it is, no signature (tests/fixtures/HEADERS.md)."""
    return {
        "Content-Type": "application/json",
        "User-Agent": f"GitLab/{GITLAB_VERSION}",
        "X-Gitlab-Event": GITLAB_EVENT_OF[name.split("__")[0]],
        "X-Gitlab-Token": token,
        "Idempotency-Key": delivery or str(uuid.uuid4()),
        "X-Gitlab-Event-UUID": str(uuid.uuid4()),
        "X-Gitlab-Webhook-UUID": str(uuid.uuid4()),
        "X-Gitlab-Instance": "https://gitlab.example.com",
        **extra,
    }
