"""Real fixture bodies, signed and dressed in the headers their provider sends.

Used by the ingress tests and the end-to-end tests. The headers themselves
are each provider's own (``Provider.sample_headers``), the same the demo and
the benchmarks send; the helpers here name a fixture's event and keep the
call sites short.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from models.providers import PROVIDERS
from models.providers.gitlab import SAMPLE_VERSION
from models.providers.signing import hmac_sha256_signature

FIXTURES = Path(__file__).parents[1] / "fixtures"

#: The event header GitHub sends with each fixture (the action is in the body).
GITHUB_EVENT_OF = {
    "installation": "installation",
    "issue_comment": "issue_comment",
    "issues": "issues",
    "ping": "ping",
    "pull_request": "pull_request",
    "push": "push",
    "repository": "repository",
}

#: The X-Gitlab-Event GitLab sends with each fixture (the action is in the body).
GITLAB_EVENT_OF = {
    "issue_hook": "Issue Hook",
    "merge_request_hook": "Merge Request Hook",
    "note_hook": "Note Hook",
    "push_hook": "Push Hook",
}
#: What GitLab's User-Agent names: its version (``GitLab/<version>``).
GITLAB_VERSION = SAMPLE_VERSION


#: When "now" is for this test run: Jira's bodies say when they were sent,
#: and the ingress refuses old ones (TASKHOOK_MAX_DELIVERY_AGE_SECONDS).
SENT_AT_MS = time.time_ns() // 1_000_000


def fixture(provider: str, name: str) -> bytes:
    """The recorded body, byte for byte -- but for a Jira body's ``timestamp``,
    which says the test run's start (:data:`SENT_AT_MS`), as a fresh delivery
    would. The same for every call in a run, so a redelivery is the same bytes."""
    body = (FIXTURES / provider / f"{name}.json").read_bytes()
    return PROVIDERS[provider].with_sent_at(body, SENT_AT_MS / 1000)


def gitlab_issue_opened(iid: int) -> bytes:
    """GitLab's recorded ``Issue Hook`` open, as the open of issue ``iid`` of
    its project (``gl-issue/gitlabhq/gitlab-test#<iid>``): two of them are
    two creates of two issues."""
    payload = json.loads(fixture("gitlab", "issue_hook__open"))
    attributes = payload["object_attributes"]
    attributes["id"] = 300 + iid
    attributes["iid"] = iid
    attributes["title"] = f"Issue {iid}"
    attributes["url"] = f"http://example.com/gitlabhq/gitlab-test/-/issues/{iid}"
    return json.dumps(payload).encode()


def fixture_names(provider: str) -> list[str]:
    return sorted(path.stem for path in (FIXTURES / provider).glob("*.json"))


def sign(body: bytes, secret: str) -> str:
    return hmac_sha256_signature(body, secret)


def github_headers(
    name: str, body: bytes, secret: str, *, delivery: str | None = None, **extra: str
) -> dict[str, str]:
    """Headers as GitHub sends them for fixture ``name`` (``issues__opened``)."""
    event = GITHUB_EVENT_OF[name.split("__")[0]]
    sent = PROVIDERS["github"].sample_headers(body, secret, event=event, delivery_id=delivery)
    return sent | extra


def jira_headers(
    body: bytes, secret: str, *, delivery: str | None = None, **extra: str
) -> dict[str, str]:
    """Headers as Jira Cloud sends them (the event is in the body)."""
    return PROVIDERS["jira"].sample_headers(body, secret, delivery_id=delivery) | extra


def gitlab_headers(
    name: str, token: str, *, delivery: str | None = None, **extra: str
) -> dict[str, str]:
    """Headers as GitLab sends them for fixture ``name`` (``issue_hook__open``):
    the secret token as it is, no signature (tests/fixtures/HEADERS.md), so
    the body plays no part."""
    event = GITLAB_EVENT_OF[name.split("__")[0]]
    sent = PROVIDERS["gitlab"].sample_headers(b"", token, event=event, delivery_id=delivery)
    return sent | extra


def sample_headers(
    provider: str, name: str, body: bytes, secret: str, *, delivery: str | None = None
) -> dict[str, str]:
    """Headers as ``provider`` sends them with fixture ``name``'s ``body``."""
    if provider == "github":
        return github_headers(name, body, secret, delivery=delivery)
    if provider == "gitlab":
        return gitlab_headers(name, secret, delivery=delivery)
    return jira_headers(body, secret, delivery=delivery)
