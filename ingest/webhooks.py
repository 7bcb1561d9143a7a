"""The webhook routes: verify, store once, hand to the relay, answer.

Guards run in a fixed order, each with its own status (STYLE, habit 2):

    source known (404) -> body within limit (413) -> signature over the raw
    bytes (401) -> delivery id present (400) -> parse (415, 400) -> event
    present (400) -> store (503 if the database is down) -> relay -> 202

Every verified delivery is answered 2xx once it is stored -- duplicates too --
because Jira retries on 409 and on 5xx, and a retry of something we already
hold can only make noise. Nothing is stored before the signature verifies.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import ModuleType

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from ingest import github, jira
from ingest.drafts import UnsupportedContentType, UnsupportedPayload
from ingest.runtime import AsyncInbox, Runtime, StoreUnavailable, postgres_conninfo
from ingest.schemas import ErrorBody
from models.inbox import DeliveryStatus, IncomingDelivery

ADAPTERS: dict[str, ModuleType] = {"github": github, "jira": jira}

#: The only request headers kept with a delivery: never a signature or credentials.
KEPT_HEADERS = (
    "content-type",
    "user-agent",
    "x-github-event",
    "x-github-delivery",
    "x-github-hook-id",
    "x-github-hook-installation-target-id",
    "x-github-hook-installation-target-type",
    "x-atlassian-webhook-identifier",
    "x-atlassian-webhook-retry",
)


@asynccontextmanager
async def _inbox_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the event-loop inbox writer on PostgreSQL (runs inside the app's
    lifespan, once the runtime exists) and close its connections at shutdown."""
    runtime: Runtime | None = getattr(app.state, "runtime", None)
    conninfo = postgres_conninfo(runtime) if runtime is not None else None
    if conninfo is None:
        yield
        return
    runtime.inbox = AsyncInbox(conninfo)
    try:
        yield
    finally:
        inbox, runtime.inbox = runtime.inbox, None
        await inbox.close()


router = APIRouter(
    tags=["webhooks"],
    responses={status: {"model": ErrorBody} for status in (400, 401, 404, 413, 415, 503)},
    lifespan=_inbox_lifespan,
)


class Refusal(Exception):
    """A delivery we will not take, with the status and the reason to answer."""

    def __init__(self, status: int, reason: str, result: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        #: The metrics label: what happened to the delivery.
        self.result = result


@router.post("/webhooks/github/{source}", status_code=202)
async def github_webhook(source: str, request: Request) -> JSONResponse:
    """A GitHub delivery (JSON or form-encoded), signed with X-Hub-Signature-256."""
    return await _receive("github", source, request)


@router.post("/webhooks/jira/{source}", status_code=202)
async def jira_webhook(source: str, request: Request) -> JSONResponse:
    """A Jira delivery, signed with X-Hub-Signature (sha256=...)."""
    return await _receive("jira", source, request)


async def _receive(provider: str, slug: str, request: Request) -> JSONResponse:
    runtime: Runtime = request.app.state.runtime
    started = time.perf_counter()
    try:
        status, answer, result = await _take(runtime, ADAPTERS[provider], slug, request)
    except Refusal as refusal:
        status, answer, result = refusal.status, {"error": refusal.reason}, refusal.result
    except StoreUnavailable:
        runtime.metrics.deliveries.labels(provider, "-", "store_unavailable").inc()
        return JSONResponse(
            {"error": "the delivery store is unavailable; retry later"},
            status_code=503,
            headers={"Retry-After": str(runtime.settings.retry_after_seconds)},
        )
    finally:
        runtime.metrics.latency.labels(provider).observe(time.perf_counter() - started)
    source = "-" if result == "unknown_source" else slug
    runtime.metrics.deliveries.labels(provider, source, result).inc()
    return JSONResponse(answer, status_code=status)


async def _take(
    runtime: Runtime, adapter: ModuleType, slug: str, request: Request
) -> tuple[int, dict, str]:
    provider = adapter.PROVIDER
    source = await runtime.verifying_source(provider, slug)
    if source is None:
        raise Refusal(404, "unknown webhook source", "unknown_source")

    body = await _read_body(request, runtime.settings.max_body_bytes)

    headers = request.headers
    if not adapter.verify_signature(body, headers, source.secrets):
        runtime.metrics.rejected_signatures.labels(provider).inc()
        raise Refusal(401, "missing or invalid signature", "bad_signature")

    delivery_id = adapter.delivery_id(headers, body)
    if delivery_id is None:
        raise Refusal(400, f"missing {adapter.DELIVERY_HEADER} header", "bad_request")

    # The body and the one header the event may come from: the same bytes
    # and the same event header pass every guard below exactly as before.
    fingerprint = f"{hashlib.sha256(body).hexdigest()} {headers.get('x-github-event', '')}"
    if runtime.stored_lately(source.id, delivery_id, fingerprint):
        # A redelivery, byte for byte, of a delivery this process committed
        # lately: "duplicate", without parsing the body again or asking the
        # database -- the cheap path a redelivery storm takes.
        return 202, {"status": "duplicate"}, "duplicate"

    try:
        payload = adapter.decode_body(headers.get("content-type"), body)
    except UnsupportedContentType as error:
        raise Refusal(415, str(error), "unsupported_media_type") from None
    except UnsupportedPayload as error:
        raise Refusal(400, str(error), "bad_request") from None

    event = adapter.event_of(headers, payload)
    if event is None:
        raise Refusal(400, "the delivery names no event", "bad_request")
    # The inbox row must be able to hold what it keeps: a field it cannot
    # store is the sender's mistake (a 4xx), never a "retry later".
    if not _storable(event, EVENT_LENGTH):
        raise Refusal(
            400, f"unsupported event name (at most {EVENT_LENGTH} characters)", "bad_request"
        )
    content_type = headers.get("content-type")
    if not _storable(content_type, CONTENT_TYPE_LENGTH):
        raise Refusal(415, "unsupported content type", "unsupported_media_type")

    if event in source.create_events:
        status, reason = DeliveryStatus.QUEUED, None
    else:
        status, reason = DeliveryStatus.IGNORED, f"{event} does not create tasks for this source"
    action = payload.get("action") if provider == "github" else None
    incoming = IncomingDelivery(
        source_id=source.id,
        delivery_id=delivery_id,
        body=body,
        event=event,
        # Informational fields: kept when storable, dropped otherwise.
        action=action if _storable(action, ACTION_LENGTH) else None,
        headers=_kept_headers(headers),
        content_type=content_type,
        hook_id=hook_id if _storable(hook_id := headers.get("x-github-hook-id"), 64) else None,
        status=status,
        status_reason=reason,
    )
    recorded = await runtime.record_delivery(incoming)
    if not recorded.payload_mismatch:
        runtime.remember(source.id, delivery_id, fingerprint)

    if not recorded.is_new:
        if recorded.payload_mismatch:
            runtime.metrics.payload_mismatches.labels(provider).inc()
        return 202, {"status": "duplicate"}, "duplicate"
    if recorded.status is DeliveryStatus.IGNORED:
        return 202, {"status": "ignored"}, "ignored"
    # Committed first, enqueued after: the message never names a row that
    # might not exist, and a lost message is the sweeper's to recover.
    runtime.relay.submit(recorded.pk)
    return 202, {"delivery": recorded.pk, "status": "queued"}, "queued"


async def _read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with 413 as soon as it passes ``limit`` -- a huge or
    lying Content-Length is never buffered whole."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise Refusal(400, "invalid Content-Length header", "bad_request")
        if int(declared) > limit:
            raise Refusal(413, f"body over the {limit}-byte limit", "too_large")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise Refusal(413, f"body over the {limit}-byte limit", "too_large")
    except ClientDisconnect:
        # Nobody is left to answer; refuse quietly rather than as an error.
        raise Refusal(400, "the client hung up before the body ended", "disconnected") from None
    return bytes(body)


#: Column sizes of the inbox row (models.tables.Delivery).
EVENT_LENGTH, ACTION_LENGTH, CONTENT_TYPE_LENGTH = 200, 100, 200


def _storable(value: object, length: int) -> bool:
    """A string the inbox can hold: within ``length``, no NUL, valid Unicode."""
    if not isinstance(value, str) or len(value) > length or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def _kept_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in KEPT_HEADERS if name in headers}
