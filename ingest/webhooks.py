"""The webhook routes: verify, store once, hand to the relay, answer.

Guards run in a fixed order, each with its own status (STYLE, habit 2):

    source known (404) -> body within limit (413) -> signature (or token)
    checked as the raw bytes stream in (401) -> delivery id present and well-formed (400)
    -> parse (415, 400) -> event present (400) -> not too old (400) -> store
    (503 if the database is down) -> relay -> 202

Every verified delivery is answered 2xx once it is stored -- duplicates too --
because Jira retries on 409 and on 5xx, and a retry of something we already
hold can only make noise. Nothing is stored before the delivery verifies.

There is one route per provider in ``models.providers.PROVIDERS``, and
everything provider-specific -- how a delivery is verified, where its id and
event come from, what its body says -- is a member of that provider
(``models/providers/base.py``). An event the source does not create tasks
from is stored as ignored -- unless it announces a move, which is queued for
the worker all the same (``models.intake``; docs/contract.md §15, "Stable
keys"). An event the provider neither handles nor knows as ignored is stored
as ignored too, but as an unknown event, counted apart
(``models.providers.UNKNOWN_EVENT``).

The routes are bare ASGI apps (:class:`WebhookRoute`) in the app's
router, not FastAPI endpoints: at the ingress's rate, FastAPI's per-request
machinery (dependency solving, two exit stacks per request, a response
object) cost more CPU than the guards themselves (docs/performance.md). They
still run inside the app's middleware (an unexpected error is a 503, never a
500), answer with the same statuses and bodies, and :data:`documentation`
describes them in the OpenAPI document as before.
"""

from __future__ import annotations

import hashlib
import json
import time
from tempfile import SpooledTemporaryFile

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ingest.runtime import IngressRuntime, StoreUnavailable
from ingest.schemas import ErrorBody
from models import logs, tracing
from models.errors import DeliveryRefused, RefusalKind
from models.inbox import DeliveryStatus, Recorded
from models.intake import check_delivery_id, incoming_delivery, kept_header_names
from models.providers import PROVIDERS, Provider, Verifier
from models.sources import VerifyingSource

#: Each refusal of the intake (``models.intake``) as the webhook routes answer
#: it: the status, and the result the metrics count. The one place they meet.
ANSWER_OF_REFUSAL: dict[RefusalKind, tuple[int, str]] = {
    RefusalKind.MALFORMED: (400, "bad_request"),
    RefusalKind.UNSUPPORTED_CONTENT_TYPE: (415, "unsupported_media_type"),
    RefusalKind.TOO_OLD: (400, "too_old"),
}


class Refusal(Exception):
    """A request the route will not take before the intake reads it (an
    unknown source, a body too large, a bad signature, no delivery id), with
    the status and the reason to answer."""

    def __init__(self, status: int, reason: str, result: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        #: The metrics label: what happened to the delivery.
        self.result = result


_DUPLICATE = b'{"status":"duplicate"}'
#: Results whose slug names no source we could read: never a metrics label.
_UNNAMED_RESULTS = ("unknown_source", "store_unavailable")
_IGNORED = b'{"status":"ignored"}'
_STORE_UNAVAILABLE = b'{"error":"the delivery store is unavailable; retry later"}'


class WebhookRoute:
    """``POST /webhooks/<provider>/{source}``: one provider's deliveries, as an ASGI app."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        #: The headers kept with a delivery, as raw names (see _kept_headers).
        self.kept_raw = tuple(name.encode("latin-1") for name in kept_header_names(provider))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime: IngressRuntime = scope["app"].state.runtime
        slug: str = scope["path_params"]["source"]
        name = self.provider.name
        started = time.perf_counter()
        headers: tuple[tuple[bytes, bytes], ...] = ()
        try:
            status, answer, result = await _verify_and_store(
                runtime, self.provider, self.kept_raw, slug, Headers(scope=scope), receive
            )
        except Refusal as refusal:
            status, answer, result = refusal.status, _error(refusal.reason), refusal.result
        except DeliveryRefused as refused:
            (status, result), answer = ANSWER_OF_REFUSAL[refused.refusal], _error(str(refused))
        except StoreUnavailable:
            status, answer, result = 503, _STORE_UNAVAILABLE, "store_unavailable"
            runtime.refusals.refused()  # the catch-up's to recover (ingest.refusals)
            retry_after = str(runtime.settings.retry_after_seconds).encode("latin-1")
            headers = ((b"retry-after", retry_after),)
        finally:
            runtime.metrics.observe_latency(name, time.perf_counter() - started)
        if status < 300:
            runtime.refusals.stored()
        # Only when asked for (source names are guessable, and /metrics may be
        # open); never a slug nobody registered, nor one that could not be
        # looked up: random URLs must not grow the series.
        labelled = runtime.settings.metrics_source_labels
        source = slug if labelled and result not in _UNNAMED_RESULTS else "-"
        runtime.metrics.count_delivery(name, source, result)
        await _answer(send, status, answer, *headers)


#: Where the webhook routes live; their bodies have their own limit.
PATH_PREFIX = "/webhooks/"


def routes() -> list[Route]:
    """The webhook routes, for the app's router (ahead of the REST API's)."""
    return [
        Route(
            f"{PATH_PREFIX}{provider.name}/{{source}}",
            WebhookRoute(provider),
            methods=["POST"],
            include_in_schema=False,
        )
        for provider in PROVIDERS.values()
    ]


#: The webhook routes as the OpenAPI document describes them. Never mounted:
#: :func:`routes` serves them.
documentation = APIRouter(
    tags=["webhooks"],
    responses={status: {"model": ErrorBody} for status in (400, 401, 404, 413, 415, 503)},
)


def _documented(provider: Provider) -> None:
    async def webhook(source: str, request: Request) -> JSONResponse:
        raise NotImplementedError("documentation only; served by WebhookRoute")

    documentation.add_api_route(
        f"{PATH_PREFIX}{provider.name}/{{source}}",
        webhook,
        methods=["POST"],
        status_code=202,
        name=f"{provider.name}_webhook",
        summary=f"{provider.label} Webhook",
        description=provider.route_summary,
    )


for _provider in PROVIDERS.values():
    _documented(_provider)


async def _verify_and_store(
    runtime: IngressRuntime,
    provider: Provider,
    kept_raw: tuple[bytes, ...],
    slug: str,
    headers: Headers,
    receive: Receive,
) -> tuple[int, bytes, str]:
    name = provider.name
    source = await runtime.verifying_source(name, slug)
    if source is None:
        raise Refusal(404, "unknown webhook source", "unknown_source")

    # The signature is computed as the body streams in, and what exceeds
    # UNVERIFIED_IN_MEMORY_BYTES waits on disk: an unsigned sender never makes
    # the ingress hold a large body in memory.
    verifier = provider.verifier(headers, source.secrets)
    limit = runtime.settings.max_body_bytes
    with (
        await _receive_body(receive, headers.get("content-length"), limit, verifier) as received,
        tracing.span("verify", **{"taskhook.source": slug}),
    ):
        if not verifier.matches():
            runtime.metrics.rejected_signatures.labels(name).inc()
            raise Refusal(401, "missing or invalid signature", "bad_signature")
        body = received.read()

    delivery_id = provider.delivery_id(headers, body)
    if delivery_id is None:
        raise Refusal(400, f"missing {provider.delivery_header} header", "bad_request")
    check_delivery_id(provider, delivery_id)

    # The body and the one header the event may come from: the same bytes
    # and the same event header pass every guard below exactly as before.
    body_sha256 = hashlib.sha256(body).hexdigest()
    event_header = headers.get(provider.event_header, "") if provider.event_header else ""
    fingerprint = f"{body_sha256} {event_header}"
    if runtime.stored_lately(source.id, delivery_id, fingerprint):
        # A redelivery, byte for byte, of a delivery this process committed
        # lately: "duplicate", without parsing the body again or asking the
        # database -- the cheap path a redelivery storm takes.
        return 202, _DUPLICATE, "duplicate"

    incoming, known = incoming_delivery(
        provider,
        source,
        delivery_id=delivery_id,
        headers=headers,
        body=body,
        body_sha256=body_sha256,
        kept_headers=_kept_headers(headers, kept_raw),
        max_age_seconds=runtime.settings.max_delivery_age_seconds,
        trace_context=tracing.current_traceparent(),
    )
    with tracing.span("inbox write"):
        recorded = await runtime.record_delivery(incoming)
    if runtime.settings.log_each_delivery:
        _log_stored(source, delivery_id, recorded)
    if recorded.payload_mismatch:
        runtime.metrics.payload_mismatches.labels(name).inc()
    else:
        runtime.remember(source.id, delivery_id, fingerprint)

    # Another body under a stored id, kept apart for an operator: to the
    # sender, the duplicate id it is.
    if not recorded.is_new or recorded.status is DeliveryStatus.MISMATCH:
        return 202, _DUPLICATE, "duplicate"
    if recorded.status is DeliveryStatus.IGNORED:
        # The same answer either way; only the metrics tell an unknown event apart.
        return 202, _IGNORED, "ignored" if known else "unknown_event"
    if recorded.status is DeliveryStatus.REPLAY:
        return 202, b'{"delivery":%d,"status":"replay"}' % recorded.pk, "replay"
    # Committed first, enqueued after: the message never names a row that
    # might not exist, and a lost message is the sweeper's to recover. A
    # paused source's delivery stays queued until it resumes.
    if not source.paused:
        lane = runtime.flood_gate.lane(source.id, source.lane)
        runtime.metrics.count_lane(lane.name.lower())
        tracing.remember(recorded.pk, incoming.trace_context)
        runtime.relay.submit(recorded.pk, lane)
    return 202, b'{"delivery":%d,"status":"queued"}' % recorded.pk, "queued"


def _log_stored(source: VerifyingSource, delivery_id: str, recorded: Recorded) -> None:
    """The ingress's line for a delivery (``log_each_delivery``): the ids that
    join it to the sender's log (delivery id) and to the worker's lines (inbox id)."""
    logs.DELIVERIES.info(
        "delivery %s from %s stored as %s (%s)",
        delivery_id,
        source.slug,
        recorded.pk,
        recorded.status.value if recorded.is_new else "duplicate",
        extra={
            "inbox_id": recorded.pk,
            "delivery_id": delivery_id,
            "source": source.slug,
            "workspace": source.workspace_id,
            "status": recorded.status.value if recorded.is_new else "duplicate",
        },
    )


#: The most of a body not yet verified that is kept in memory; the rest of
#: it is spooled to a temporary file until the signature is checked.
UNVERIFIED_IN_MEMORY_BYTES = 1024 * 1024


class _ReceivedBody:
    """A body as it arrived: in memory when it came in one message (the usual
    case), else spooled past :data:`UNVERIFIED_IN_MEMORY_BYTES`."""

    def __init__(self, whole: bytes | None = None) -> None:
        self._whole = whole
        self._spool = None
        if whole is None:
            # Closed by __exit__: the spool lives as long as this object.
            self._spool = SpooledTemporaryFile(UNVERIFIED_IN_MEMORY_BYTES)  # noqa: SIM115

    def write(self, chunk: bytes) -> None:
        self._spool.write(chunk)

    def read(self) -> bytes:
        if self._whole is not None:
            return self._whole
        self._spool.seek(0)
        return self._spool.read()

    def __enter__(self) -> _ReceivedBody:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._spool is not None:
            self._spool.close()


async def _receive_body(
    receive: Receive, content_length: str | None, limit: int, signature: Verifier
) -> _ReceivedBody:
    """The raw body, fed to ``signature`` as it arrives; refused with 413 as
    soon as it passes ``limit`` -- a huge or lying Content-Length is never
    buffered whole."""
    if content_length is not None:
        if not content_length.isdigit():
            raise Refusal(400, "invalid Content-Length header", "bad_request")
        if int(content_length) > limit:
            raise Refusal(413, f"body over the {limit}-byte limit", "too_large")
    received: _ReceivedBody | None = None
    size = 0
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                # Nobody is left to answer; refuse quietly rather than as an error.
                raise Refusal(400, "the client hung up before the body ended", "disconnected")
            if message["type"] != "http.request":
                continue
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            size += len(chunk)
            if size > limit:
                raise Refusal(413, f"body over the {limit}-byte limit", "too_large")
            signature.update(chunk)
            if received is None and not more:
                return _ReceivedBody(chunk)  # the whole body in one message: the usual case
            received = received or _ReceivedBody()
            received.write(chunk)
            if not more:
                return received
    except BaseException:
        if received is not None:
            received.__exit__()
        raise


async def _answer(send: Send, status: int, body: bytes, *headers: tuple[bytes, bytes]) -> None:
    """A JSON answer, with the headers Starlette's JSONResponse sends."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                *headers,
                (b"content-length", str(len(body)).encode("latin-1")),
                (b"content-type", b"application/json"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _error(reason: str) -> bytes:
    # As Starlette's JSONResponse renders it.
    return json.dumps(
        {"error": reason}, ensure_ascii=False, allow_nan=False, separators=(",", ":")
    ).encode("utf-8")


def _kept_headers(headers: Headers, kept_raw: tuple[bytes, ...]) -> dict[str, str]:
    """The ``kept_raw`` headers present, first value of each (as ``headers[name]``),
    read in one pass over the raw list."""
    found: dict[bytes, bytes] = {}
    for name, value in headers.raw:
        if name in kept_raw and name not in found:
            found[name] = value
    return {
        name.decode("latin-1"): found[name].decode("latin-1") for name in kept_raw if name in found
    }
