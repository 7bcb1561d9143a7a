"""An ingress's /metrics, parsed (``scraped``, ``value``), and deliveries posted
to the sources ``acme-github`` and ``acme-jira`` that tests/deploy/conftest.py
adds (``post``)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.support.deliveries import fixture, sample_headers

SECRETS = {"github": "gh-secret-1", "jira": "jira-secret-1"}


def scraped(client: TestClient) -> dict[str, Metric]:
    """The families of ``client``'s /metrics, by name."""
    answer = client.get("/metrics")
    assert answer.status_code == 200, answer.text
    return {family.name: family for family in text_string_to_metric_families(answer.text)}


def value(families: dict[str, Metric], sample: str, **labels: str) -> float | None:
    """The value of the sample named ``sample`` with exactly ``labels``, or None."""
    for family in families.values():
        for found in family.samples:
            if found.name == sample and found.labels == labels:
                return found.value
    return None


def post(
    client: TestClient,
    provider: str,
    name: str,
    *,
    secret: str | None = None,
    delivery: str | None = None,
):
    """POST fixture ``name`` to the source ``acme-<provider>``, signed with
    ``secret`` (the source's by default), under ``delivery`` (a new id by default)."""
    body = fixture(provider, name)
    sent = sample_headers(provider, name, body, secret or SECRETS[provider], delivery=delivery)
    return client.post(f"/webhooks/{provider}/acme-{provider}", content=body, headers=sent)
