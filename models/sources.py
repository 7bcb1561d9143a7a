"""Webhook sources: which provider's webhook (GitHub, Jira, GitLab, ...) feeds
which workspace, and how its deliveries are verified."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from models.broker.lanes import SourceLane
from models.errors import InvalidSource, SourceNotFound
from models.providers import PROVIDERS as REGISTRY
from models.sealing import PREFIX as SEALED_PREFIX
from models.sealing import is_sealed
from models.tables import SourceSecret, WebhookSource, Workspace, utcnow

#: The provider names a source may have: every registered provider.
PROVIDERS = tuple(REGISTRY)
_SLUG = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$")


@dataclass(frozen=True)
class VerifyingSource:
    """What the ingress needs to take a delivery: the source and its active secrets."""

    id: int
    slug: str
    provider: str
    workspace_id: int
    create_events: frozenset[str]
    site_url: str | None
    secrets: tuple[str, ...]
    #: The lane an operator chose for it (``models.broker.lanes``).
    lane: SourceLane = SourceLane.AUTO
    #: Paused by an operator: its deliveries are stored, not sent.
    paused: bool = False


def add_source(
    *,
    session: Session,
    provider: str,
    workspace_id: int,
    slug: str,
    secret: str,
    create_events: Iterable[str],
    site_url: str | None = None,
) -> WebhookSource:
    if provider not in PROVIDERS:
        raise InvalidSource(f"provider must be one of {', '.join(PROVIDERS)}")
    checked_slug(slug)
    if session.get(Workspace, workspace_id) is None:
        raise InvalidSource(f"workspace {workspace_id} not found")
    events = sorted({event.strip() for event in create_events if event.strip()})
    if not events:
        raise InvalidSource("a source needs at least one event that creates tasks")
    checked_secret(secret)
    if session.scalar(select(WebhookSource.id).where(WebhookSource.slug == slug)) is not None:
        raise InvalidSource(f"a source named {slug!r} already exists")
    source = WebhookSource(
        slug=slug,
        provider=provider,
        workspace_id=workspace_id,
        create_events=events,
        site_url=site_url.rstrip("/") if site_url else None,
    )
    session.add(source)
    session.flush()
    session.add(SourceSecret(source_id=source.id, secret=secret))
    session.flush()
    return source


def checked_slug(slug: str) -> str:
    """``slug`` if a source may be named so; else :class:`InvalidSource` saying
    why (the CLI checks its options with it, too)."""
    if not _SLUG.match(slug):
        raise InvalidSource(
            f"source name {slug!r} must be lowercase letters, digits and dashes (at most 64)"
        )
    return slug


def checked_secret(secret: str) -> str:
    """``secret`` if a source may sign with it; else :class:`InvalidSource`."""
    if not secret or not secret.strip():
        raise InvalidSource("a signing secret cannot be empty")
    if is_sealed(secret):
        # It would be stored as it is, as a value already sealed, and never open.
        raise InvalidSource(f"a signing secret cannot begin with {SEALED_PREFIX!r}")
    return secret


def get_source(*, session: Session, slug: str) -> WebhookSource:
    source = session.scalar(select(WebhookSource).where(WebhookSource.slug == slug))
    if source is None:
        raise SourceNotFound(slug)
    return source


def verifying_source(*, session: Session, provider: str, slug: str) -> VerifyingSource | None:
    """The enabled source of ``provider`` named ``slug`` with its active secrets, or
    None: an unknown source and a disabled one get the same answer."""
    rows = session.execute(
        select(WebhookSource, SourceSecret.secret)
        .join(SourceSecret, SourceSecret.source_id == WebhookSource.id)
        .where(
            WebhookSource.slug == slug,
            WebhookSource.provider == provider,
            WebhookSource.enabled.is_(True),
            SourceSecret.retired_at.is_(None),
        )
    ).all()
    if not rows:
        return None
    source = rows[0][0]
    return VerifyingSource(
        id=source.id,
        slug=source.slug,
        provider=source.provider,
        workspace_id=source.workspace_id,
        create_events=frozenset(source.create_events),
        site_url=source.site_url,
        secrets=tuple(secret for _, secret in rows),
        lane=SourceLane(source.lane),
        paused=source.paused_at is not None,
    )


def set_source_enabled(*, session: Session, slug: str, enabled: bool) -> WebhookSource:
    source = get_source(session=session, slug=slug)
    source.enabled = enabled
    session.flush()
    return source


def set_source_lane(*, session: Session, slug: str, lane: SourceLane) -> WebhookSource:
    """Send source ``slug``'s deliveries down ``lane`` from now on (the
    ingress reads it within ``source_cache_seconds``)."""
    source = get_source(session=session, slug=slug)
    source.lane = lane.value
    session.flush()
    return source


def pause_source(*, session: Session, slug: str) -> WebhookSource:
    """Pause source ``slug``: the ingress still stores and answers its
    deliveries, and sends none; a worker that gets one already sent leaves it
    queued (``models.inbox.claim_statement``), and the sweeper passes it by,
    until :func:`resume_source`. Pausing a paused source changes nothing."""
    source = get_source(session=session, slug=slug)
    if source.paused_at is None:
        source.paused_at = utcnow()
    session.flush()
    return source


def resume_source(*, session: Session, slug: str) -> WebhookSource:
    """Let source ``slug``'s deliveries be taken again. Its backlog waits in
    the inbox, queued: the caller sends it once this commits (the sweeper's
    pages, for this source alone: ``worker.sweeper.sweep``)."""
    source = get_source(session=session, slug=slug)
    source.paused_at = None
    session.flush()
    return source


def add_secret(*, session: Session, slug: str, new_secret: str) -> WebhookSource:
    """Start a rotation: ``new_secret`` verifies alongside the old ones, so the
    provider can be switched over without a single rejected delivery."""
    source = get_source(session=session, slug=slug)
    checked_secret(new_secret)
    session.add(SourceSecret(source_id=source.id, secret=new_secret))
    session.flush()
    return source


def retire_older_secrets(*, session: Session, slug: str) -> int:
    """Finish a rotation: every active secret but the newest stops verifying.
    Returns how many were retired."""
    source = get_source(session=session, slug=slug)
    newest = session.scalar(
        select(SourceSecret.id)
        .where(SourceSecret.source_id == source.id, SourceSecret.retired_at.is_(None))
        .order_by(SourceSecret.id.desc())
        .limit(1)
    )
    retired = session.execute(
        update(SourceSecret)
        .where(
            SourceSecret.source_id == source.id,
            SourceSecret.retired_at.is_(None),
            SourceSecret.id != newest,
        )
        .values(retired_at=utcnow())
    ).rowcount
    session.flush()
    return retired
