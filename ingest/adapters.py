"""The provider adapters by provider name.

Each adapter module (``ingest.github``, ``ingest.jira``) offers the same
functions -- ``verify_signature``, ``delivery_id``, ``decode_body``,
``event_of``, ``to_draft`` -- so the ingress and the worker pick one by the
source's provider and call it the same way.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ingest import github, jira
from ingest.drafts import UnsupportedPayload
from models.external_id import InvalidExternalId, normalize_external_id

ADAPTERS: dict[str, ModuleType] = {github.PROVIDER: github, jira.PROVIDER: jira}


def named_identity(
    adapter: ModuleType, event: str, payload: dict[str, Any], site_url: str | None
) -> str | None:
    """The normalized external id a delivery names, read as the worker reads
    it; None when it names none the worker could use.

    The ingress keeps it on the inbox row so that a worker can look the
    identity up in the statement that claims the delivery. The worker still
    parses the body itself and decides what the delivery becomes.
    """
    try:
        draft = adapter.to_draft(event, payload, site=site_url)
        return normalize_external_id(draft.external_id)
    except (UnsupportedPayload, InvalidExternalId):
        return None
