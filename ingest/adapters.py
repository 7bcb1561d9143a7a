"""What the ingress reads from a body: the identity and the draft it keeps on the row.

The providers themselves are ``models.providers`` (the ``Provider`` contract
and the ``PROVIDERS`` registry), below both ``ingest`` and ``worker``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from models.errors import InvalidExternalId, InvalidTask
from models.external_id import normalize_external_id
from models.providers import Provider
from models.providers.drafts import UnsupportedPayload
from models.tasks import NewTask, validated_new_task


@dataclass(frozen=True)
class Reading:
    """What the ingress keeps on the inbox row about the task a body describes."""

    #: The normalized external id the body names; None when it names none
    #: the worker could use.
    external_id: str | None = None
    #: The task the body describes, validated as the task store validates a
    #: create (the external id normalized, the title stripped); None unless
    #: the worker could create it as it stands.
    task: NewTask | None = None


NOTHING_READ = Reading()


def read_delivery(
    provider: Provider, event: str, payload: dict[str, Any], site_url: str | None
) -> Reading:
    """The identity and the draft a delivery describes, read as the worker reads them.

    The ingress parses the body anyway; keeping what it read lets the
    PostgreSQL worker create the task without fetching or parsing the body
    again (models.fastpath). Whatever it cannot keep as it stands -- no
    identity, an invalid title, text no database stores -- it leaves out,
    and the worker reads the body itself and says what is wrong with it.
    """
    try:
        draft = provider.to_draft(event, payload, site=site_url)
        external_id = normalize_external_id(draft.external_id)
    except (UnsupportedPayload, InvalidExternalId):
        return NOTHING_READ
    if external_id is None:
        return NOTHING_READ
    try:
        # The task store's own check (models.tasks.validated_new_task), so the
        # fast path creates only what the general path's create would.
        task = validated_new_task(replace(draft.new_task(), external_id=external_id))
    except InvalidTask:
        return Reading(external_id)
    return Reading(external_id, task)
