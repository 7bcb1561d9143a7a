"""A workspace fed by a GitHub and a Jira source, and real deliveries stored for them.

Shared by the worker's integration and end-to-end tests: a delivery is
recorded exactly as the ingress records it (``models.inbox.record_delivery``),
from the real fixture bodies under ``tests/fixtures``.
"""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from models.db import session_scope
from models.inbox import WEBHOOK_ORIGIN, IncomingDelivery, record_delivery
from models.intake import NOTHING_READ, Reading, read_delivery
from models.providers import PROVIDERS
from models.sources import add_source
from models.tables import Delivery, Task, TaskSource
from models.workspaces import StepSpec, create_workspace
from tests.support.deliveries import fixture

JIRA_SITE = "https://acme.atlassian.net"
GITHUB_CREATE_EVENTS = ("issues.opened", "pull_request.opened")
JIRA_CREATE_EVENTS = ("jira:issue_created",)

#: Fixture -> the external id and link its task gets (Jira links use JIRA_SITE).
EXPECTED = {
    ("github", "issues__opened"): (
        "gh-issue/Codertocat/Hello-World#1",
        "https://github.com/Codertocat/Hello-World/issues/1",
    ),
    ("github", "pull_request__opened"): (
        "gh-pr/Codertocat/Hello-World#2",
        "https://github.com/Codertocat/Hello-World/pull/2",
    ),
    ("jira", "jira_issue_created__cloud"): ("jira:TES-41", f"{JIRA_SITE}/browse/TES-41"),
    ("jira", "jira_issue_created__cloud_many_fields"): (
        "jira:KT-22",
        f"{JIRA_SITE}/browse/KT-22",
    ),
    ("jira", "jira_issue_created__server_trigger_plugin"): (
        "jira:TEST-4",
        f"{JIRA_SITE}/browse/TEST-4",
    ),
}


@dataclass(frozen=True)
class Feed:
    workspace_id: int
    github_source_id: int
    jira_source_id: int

    def source_id(self, provider: str) -> int:
        return self.github_source_id if provider == "github" else self.jira_source_id


def make_feed(
    sessions: sessionmaker[Session],
    slug: str = "acme",
    prefix: str = "ACME",
    intake_wip_limit: int | None = None,
) -> Feed:
    with session_scope(sessions) as session:
        workspace = create_workspace(
            session=session,
            slug=slug,
            name=slug.title(),
            task_prefix=prefix,
            steps=(StepSpec("Inbox", intake_wip_limit), StepSpec("Done")),
        )
        github = add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug=f"{slug}-github",
            secret="gh-secret",
            create_events=GITHUB_CREATE_EVENTS,
        )
        jira = add_source(
            session=session,
            provider="jira",
            workspace_id=workspace.id,
            slug=f"{slug}-jira",
            secret="jira-secret",
            create_events=JIRA_CREATE_EVENTS,
            site_url=JIRA_SITE,
        )
        return Feed(workspace.id, github.id, jira.id)


def event_of(provider: str, name: str, body: bytes) -> str:
    """The event name the ingress stores for fixture ``name`` (``issues.opened``)."""
    payload = json.loads(body)
    if provider == "jira":
        return payload["webhookEvent"]
    action = payload.get("action")
    header = name.split("__")[0]
    return f"{header}.{action}" if action else header


def store_delivery(
    sessions: sessionmaker[Session],
    source_id: int,
    *,
    body: bytes,
    event: str,
    content_type: str | None = "application/json",
    delivery_id: str | None = None,
    reading: Reading = NOTHING_READ,
    origin: str = WEBHOOK_ORIGIN,
) -> int:
    """Record one delivery as the ingress does, keeping what it read from the
    body (``reading``); returns the inbox row's key."""
    incoming = IncomingDelivery(
        source_id=source_id,
        delivery_id=delivery_id or str(uuid.uuid4()),
        body=body,
        event=event,
        action=None,
        headers={"content-type": content_type or ""},
        content_type=content_type,
        external_id=reading.external_id,
        task=reading.task,
        origin=origin,
    )
    with session_scope(sessions) as session:
        return record_delivery(session=session, incoming=incoming).pk


#: How many fixtures this process stored: each gets bytes of its own.
_STORED = itertools.count()


def store_fixture(
    sessions: sessionmaker[Session],
    feed: Feed,
    provider: str,
    name: str,
    *,
    delivery_id: str | None = None,
    read: bool = True,
    body: bytes | None = None,
    origin: str = WEBHOOK_ORIGIN,
) -> int:
    """Store fixture ``name``; with ``read``, also the task its body describes,
    as the ingress keeps it (``read=False``: a row stored before it was kept).

    Each call stores bytes of its own (trailing white space, which JSON
    ignores): two deliveries never carry the same bytes -- Jira's differ in
    their timestamp -- and the same body under another id is a replay.
    ``body`` stores those bytes instead (a redelivery, a replay)."""
    if body is None:
        body = fixture(provider, name) + b" " * next(_STORED)
    event = event_of(provider, name, body)
    reading = NOTHING_READ
    if read:
        payload = PROVIDERS[provider].decode_body("application/json", body)
        reading = read_delivery(PROVIDERS[provider], event, payload, JIRA_SITE)
    return store_delivery(
        sessions,
        feed.source_id(provider),
        body=body,
        event=event,
        delivery_id=delivery_id,
        reading=reading,
        origin=origin,
    )


def github_issue_body(number: int) -> bytes:
    """GitHub's ``issues.opened`` fixture as issue ``number`` of its repository
    (``gh-issue/Codertocat/Hello-World#<number>``), in bytes of its own each
    call, as :func:`store_fixture`'s."""
    payload = json.loads(fixture("github", "issues__opened"))
    payload["issue"]["number"] = number
    payload["issue"]["html_url"] = f"https://github.com/Codertocat/Hello-World/issues/{number}"
    return json.dumps(payload).encode() + b" " * next(_STORED)


def store_github_issue(
    sessions: sessionmaker[Session],
    feed: Feed,
    number: int,
    *,
    delivery_id: str | None = None,
    body: bytes | None = None,
    origin: str = WEBHOOK_ORIGIN,
) -> int:
    """Store issue ``number``'s ``issues.opened`` (:func:`github_issue_body`),
    with the task its body describes, as the ingress keeps it. Bytes of its
    own each call: a second call for a number is another delivery of it.
    ``body`` (and ``delivery_id``) store those instead: a redelivery."""
    if body is None:
        body = github_issue_body(number)
    reading = read_delivery(PROVIDERS["github"], "issues.opened", json.loads(body), JIRA_SITE)
    return store_delivery(
        sessions,
        feed.github_source_id,
        body=body,
        event="issues.opened",
        delivery_id=delivery_id,
        reading=reading,
        origin=origin,
    )


def delivery(sessions: sessionmaker[Session], pk: int) -> Delivery:
    with sessions() as session:
        return session.get(Delivery, pk)


def tasks_of(sessions: sessionmaker[Session], workspace_id: int) -> list[Task]:
    with sessions() as session:
        return list(
            session.scalars(select(Task).where(Task.workspace_id == workspace_id).order_by(Task.id))
        )


def link_of(sessions: sessionmaker[Session], task_id: int) -> TaskSource | None:
    with sessions() as session:
        return session.scalar(select(TaskSource).where(TaskSource.task_id == task_id))
