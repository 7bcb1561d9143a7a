"""What the ingress tests share: an app on the store, with a source per provider
(``ingress``), and the REST API with a token of each role (``api``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from ingest.app import create_app
from models.db import session_scope
from models.settings import Settings
from models.sources import add_source
from models.tokens import issue_token
from tests.support.console import Console, open_console
from tests.support.ingress import (
    GITHUB_SECRET,
    GITLAB_TOKEN,
    JIRA_SECRET,
    JIRA_SITE,
    Api,
    Ingress,
    settings_for,
)
from tests.support.stores import Store


@pytest.fixture
def ingress(store: Store) -> Iterator[Ingress]:
    workspace = store.workspace()
    with session_scope(store.sessions) as session:
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug="acme-github",
            secret=GITHUB_SECRET,
            create_events=["issues.opened", "pull_request.opened"],
        )
        add_source(
            session=session,
            provider="jira",
            workspace_id=workspace.id,
            slug="acme-jira",
            secret=JIRA_SECRET,
            create_events=["jira:issue_created"],
            site_url=JIRA_SITE,
        )
        add_source(
            session=session,
            provider="gitlab",
            workspace_id=workspace.id,
            slug="acme-gitlab",
            secret=GITLAB_TOKEN,
            create_events=["Issue Hook.open", "Merge Request Hook.open"],
        )
    published: list[int] = []
    app = create_app(settings_for(store.url), publish=published.extend)
    with TestClient(app) as client:
        yield Ingress(client, store, published)


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
    app = create_app(Settings(database_url=store.url), publish=lambda keys: None)
    with TestClient(app) as client:
        yield Api(client, store, acme.id, globex.id, tokens)


@pytest.fixture
def console(store: Store) -> Iterator[Console]:
    """The console's app with two workspaces, a GitHub source and tokens in each."""
    yield from open_console(store)
