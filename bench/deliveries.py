"""Signed deliveries of distinct issues, built from the real fixture bodies.

A fixture is turned into a template once: its issue number (or Jira issue key)
is replaced by a sentinel, so delivery ``n`` is the fixture for issue ``n`` --
a distinct external id per delivery -- at the cost of a ``bytes.join`` and an
HMAC, cheap enough to do per request in the load generator. Each delivery is
dressed in its provider's own headers (``Provider.sample_headers``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from models.providers import PROVIDERS

#: The recorded bodies are the test suite's fixtures (tests/fixtures/README.md
#: says where each comes from). They are read here as files: the benchmarks
#: import nothing from tests/, and there is no other copy of them.
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"

_SENTINEL = 987654321

#: The fixtures the benchmarks post (real create events, 9.6 KB to 28 KB), as
#: ``provider:fixture``, and the event each is a delivery of.
KINDS = {
    "github:issues__opened": "issues.opened",
    "github:pull_request__opened": "pull_request.opened",
    "jira:jira_issue_created__cloud": "jira:issue_created",
}


def recorded_body(provider: str, name: str, sent_at: float | None = None) -> bytes:
    """Fixture ``name`` as recorded, but sent at ``sent_at`` (now by default):
    a Jira body says when it was sent, and the ingress refuses old ones."""
    body = (FIXTURES / provider / f"{name}.json").read_bytes()
    return PROVIDERS[provider].with_sent_at(body, time.time() if sent_at is None else sent_at)


@dataclass(frozen=True)
class Template:
    provider: str
    name: str
    event: str
    parts: tuple[bytes, ...]

    def body(self, number: int) -> bytes:
        return str(number).encode().join(self.parts)


def template(kind: str, sent_at: float | None = None) -> Template:
    provider, name = kind.split(":")
    payload = json.loads(recorded_body(provider, name, sent_at))
    if provider == "jira":
        # Key and id both: a Jira issue's id is its stable key (models/names.py),
        # and two issues never share one.
        payload["issue"]["key"] = f"BENCH-{_SENTINEL}"
        payload["issue"]["id"] = str(_SENTINEL)
    elif "issue" in payload:
        payload["issue"]["number"] = _SENTINEL
    else:
        payload["number"] = _SENTINEL
    # Indented as GitHub and Jira send them, so the size stays the fixture's.
    text = json.dumps(payload, indent=2).encode()
    parts = tuple(text.split(str(_SENTINEL).encode()))
    if len(parts) < 2:
        raise ValueError(f"{kind}: the sentinel must occur in the body")
    return Template(provider, name, KINDS[kind], parts)


@dataclass(frozen=True)
class Delivery:
    path: str
    body: bytes
    headers: dict[str, str]


class DeliveryFactory:
    """Delivery ``index`` of a run: the same index is the same delivery (a
    redelivery), ``tag`` keeps two runs' delivery ids apart."""

    def __init__(
        self,
        *,
        secret: str,
        sources: dict[str, str],
        tag: str,
        kinds: tuple[str, ...] = tuple(KINDS),
        first_number: int = 1,
        sent_at: float | None = None,
    ) -> None:
        # One send time for the run: the same index is the same bytes.
        self.templates = [template(kind, sent_at) for kind in kinds]
        self.secret, self.sources, self.tag = secret, sources, tag
        self.first_number = first_number

    def delivery(self, index: int) -> Delivery:
        chosen = self.templates[index % len(self.templates)]
        body = chosen.body(self.first_number + index)
        headers = PROVIDERS[chosen.provider].sample_headers(
            body, self.secret, event=chosen.event, delivery_id=f"{self.tag}-{index}"
        )
        return Delivery(
            f"/webhooks/{chosen.provider}/{self.sources[chosen.provider]}", body, headers
        )

    def mean_body_bytes(self) -> int:
        sizes = [len(self.delivery(index).body) for index in range(len(self.templates))]
        return sum(sizes) // len(sizes)
