"""Scenario 10: security -> nobody reaches another workspace, nobody releases
without the operator role, signatures are compared in constant time, and no
secret appears in any log line of the whole run.

- Two tenants, acme and globex. Every route of the app -- read from the app
  itself, so a new route fails here until it is covered -- is called against
  globex's workspace, tasks, sources and identities with acme's member and
  operator tokens and with no token: refused (404 that says nothing, 401),
  no globex data in any answer, and globex's rows unchanged afterwards.
- Release with no token (401), a member token (403) and another workspace's
  operator token (404): refused, the identity still held, no audit row.
- Signatures: every verification runs ``hmac.compare_digest`` once per active
  secret, whatever the signature (a spy counts); nothing in ``ingest/``
  compares a signature or a digest with ``==``. The time taken by an early
  and a late mismatch is measured and reported.
- Last, every log the run wrote -- each process's, this process's, the CLI's
  -- is searched for every secret the run handed out: signing secrets, API
  tokens, the private Redis and PostgreSQL passwords.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.routing import Mount, Route

import models.providers.signing
from ingest.app import create_app
from ingest.console import pages as console_pages
from models.access import Caller
from models.console_sessions import CONSOLE_SIGN_IN
from models.db import session_scope
from models.merges import merge
from models.settings import Settings
from models.tables import (
    ApiToken,
    IdentityMerge,
    IdentityRelease,
    Operation,
    SourceSecret,
    Task,
)
from models.tables import Delivery as DeliveryRow
from models.tokens import issue_token
from tests.support.deliveries import fixture, gitlab_headers, sign
from tests.support.invariants import assert_invariants
from tests.support.processes import ROOT
from tests.support.stack import Tenant, add_tenant, database_view

pytestmark = [pytest.mark.reliability, pytest.mark.postgres]

SCENARIO = "10. security"
#: The repository of globex's delivery: in no answer to an outsider.
GLOBEX_REPO = "secret-roadmap-repo"
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@dataclass
class Tenants:
    client: TestClient
    engine: Engine
    sessions: sessionmaker[Session]
    acme: Tenant
    globex: Tenant
    tokens: dict[str, str]
    globex_task: int
    globex_identity: str
    #: A delivery of globex's, for an outsider to look at and replay.
    globex_delivery: int
    #: A merge of two globex tasks, for an outsider to try to undo.
    globex_merge: int

    def auth(self, who: str | None) -> dict[str, str]:
        return {} if who is None else {"Authorization": f"Bearer {self.tokens[who]}"}

    def globex_state(self) -> list[tuple]:
        with self.sessions() as session:
            tasks = session.execute(
                select(
                    Task.id,
                    Task.title,
                    Task.description,
                    Task.external_id,
                    Task.external_id_settled_at,
                    Task.archived_at,
                    Task.updated_at,
                )
                .where(Task.workspace_id == self.globex.workspace_id)
                .order_by(Task.id)
            ).all()
            releases = session.scalar(select(func.count()).select_from(IdentityRelease))
            deliveries = session.execute(
                select(DeliveryRow.id, DeliveryRow.status).order_by(DeliveryRow.id)
            ).all()
            secrets = session.scalar(
                select(func.count())
                .select_from(SourceSecret)
                .where(SourceSecret.retired_at.is_(None))
            )
            revoked = session.scalar(
                select(func.count()).select_from(ApiToken).where(ApiToken.revoked_at.is_not(None))
            )
            # Acts on globex's rows; an attacker's own console sign-in is
            # recorded as an operation too, and it is not globex's.
            operations = session.scalar(
                select(func.count()).select_from(Operation).where(Operation.kind != CONSOLE_SIGN_IN)
            )
            merges = session.execute(
                select(IdentityMerge.id, IdentityMerge.undone_at).order_by(IdentityMerge.id)
            ).all()
        return [
            *tasks,
            ("releases", releases),
            ("deliveries", deliveries),
            ("active secrets", secrets),
            ("revoked tokens", revoked),
            ("operations", operations),
            ("merges", merges),
        ]


@pytest.fixture(scope="module")
def tenants(shared_database, secret_book):
    engine, sessions = database_view(shared_database.url)
    acme = add_tenant(sessions, secret_book, "acme", "ACME")
    globex = add_tenant(sessions, secret_book, "globex", "GLX")
    tokens = {}
    with session_scope(sessions) as session:
        for tenant in (acme, globex):
            for role in ("member", "operator"):
                name = f"{tenant.slug}-{role}"
                tokens[name] = secret_book.add(
                    issue_token(
                        session=session, name=name, role=role, workspace_ids=[tenant.workspace_id]
                    ).token
                )
    app = create_app(Settings(database_url=shared_database.url), publish=lambda keys, lane: None)
    with TestClient(app, raise_server_exceptions=False) as client:
        created = client.post(
            "/api/v1/tasks",
            json={
                "workspace_id": globex.workspace_id,
                "title": "Globex secret roadmap",
                "external_id": "jira:GLX-7",
            },
            headers={"Authorization": f"Bearer {tokens['globex-member']}"},
        )
        assert created.status_code == 200, created.text
        # A ping of globex's (stored as ignored: finished, as the invariants
        # want every delivery), for an outsider to look at and replay.
        ping = json.dumps(
            {
                "zen": "Keep it logically awesome.",
                "repository": {"full_name": f"globex/{GLOBEX_REPO}"},
            }
        ).encode()
        posted = client.post(
            f"/webhooks/github/{globex.github_source}",
            content=ping,
            headers={
                "Content-Type": "application/json",
                "X-GitHub-Event": "ping",
                "X-GitHub-Delivery": "globex-ping",
                "X-Hub-Signature-256": sign(ping, globex.github_secret),
            },
        )
        assert posted.status_code == 202, posted.text
        with sessions() as session:
            delivery_id = session.scalar(
                select(DeliveryRow.id).where(DeliveryRow.delivery_id == "globex-ping")
            )
        # Two globex tasks for one item, merged by globex's operator.
        twin = client.post(
            "/api/v1/tasks",
            json={
                "workspace_id": globex.workspace_id,
                "title": "Globex secret roadmap, migrated",
                "external_id": "jira:GLX-8",
            },
            headers={"Authorization": f"Bearer {tokens['globex-member']}"},
        )
        assert twin.status_code == 200, twin.text
        with session_scope(sessions) as session:
            merge_id = merge(
                session=session,
                caller=Caller.of_workspaces("globex-operator", globex.workspace_id),
                into_task_id=created.json()["id"],
                from_task_id=twin.json()["id"],
                operator="globex-operator",
                reason="the site migration",
            ).id
        state = Tenants(
            client,
            engine,
            sessions,
            acme,
            globex,
            tokens,
            created.json()["id"],
            "jira:GLX-7",
            delivery_id,
            merge_id,
        )
        yield state
    engine.dispose()


# --- every route, as an outsider -------------------------------------------------------------

Attempt = Callable[[Tenants, dict[str, str]], list]


def _mcp_call(t: Tenants, headers: dict[str, str]) -> list:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "create_task",
            "arguments": {
                "title": "planted",
                "workspace_id": t.globex.workspace_id,
                "external_id": t.globex_identity,
            },
        },
    }
    return [t.client.post("/mcp/", json=body, headers=MCP_HEADERS | headers)]


#: Per provider: a fixture that creates, and the headers that carry acme's
#: secret (a signature over the body, or GitLab's token as it is).
_OUTSIDER_DELIVERY: dict[str, tuple[str, Callable[[bytes, str], dict[str, str]]]] = {
    "github": (
        "issues__opened",
        lambda body, secret: {
            "X-Hub-Signature-256": sign(body, secret),
            "X-GitHub-Event": "issues",
            "X-GitHub-Delivery": "outsider",
        },
    ),
    "jira": (
        "jira_issue_created__cloud",
        lambda body, secret: {
            "X-Hub-Signature": sign(body, secret),
            "X-Atlassian-Webhook-Identifier": "outsider",
        },
    ),
    "gitlab": (
        "issue_hook__open",
        lambda body, secret: gitlab_headers("issue_hook__open", secret, delivery="outsider"),
    ),
}


def _webhook(provider: str) -> Attempt:
    def attempt(t: Tenants, headers: dict[str, str]) -> list:
        # With acme's secret, sent to globex's source.
        name, dressed = _OUTSIDER_DELIVERY[provider]
        body = fixture(provider, name)
        source = getattr(t.globex, f"{provider}_source")
        secret = getattr(t.acme, f"{provider}_secret")
        sent = {"Content-Type": "application/json"} | dressed(body, secret)
        return [t.client.post(f"/webhooks/{provider}/{source}", content=body, headers=sent)]

    return attempt


BY_EXTERNAL_ID = "/api/v1/workspaces/{workspace_id}/tasks/by-external-id"


def _console_session(t: Tenants, headers: dict[str, str]) -> str | None:
    """Sign the test client in to the console with the bearer token in
    ``headers``; the session's CSRF token. None, and no session, without one."""
    t.client.cookies.clear()
    token = headers.get("Authorization", " ").split(" ", 1)[1]
    if not token:
        return None
    form = t.client.get("/console/sign-in").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', form).group(1)
    signed_in = t.client.post(
        "/console/sign-in", data={"token": token, "csrf": csrf}, follow_redirects=False
    )
    assert signed_in.status_code == 303, signed_in.text
    page = t.client.get("/console/").text
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


def _console(method: str, path: Callable[[Tenants], str], **fields: Callable) -> Attempt:
    """An outsider's try at a console page or action about globex: signed in
    with acme's token (or not at all), with a valid CSRF token of its own
    session, so that only the workspace check can refuse it."""

    def attempt(t: Tenants, headers: dict[str, str]) -> list:
        csrf = _console_session(t, headers)
        try:
            if method == "GET":
                return [t.client.get(path(t), follow_redirects=False)]
            data = {name: value(t) for name, value in fields.items()} | {"csrf": csrf or ""}
            return [t.client.post(path(t), data=data, follow_redirects=False)]
        finally:
            # The cookie must not authenticate the next attempt's requests.
            t.client.cookies.clear()

    return attempt


#: The console's views that list what the token may see: they answer 200,
#: with nothing of globex's in them.
CONSOLE_LISTS = {
    "/console/",
    "/console/deliveries",
    "/console/sources",
    "/console/tokens",
    "/console/operations",
    "/console/deliveries/live",
}

#: Every tenant-scoped route, and how an outsider tries it against globex.
ATTEMPTS: dict[tuple[str, str], Attempt] = {
    ("POST", "/api/v1/tasks"): lambda t, h: [
        t.client.post(
            "/api/v1/tasks",
            json={"workspace_id": t.globex.workspace_id, "title": "planted", "external_id": x},
            headers=h,
        )
        for x in (t.globex_identity, "jira:NEW-1")
    ],
    ("GET", BY_EXTERNAL_ID): lambda t, h: [
        t.client.get(
            f"/api/v1/workspaces/{t.globex.workspace_id}/tasks/by-external-id",
            params={"external_id": t.globex_identity},
            headers=h,
        )
    ],
    ("DELETE", BY_EXTERNAL_ID): lambda t, h: [
        t.client.delete(
            f"/api/v1/workspaces/{t.globex.workspace_id}/tasks/by-external-id",
            params={"external_id": t.globex_identity, "reason": "outsider"},
            headers=h,
        )
    ],
    ("GET", "/api/v1/tasks/{task_id}"): lambda t, h: [
        t.client.get(f"/api/v1/tasks/{t.globex_task}", headers=h)
    ],
    ("PATCH", "/api/v1/tasks/{task_id}"): lambda t, h: [
        t.client.patch(f"/api/v1/tasks/{t.globex_task}", json={"title": "pwned"}, headers=h)
    ],
    ("DELETE", "/api/v1/tasks/{task_id}"): lambda t, h: [
        t.client.delete(f"/api/v1/tasks/{t.globex_task}", headers=h)
    ],
    ("POST", "/api/v1/tasks/{task_id}/archive"): lambda t, h: [
        t.client.post(f"/api/v1/tasks/{t.globex_task}/archive", headers=h)
    ],
    ("GET", "/api/v1/workspaces/{workspace_id}/tasks"): lambda t, h: [
        t.client.get(f"/api/v1/workspaces/{t.globex.workspace_id}/tasks", headers=h)
    ],
    ("GET", "/api/v1/workspaces/{workspace_id}/events"): lambda t, h: [
        t.client.get(f"/api/v1/workspaces/{t.globex.workspace_id}/events", headers=h),
        t.client.get(
            f"/api/v1/workspaces/{t.globex.workspace_id}/events",
            params={"timeout": 0.2},
            headers=h | {"Accept": "text/event-stream"},
        ),
    ],
    **{
        ("POST", f"/webhooks/{provider}/{{source}}"): _webhook(provider)
        for provider in _OUTSIDER_DELIVERY
    },
    ("*", "/mcp"): _mcp_call,
    ("GET", "/console/"): _console("GET", lambda t: "/console/"),
    ("GET", "/console/deliveries"): _console(
        "GET",
        lambda t: f"/console/deliveries?q={t.globex_delivery}",
    ),
    ("GET", "/console/deliveries/live"): _console(
        "GET", lambda t: f"/console/deliveries/live?watch={t.globex_delivery}&timeout=0.3"
    ),
    ("GET", "/console/deliveries/{delivery_id:int}"): _console(
        "GET", lambda t: f"/console/deliveries/{t.globex_delivery}"
    ),
    ("GET", "/console/deliveries/{delivery_id:int}/body"): _console(
        "GET", lambda t: f"/console/deliveries/{t.globex_delivery}/body"
    ),
    ("POST", "/console/deliveries/{delivery_id:int}/replay"): _console(
        "POST", lambda t: f"/console/deliveries/{t.globex_delivery}/replay"
    ),
    ("POST", "/console/replays/dry-run"): _console(
        "POST", lambda t: "/console/replays/dry-run", source=lambda t: t.globex.github_source
    ),
    ("POST", "/console/replays"): _console(
        "POST",
        lambda t: "/console/replays",
        source=lambda t: t.globex.github_source,
        name=lambda t: "an outsider's run",
    ),
    ("GET", "/console/operations"): _console("GET", lambda t: "/console/operations"),
    ("GET", "/console/tasks"): _console(
        "GET", lambda t: f"/console/tasks?workspace={t.globex.slug}&external_id=jira:GLX-7"
    ),
    ("POST", "/console/tasks/release"): _console(
        "POST",
        lambda t: "/console/tasks/release",
        workspace=lambda t: t.globex.slug,
        external_id=lambda t: t.globex_identity,
        expected_holder=lambda t: "GLX-1",
        reason=lambda t: "outsider",
        confirm=lambda t: t.globex_identity,
    ),
    ("POST", "/console/tasks/merge"): _console(
        "POST",
        lambda t: "/console/tasks/merge",
        workspace=lambda t: t.globex.slug,
        external_id=lambda t: t.globex_identity,
        into=lambda t: str(t.globex_task),
        reason=lambda t: "outsider",
        **{"from": lambda t: "GLX-2", "confirm": lambda t: "GLX-2"},
    ),
    ("POST", "/console/merges/{merge_id:int}/undo"): _console(
        "POST",
        lambda t: f"/console/merges/{t.globex_merge}/undo",
        workspace=lambda t: t.acme.slug,
        external_id=lambda t: t.globex_identity,
        reason=lambda t: "outsider",
    ),
    ("GET", "/console/sources"): _console("GET", lambda t: "/console/sources"),
    ("POST", "/console/sources/{slug}/rotate-secret"): _console(
        "POST", lambda t: f"/console/sources/{t.globex.github_source}/rotate-secret"
    ),
    ("POST", "/console/sources/{slug}/finish-rotation"): _console(
        "POST", lambda t: f"/console/sources/{t.globex.github_source}/finish-rotation"
    ),
    ("GET", "/console/tokens"): _console("GET", lambda t: "/console/tokens"),
    ("POST", "/console/tokens/{token_id:int}/revoke"): _console(
        "POST", lambda t: f"/console/tokens/{_token_id(t, 'globex-operator')}/revoke"
    ),
}


def _token_id(t: Tenants, name: str) -> int:
    with t.sessions() as session:
        return session.scalar(select(ApiToken.id).where(ApiToken.name == name))


#: Routes that hold no tenant's data, and why they may answer anyone.
PUBLIC = {
    ("GET", "/"): "a redirect to the console, which asks for a sign-in",
    ("GET", "/healthz"): "liveness: says 'ok'",
    ("GET", "/readyz"): "readiness: names no tenant",
    ("GET", "/metrics"): "operations: counters by provider and source slug (see the docs)",
    ("GET", "/openapi.json"): "the API's description",
    ("GET", "/docs"): "the API's description",
    ("GET", "/docs/oauth2-redirect"): "part of /docs",
    ("GET", "/redoc"): "the API's description",
    ("*", "/console/static"): "the console's own script, style and chart library",
    ("GET", "/console/sign-in"): "the sign-in form",
    ("POST", "/console/sign-in"): "signing in: a session of the token's own",
    ("POST", "/console/sign-out"): "ends the caller's own session",
}


def routes_of(app) -> set[tuple[str, str]]:
    found = {
        (method.upper(), path)
        for path, methods in app.openapi()["paths"].items()
        for method in methods
    }
    # The console's pages are not in the OpenAPI document, and FastAPI keeps
    # an included router's routes behind it: they are read from their router.
    for route in [*app.routes, *console_pages.router.routes]:
        if isinstance(route, Mount):
            found.add(("*", route.path))
        elif isinstance(route, Route):
            found.update((method, route.path) for method in route.methods - {"HEAD"})
    return found


def test_every_route_is_covered_by_the_two_tenant_suite(tenants: Tenants):
    uncovered = routes_of(tenants.client.app) - set(ATTEMPTS) - set(PUBLIC)
    assert uncovered == set(), f"add these routes to ATTEMPTS or PUBLIC: {sorted(uncovered)}"


@pytest.mark.parametrize("who", ["acme-member", "acme-operator", None])
@pytest.mark.parametrize("route", list(ATTEMPTS), ids=lambda route: f"{route[0]} {route[1]}")
def test_an_outsider_reaches_nothing_of_another_workspace(tenants: Tenants, route, who, figures):
    before = tenants.globex_state()
    answers = ATTEMPTS[route](tenants, tenants.auth(who))
    for answer in answers:
        text = answer.text
        if route[1].startswith("/console"):
            # A page shows back what was asked (the identity typed in);
            # nothing else of globex's may be on it.
            text = text.replace(tenants.globex_identity, "")
        assert "Globex secret roadmap" not in text and "GLX-" not in text, text
        assert GLOBEX_REPO not in text, text
        if route[1].startswith("/console"):
            if who is None:  # signed out: sent to sign in
                assert answer.status_code == 303, text
                assert answer.headers["location"].startswith("/console/sign-in")
            elif route[1] in CONSOLE_LISTS:
                assert answer.status_code == 200, text
                assert tenants.globex.github_source not in text, text
                assert "event: delivery" not in text, text  # the live stream's, of globex's
            elif route[0] == "POST" and who == "acme-member":
                assert answer.status_code in (403, 404), text  # no act for a member
            else:
                assert answer.status_code == 404, (answer.status_code, text)
        elif route[1].startswith("/webhooks/"):
            assert answer.status_code == 401, text  # acme's secret does not sign for globex
        elif who is None:
            assert answer.status_code == 401, text
        elif route == ("*", "/mcp"):
            reply = answer.json()
            assert answer.status_code == 200 and reply["result"]["isError"] is True, reply
            assert "not found" in json.dumps(reply), reply
        else:
            assert answer.status_code == 404, (answer.status_code, text)
            assert answer.json() in ({"error": "task not found"}, {"error": "task not created"})
    assert tenants.globex_state() == before


def test_the_mcp_server_offers_no_release(tenants: Tenants):
    listing = tenants.client.post(
        "/mcp/",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers=MCP_HEADERS | tenants.auth("acme-operator"),
    )
    names = [tool["name"] for tool in listing.json()["result"]["tools"]]
    assert names == ["create_task"]


# --- release: only an operator of the workspace -----------------------------------------------


@pytest.mark.parametrize(
    ("who", "status"),
    [(None, 401), ("globex-member", 403), ("acme-operator", 404), ("acme-member", 404)],
)
def test_release_without_the_operator_role_of_the_workspace_is_refused(
    tenants: Tenants, who, status
):
    def audits() -> int:
        # Counted before and after: the module's tenants are shared, and another
        # test's legitimate release may already have written its audit row.
        with tenants.sessions() as session:
            return session.scalar(select(func.count()).select_from(IdentityRelease))

    audits_before = audits()
    response = tenants.client.delete(
        f"/api/v1/workspaces/{tenants.globex.workspace_id}/tasks/by-external-id",
        params={"external_id": tenants.globex_identity, "reason": "not mine to release"},
        headers=tenants.auth(who),
    )
    assert response.status_code == status, response.text
    with tenants.sessions() as session:
        holder = session.scalar(select(Task.id).where(Task.external_id == tenants.globex_identity))
    assert (holder, audits()) == (tenants.globex_task, audits_before)


def test_an_operator_of_the_workspace_may_release_and_is_audited(tenants: Tenants, figures):
    # The same call that the outsiders tried, by globex's own operator, on a new identity.
    created = tenants.client.post(
        "/api/v1/tasks",
        json={
            "workspace_id": tenants.globex.workspace_id,
            "title": "t",
            "external_id": "jira:GLX-9",
        },
        headers=tenants.auth("globex-member"),
    )
    response = tenants.client.delete(
        f"/api/v1/workspaces/{tenants.globex.workspace_id}/tasks/by-external-id",
        params={"external_id": "jira:GLX-9", "reason": "a test of the operator role"},
        headers=tenants.auth("globex-operator"),
    )
    assert response.status_code == 204, response.text
    with tenants.sessions() as session:
        audit = session.scalars(
            select(IdentityRelease).where(IdentityRelease.external_id == "jira:GLX-9")
        ).one()
    assert (audit.operator, audit.task_id) == ("globex-operator", created.json()["id"])
    assert_invariants(tenants.engine)
    figures.record(
        SCENARIO,
        routes_tried_as_outsider=len(ATTEMPTS),
        callers_per_route="acme member, acme operator, no token",
        release_refused="no token 401, member 403, other workspace's operator 404",
        release_by_the_workspace_operator="204, audit row names the token",
    )


# --- signatures: constant time ----------------------------------------------------------------


def test_every_signature_check_compares_in_constant_time_against_every_secret(monkeypatch, figures):
    body = fixture("jira", "jira_issue_created__cloud")
    secrets = ["first-secret", "second-secret", "third-secret"]
    good = sign(body, secrets[1])
    presented = {
        "valid": good,
        "first byte wrong": "sha256=" + ("0" if good[7] != "0" else "1") + good[8:],
        "last byte wrong": good[:-1] + ("0" if good[-1] != "0" else "1"),
        "truncated": good[:20],
        "SHA-1 only": "sha1=" + hmac.new(secrets[1].encode(), body, hashlib.sha1).hexdigest(),
        "empty": "",
    }
    calls: list[tuple[type, type]] = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((type(a), type(b)))
        return real(a, b)

    # Wherever the check lives, it calls the hmac module's compare_digest.
    monkeypatch.setattr(hmac, "compare_digest", spy)
    for name, signature in presented.items():
        calls.clear()
        verified = models.providers.signing.verify_hmac_sha256(body, signature, secrets)
        assert verified is (name == "valid")
        assert calls == [(bytes, bytes)] * len(secrets), name

    timings = _mismatch_timings(body, good)
    figures.record(SCENARIO, signature_check_timings=timings)


def _mismatch_timings(body: bytes, good: str) -> dict:
    early = "sha256=" + ("0" if good[7] != "0" else "1") + good[8:]
    late = good[:-1] + ("0" if good[-1] != "0" else "1")
    secrets = ["secret"]
    samples = {"first byte wrong": [], "last byte wrong": []}
    for _ in range(2000):
        for name, signature in (("first byte wrong", early), ("last byte wrong", late)):
            started = time.perf_counter_ns()
            models.providers.signing.verify_hmac_sha256(body, signature, secrets)
            samples[name].append(time.perf_counter_ns() - started)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "median_ns": medians,
        "late_over_early": round(medians["last byte wrong"] / medians["first byte wrong"], 3),
    }


def test_nothing_in_ingest_compares_a_signature_or_secret_with_equality():
    suspicious = []
    for path in sorted((ROOT / "ingest").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(
                isinstance(op, ast.Eq | ast.NotEq) for op in node.ops
            ):
                text = ast.unparse(node).lower()
                # (A body's sha256 against the stored one's is no secret: not matched.)
                if any(word in text for word in ("signature", "hmac", "secret", "token")):
                    suspicious.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert suspicious == []


# --- last: no secret in any log line of the whole run ----------------------------------------


@pytest.mark.runs_last
def test_no_secret_of_the_run_appears_in_any_log(log_folder: Path, secret_book, figures):
    """Runs last (``runs_last``, tests/conftest.py): every log file the run
    wrote, searched for every secret it handed out."""
    logs = [path for path in log_folder.rglob("*") if path.is_file() and path.suffix != ".json"]
    leaks = []
    lines = 0
    for path in logs:
        text = path.read_bytes().decode("utf-8", "replace")
        lines += text.count("\n")
        for secret in secret_book.values:
            if secret in text:
                leaks.append(f"{path.relative_to(log_folder)}: {secret[:12]}...")
    assert logs and secret_book.values
    assert leaks == []
    figures.record(
        SCENARIO,
        secrets_searched=len(secret_book.values),
        log_files_searched=len(logs),
        log_lines_searched=lines,
        secrets_found=0,
    )
