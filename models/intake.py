"""What a delivery proven to come from its sender becomes on the inbox row.

One reading for every way a delivery reaches the inbox: the webhook routes
(``ingest.webhooks``) after the signature check, and the catch-up
(``worker.catchup``) for a delivery fetched from the provider's own log or
synthesized from an item's state. What the inbox will not take is refused
with :class:`~models.errors.DeliveryRefused`, whose ``refusal`` each surface
answers once (the webhook routes: ``ingest.webhooks.ANSWER_OF_REFUSAL``).
The providers themselves are ``models.providers`` (the ``Provider`` contract
and the ``PROVIDERS`` registry).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from models.errors import DeliveryRefused, InvalidExternalId, InvalidTask, RefusalKind
from models.external_id import normalize_external_id
from models.inbox import DeliveryStatus, IncomingDelivery
from models.providers import Provider, ignored_reason
from models.providers.drafts import UnsupportedContentType, UnsupportedPayload
from models.sources import VerifyingSource
from models.tables import Delivery
from models.tasks import NewTask, validated_new_task

#: The request headers every provider's deliveries keep, besides the provider's
#: own (``Provider.kept_headers``): never a signature or credentials.
KEPT_HEADERS = ("content-type", "user-agent")

#: The ``status_reason`` of a delivery stored for the worker though it creates
#: nothing: it announces a move (docs/contract.md §15, "Stable keys").
ANNOUNCES_A_MOVE = "announces a move"

_COLUMNS = Delivery.__table__.c
#: Column sizes of the inbox row, as the table declares them.
EVENT_LENGTH = _COLUMNS.event.type.length
ACTION_LENGTH = _COLUMNS.action.type.length
CONTENT_TYPE_LENGTH = _COLUMNS.content_type.type.length
HOOK_ID_LENGTH = _COLUMNS.hook_id.type.length
#: The longest delivery id taken (the column itself is unbounded text).
#: GitHub's GUIDs have 36 characters, Jira's identifiers a dozen digits, and
#: a Jira body hash (``sha256:``...) 71.
DELIVERY_ID_LENGTH = 200
#: Printable ASCII, no space: header bytes are read as latin-1, so anything
#: else would be stored garbled rather than as sent.
_DELIVERY_ID = re.compile(f"[\\x21-\\x7e]{{1,{DELIVERY_ID_LENGTH}}}")


def kept_header_names(provider: Provider) -> tuple[str, ...]:
    """The headers (lower case) a delivery of ``provider`` keeps on its row."""
    return (*KEPT_HEADERS, *provider.kept_headers)


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
    if draft.moved_from:
        # A create that announces a move: the worker reads it whole, to join
        # the item's names (models.identities); the fast path never takes it.
        return Reading(external_id)
    try:
        # The task store's own check (models.tasks.validated_new_task), so the
        # fast path creates only what the general path's create would.
        task = validated_new_task(replace(draft.new_task(), external_id=external_id))
    except InvalidTask:
        return Reading(external_id)
    return Reading(external_id, task)


def check_delivery_id(provider: Provider, delivery_id: str) -> None:
    """Refuse a delivery id the inbox cannot keep as sent (malformed)."""
    if not _DELIVERY_ID.fullmatch(delivery_id):
        # GitHub's are GUIDs, Jira's numbers: anything else is not theirs, and
        # a value the unique index cannot hold must not become a "retry later".
        raise DeliveryRefused(
            RefusalKind.MALFORMED,
            f"invalid {provider.delivery_header} header: at most {DELIVERY_ID_LENGTH} "
            "printable ASCII characters",
        )


def incoming_delivery(
    provider: Provider,
    source: VerifyingSource,
    *,
    delivery_id: str,
    headers: Mapping[str, str],
    body: bytes,
    body_sha256: str,
    kept_headers: Mapping[str, str],
    max_age_seconds: float,
    trace_context: str | None = None,
) -> tuple[IncomingDelivery, bool]:
    """The inbox row for a delivery of ``source`` proven to come from its
    sender, and whether its event is one the provider knows (handled or
    known-ignored). Raises :class:`~models.errors.DeliveryRefused` for what
    the inbox must not take: a body the provider cannot decode (an
    unsupported content type, or malformed), no event, fields the row cannot
    hold, a body older than any retry of its sender (too old).
    ``headers`` is case-insensitive (Starlette's or httpx's).

    The row is queued for the worker when the source creates tasks from the
    event, or when the provider says the delivery announces a move
    (``Provider.moves``; status reason :data:`ANNOUNCES_A_MOVE`), so the
    worker learns it though it creates nothing; ignored otherwise."""
    content_type = headers.get("content-type")
    try:
        payload = provider.decode_body(content_type, body)
    except UnsupportedContentType as error:
        raise DeliveryRefused(RefusalKind.UNSUPPORTED_CONTENT_TYPE, str(error)) from None
    except UnsupportedPayload as error:
        raise DeliveryRefused(RefusalKind.MALFORMED, str(error)) from None

    event = provider.event_of(headers, payload)
    if event is None:
        raise DeliveryRefused(RefusalKind.MALFORMED, "the delivery names no event")
    # The inbox row must be able to hold what it keeps: a field it cannot
    # store is the sender's mistake (a 4xx), never a "retry later".
    if not _storable(event, EVENT_LENGTH):
        raise DeliveryRefused(
            RefusalKind.MALFORMED, f"unsupported event name (at most {EVENT_LENGTH} characters)"
        )
    if not _storable(content_type, CONTENT_TYPE_LENGTH):
        raise DeliveryRefused(RefusalKind.UNSUPPORTED_CONTENT_TYPE, "unsupported content type")
    # A body that says when it was sent (Jira's) is refused once it is older
    # than any retry of its sender: a captured body cannot be replayed for ever.
    sent_at = provider.sent_at(payload)
    if max_age_seconds and sent_at is not None and (age := time.time() - sent_at) > max_age_seconds:
        raise DeliveryRefused(
            RefusalKind.TOO_OLD,
            f"the delivery was sent {age / 3600:.0f} h ago; at most {max_age_seconds / 3600:g} h "
            "is taken (TASKHOOK_MAX_DELIVERY_AGE_SECONDS)",
        )

    known = event in provider.handled_events or event in provider.ignored_events
    reading = NOTHING_READ
    if event in source.create_events:
        status, reason = DeliveryStatus.QUEUED, None
        reading = read_delivery(provider, event, payload, source.site_url)
    else:
        announced, unreadable = _announces_a_move(provider, event, payload, source.site_url)
        if announced:
            # Queued so the worker learns the move, though it creates nothing.
            status, reason = DeliveryStatus.QUEUED, ANNOUNCES_A_MOVE
        else:
            status, reason = DeliveryStatus.IGNORED, ignored_reason(provider, event) + unreadable
    action = provider.action_of(payload)
    hook_id = provider.hook_id(headers)
    incoming = IncomingDelivery(
        source_id=source.id,
        delivery_id=delivery_id,
        body=body,
        body_sha256=body_sha256,
        event=event,
        # Informational fields: kept when storable, dropped otherwise.
        action=action if _storable(action, ACTION_LENGTH) else None,
        headers=kept_headers,
        content_type=content_type,
        hook_id=hook_id if _storable(hook_id, HOOK_ID_LENGTH) else None,
        status=status,
        status_reason=reason,
        external_id=reading.external_id,
        task=reading.task,
        provider=provider.name,
        trace_context=trace_context,
    )
    return incoming, known


def _announces_a_move(
    provider: Provider, event: str, payload: dict[str, Any], site_url: str | None
) -> tuple[bool, str]:
    """Whether the delivery announces a move, and what to add to the reason it
    is ignored when it does not: nothing, or why the move it names cannot be
    read. Such a delivery is still stored, ignored as before: its body is
    kept, and its reason says what is wrong with it."""
    if event not in provider.move_events:
        return False, ""
    try:
        moves = provider.moves(event, payload, site_url)
    except UnsupportedPayload as error:
        return False, f"; the move it names cannot be read: {error}"
    return bool(moves), ""


def _storable(value: object, length: int) -> bool:
    """A string the inbox can hold: within ``length``, no NUL, valid Unicode."""
    if not isinstance(value, str) or len(value) > length or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True
