"""Webhook providers: one module each, one contract for all, one registry.

Each provider module (``github``, ``jira``, ``gitlab``) holds one object
satisfying :class:`Provider` (``models/providers/base.py`` documents every
member). The ingress (``ingest/webhooks.py``: a route per provider), the
worker (which parses a stored body again), the store (``models.sources``: a
source's provider) and the CLI (``taskhook source add PROVIDER``) all take
whatever is in :data:`PROVIDERS`, so a new provider is one new module and one
line here.

This package sits below both ``ingest`` and ``worker`` because both read
bodies; it imports nothing from either.
"""

from __future__ import annotations

from models.providers.base import Provider, Verifier
from models.providers.github import GITHUB
from models.providers.gitlab import GITLAB
from models.providers.jira import JIRA

#: Every provider by name: the one place a provider is registered.
PROVIDERS: dict[str, Provider] = {
    provider.name: provider
    for provider in (
        GITHUB,
        JIRA,
        GITLAB,
    )
}

#: How the ingress starts the ``status_reason`` of a delivery whose event its
#: provider neither handles nor knows as ignored: stored as ignored like any
#: other event a source does not create tasks from, but counted apart
#: (``taskhook stats``, the ``unknown_event`` result in ``/metrics``), since it
#: may be an event the provider added, or a misconfigured webhook.
UNKNOWN_EVENT = "unknown event"


def ignored_reason(provider: Provider, event: str) -> str:
    """Why a delivery of ``event`` is stored as ignored: a known event that this
    source does not create tasks from, or one :data:`UNKNOWN_EVENT`."""
    if event in provider.handled_events or event in provider.ignored_events:
        return f"{event} does not create tasks for this source"
    return f"{UNKNOWN_EVENT} {event!r} for {provider.label}: it does not create tasks"


__all__ = ["PROVIDERS", "UNKNOWN_EVENT", "Provider", "Verifier", "ignored_reason"]
