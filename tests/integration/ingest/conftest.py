"""What the ingress tests share: an app on the store, with a source per provider
(``ingress``), and the REST API with a token of each role (``api``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from ingest.app import create_app
from models.db import session_scope
from models.settings import Settings
from models.tokens import issue_token
from tests.support.console import Console, open_console
from tests.support.ingress import Api, Ingress, open_ingress
from tests.support.stores import Store


@pytest.fixture
def ingress(store: Store) -> Iterator[Ingress]:
    yield from open_ingress(store)


@pytest.fixture
def api(store: Store) -> Iterator[Api]:
    acme, globex = store.workspace("acme", "ACME"), store.workspace("globex", "GLX")
    tokens = {}
    with session_scope(store.sessions) as session:
        for name, role, workspace in [
            ("acme-member", "member", acme.id),
            ("acme-operator", "operator", acme.id),
            ("globex-member", "member", globex.id),
            ("globex-operator", "operator", globex.id),
        ]:
            tokens[name] = issue_token(
                session=session, name=name, role=role, workspace_ids=[workspace]
            ).token
    app = create_app(Settings(database_url=store.url), publish=lambda keys, lane: None)
    with TestClient(app) as client:
        yield Api(client, store, acme.id, globex.id, tokens)


@pytest.fixture
def console(store: Store) -> Iterator[Console]:
    """The console's app with two workspaces, a GitHub source and tokens in each."""
    yield from open_console(store)
