"""The ingress in process, on a test's store: its webhook routes (``Ingress``,
with a source per provider) and its REST API (``Api``, two workspaces and a
token of each role for each). The fixtures ``ingress`` and ``api`` that build
them are in tests/integration/ingest/conftest.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from fastapi.testclient import TestClient
from sqlalchemy import select

from ingest.app import create_app
from models.broker.lanes import Lane
from models.db import session_scope
from models.settings import Settings
from models.sources import add_source
from models.tables import Delivery
from tests.support.deliveries import fixture, sample_headers
from tests.support.stores import Store

GITHUB_SECRET = "gh-secret-1"
JIRA_SECRET = "jira-secret-1"
JIRA_SITE = "https://acme.atlassian.net"
GITLAB_TOKEN = "gl-token-1"
SECRETS = {"github": GITHUB_SECRET, "jira": JIRA_SECRET, "gitlab": GITLAB_TOKEN}


class Published(list):
    """The ingress's publisher in tests: the keys it was given, in order (the
    list itself), and the lane each went to."""

    def __init__(self) -> None:
        super().__init__()
        self.lanes: dict[int, Lane] = {}

    def __call__(self, keys, lane: Lane) -> None:
        self.extend(keys)
        self.lanes.update(dict.fromkeys(keys, lane))


@dataclass
class Ingress:
    client: TestClient
    store: Store
    published: Published

    def send(
        self,
        provider: str,
        name: str,
        *,
        body: bytes | None = None,
        secret: str | None = None,
        source: str | None = None,
        **headers: str,
    ):
        """Post fixture ``name`` (or ``body``) to ``provider``'s route, dressed
        and signed as the provider sends it; ``headers`` add to or replace those."""
        body = fixture(provider, name) if body is None else body
        secret = SECRETS[provider] if secret is None else secret
        sent = sample_headers(provider, name, body, secret) | headers
        route = f"/webhooks/{provider}/{source or f'acme-{provider}'}"
        return self.client.post(route, content=body, headers=sent)

    def github(self, name: str, **options):
        return self.send("github", name, **options)

    def jira(self, name: str, **options):
        return self.send("jira", name, **options)

    def gitlab(self, name: str, *, token: str = GITLAB_TOKEN, **options):
        return self.send("gitlab", name, secret=token, **options)

    def deliveries(self) -> list[Delivery]:
        with self.store.sessions() as session:
            return list(session.scalars(select(Delivery).order_by(Delivery.id)))


def open_ingress(store: Store, **settings: object) -> Iterator[Ingress]:
    """The ingress on ``store``, with a workspace fed by a source per provider
    (``acme-github``, ``acme-jira``, ``acme-gitlab``): what the ``ingress``
    fixtures hand out; ``settings`` override the ingress's."""
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
    published = Published()
    app = create_app(settings_for(store.url, **settings), publish=published)
    with TestClient(app) as client:
        yield Ingress(client, store, published)


def settings_for(url: str, **overrides) -> Settings:
    return Settings(**({"database_url": url, "source_cache_seconds": 0} | overrides))


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# --- the REST API: two workspaces, a token of each role for each -------------------


@dataclass
class Api:
    client: TestClient
    store: Store
    acme: int
    globex: int
    tokens: dict[str, str]

    def as_(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def create(self, who: str = "acme-member", **body):
        body = {"workspace_id": self.acme, "title": "Fix the login page"} | body
        return self.client.post("/api/v1/tasks", json=body, headers=self.as_(who))

    def lookup(self, external_id, who: str = "acme-member", workspace: int | None = None):
        params = {} if external_id is None else {"external_id": external_id}
        return self.client.get(
            f"/api/v1/workspaces/{workspace or self.acme}/tasks/by-external-id",
            params=params,
            headers=self.as_(who),
        )

    def release(
        self, external_id, who="acme-operator", reason="abandoned", workspace=None, expected=None
    ):
        params = {"external_id": external_id, "reason": reason, "expected_task_id": expected}
        return self.client.delete(
            f"/api/v1/workspaces/{workspace or self.acme}/tasks/by-external-id",
            params={k: v for k, v in params.items() if v is not None},
            headers=self.as_(who),
        )

    def count_tasks(self) -> int:
        return self.store.scalar("SELECT count(*) FROM tasks")
