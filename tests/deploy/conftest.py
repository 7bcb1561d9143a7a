"""An ingress on the store with a GitHub and a Jira source, and its /metrics parsed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
from fastapi.testclient import TestClient
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from ingest.app import create_app
from ingest.relay import Publish
from models.db import session_scope
from models.settings import Settings
from models.sources import add_source
from tests.conftest import Store
from tests.deliveries import fixture, sample_headers

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


@pytest.fixture
def sourced(store: Store) -> Store:
    """The store, with the sources ``acme-github`` and ``acme-jira``."""
    workspace = store.workspace()
    with session_scope(store.sessions) as session:
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug="acme-github",
            secret=SECRETS["github"],
            create_events=["issues.opened", "pull_request.opened"],
        )
        add_source(
            session=session,
            provider="jira",
            workspace_id=workspace.id,
            slug="acme-jira",
            secret=SECRETS["jira"],
            create_events=["jira:issue_created"],
            site_url="https://acme.atlassian.net",
        )
    return store


@pytest.fixture
def ingress(sourced: Store) -> Callable[..., AbstractContextManager[TestClient]]:
    """``with ingress(publish=..., **settings) as client``: an app on the store."""

    @contextmanager
    def running(publish: Publish | None = None, **settings: object) -> Iterator[TestClient]:
        app = create_app(
            Settings(database_url=sourced.url, source_cache_seconds=0, **settings),
            publish=publish or (lambda keys: None),
        )
        with TestClient(app) as client:
            yield client

    return running
