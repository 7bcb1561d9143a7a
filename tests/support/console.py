"""The operator console in process, on a test's store: two workspaces, a
GitHub source in each, tokens of each role, and a signed-in client
(``Console``). The ``console`` fixture is in tests/integration/ingest/conftest.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

from fastapi.testclient import TestClient
from sqlalchemy import select, text

from ingest.app import create_app
from models.db import session_scope
from models.settings import Settings
from models.sources import add_source
from models.tables import Delivery
from models.tokens import issue_token
from tests.support.deliveries import fixture, github_headers
from tests.support.ingress import Published
from tests.support.stores import Store

#: The secret of both workspaces' GitHub sources.
SECRET = "gh-console-secret"


@dataclass
class Console:
    client: TestClient
    store: Store
    acme: int
    globex: int
    tokens: dict[str, str]
    published: Published

    def sign_in(self, who: str) -> str:
        """Sign in as token ``who``; the CSRF token of the session."""
        self.client.cookies.clear()
        form = self.client.get("/console/sign-in")
        answer = self.client.post(
            "/console/sign-in",
            data={"token": self.tokens[who], "csrf": csrf_of(form.text), "next": "/console/"},
            follow_redirects=False,
        )
        assert answer.status_code == 303, answer.text
        return csrf_of(self.client.get("/console/").text)

    def post(self, path: str, csrf: str | None, **fields: str):
        data = fields | ({"csrf": csrf} if csrf is not None else {})
        return self.client.post(path, data=data, follow_redirects=False)

    def deliver(self, title: str = "Fix the login page", number: int = 1) -> int:
        """A signed GitHub ``issues.opened`` for issue ``number``; its inbox id."""
        document = json.loads(fixture("github", "issues__opened"))
        document["issue"]["title"] = title
        document["issue"]["number"] = number
        body = json.dumps(document).encode()
        sent = github_headers("issues__opened", body, SECRET, delivery=f"console-{number}")
        answer = self.client.post("/webhooks/github/acme-github", content=body, headers=sent)
        assert answer.status_code == 202, answer.text
        with self.store.sessions() as session:
            return session.scalar(
                select(Delivery.id).where(Delivery.delivery_id == f"console-{number}")
            )

    def status_of(self, delivery: int) -> str:
        return self.store.scalar("SELECT status FROM deliveries WHERE id = :d", d=delivery)

    def kill(self, *deliveries: int) -> None:
        """Mark deliveries dead, as many failed attempts would."""
        with self.store.engine.begin() as connection:
            for delivery in deliveries:
                connection.execute(
                    text("UPDATE deliveries SET status = 'dead' WHERE id = :d"), {"d": delivery}
                )


def csrf_of(page: str) -> str:
    """The CSRF token of a console page's form."""
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no CSRF field on the page"
    return found.group(1)


def open_console(store: Store, **settings) -> Iterator[Console]:
    """The console's app on ``store`` (``settings`` added to its own), with the
    workspaces acme and globex, a GitHub source and tokens in each."""
    acme, globex = store.workspace("acme", "ACME"), store.workspace("globex", "GLX")
    tokens = {}
    with session_scope(store.sessions) as session:
        add_source(
            session=session,
            provider="github",
            workspace_id=acme.id,
            slug="acme-github",
            secret=SECRET,
            create_events=["issues.opened"],
        )
        add_source(
            session=session,
            provider="github",
            workspace_id=globex.id,
            slug="globex-github",
            secret=SECRET,
            create_events=["issues.opened"],
        )
        for name, role, workspace in [
            ("acme-member", "member", acme.id),
            ("acme-operator", "operator", acme.id),
            ("globex-operator", "operator", globex.id),
        ]:
            tokens[name] = issue_token(
                session=session, name=name, role=role, workspace_ids=[workspace]
            ).token
    published = Published()
    app = create_app(
        Settings(database_url=store.url, source_cache_seconds=0, **settings),
        publish=published,
    )
    with TestClient(app) as client:
        yield Console(client, store, acme.id, globex.id, tokens, published)
