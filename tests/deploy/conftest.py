"""An ingress on the store with a GitHub and a Jira source; its /metrics, parsed,
and deliveries posted to it: tests/support/metrics.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
from fastapi.testclient import TestClient

from ingest.app import create_app
from ingest.relay import Publish
from models.db import session_scope
from models.settings import Settings
from models.sources import add_source
from tests.support.metrics import SECRETS
from tests.support.stores import Store


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
            publish=publish or (lambda keys, lane: None),
        )
        with TestClient(app) as client:
            yield client

    return running
