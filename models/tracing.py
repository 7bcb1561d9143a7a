"""One trace per delivery, across the queue (docs/architecture.md, "Tracing").

Off unless the standard OpenTelemetry variables ask for it:
``OTEL_TRACES_EXPORTER`` (``otlp`` or ``console``) or an OTLP endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``);
``OTEL_SDK_DISABLED=true`` wins over both. Off, nothing is imported beyond
the API, no span is made, and no middleware is added: it costs nothing.

On, a delivery's first trace is:

- the ingress's POST (the ASGI instrumentation), with ``verify`` and
  ``inbox write`` inside it; the row keeps that span's ``traceparent``
  (``deliveries.trace_context``);
- ``relay send``, a child of it, whose context the message carries per key
  (the header :data:`TRACES_HEADER`: one message holds up to 16 deliveries,
  so Celery's own one-context-per-message does not say whose is whose);
- the worker's ``process delivery`` with ``claim`` and ``create`` inside,
  and the database's statements (the SQLAlchemy instrumentation) -- the
  insert, the settlement, the event append.

Every later run -- a broker's redelivery, a retry, the sweeper's resend, a
replay, a catch-up's send -- is a new trace with a span link to the first
(the message's context, else the row's). Catch-up stores a row under its own
span (the Celery instrumentation's) and the httpx instrumentation traces its
requests.

The provider is made per process after it forks: Celery's prefork children
call :func:`start` from ``worker_process_init``, since the exporter's thread
does not survive a fork.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

#: The message header that carries each key's context: ``{"<pk>": traceparent}``.
TRACES_HEADER = "taskhook_traces"

_PROPAGATOR = TraceContextTextMapPropagator()

#: Whether this process traces: set by :func:`start`.
ON = False
#: This process's provider and tracer once :func:`start` made them.
_provider: Any = None
_TRACER: Any = trace.get_tracer("taskhook")
_instrumentors: list[Any] = []

#: The contexts the ingress's relay sends with each key, by key; taken when
#: its message is built (:func:`take`). Bounded: a key the relay drops waits
#: for the sweeper, and its context for the row.
_pending: dict[int, str] = {}
_PENDING_LIMIT = 100_000


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the OTEL_* variables ask for traces."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def start(role: str, *, exporter: Any = None) -> bool:
    """Trace this process when the variables ask for it (or ``exporter`` is
    given: the tests' in-memory one); returns whether it does. Once per process."""
    global ON, _provider, _TRACER
    if ON or (exporter is None and not wanted()):
        return ON
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    name = os.environ.get("OTEL_SERVICE_NAME") or f"taskhook-{role}"
    resource = Resource.create({SERVICE_NAME: name})
    provider = TracerProvider(resource=resource)
    # Redis's commands inside a trace only: outside one they are kombu's
    # polling and acknowledgements (a BRPOP a second per worker thread),
    # roots with no delivery in them, which cost the worker CPU for nothing.
    inside_traces = TracerProvider(resource=resource, sampler=ParentBased(root=ALWAYS_OFF))
    processor = (
        SimpleSpanProcessor(exporter) if exporter is not None else BatchSpanProcessor(_exporter())
    )
    for each in (provider, inside_traces):
        each.add_span_processor(processor)
    if exporter is None:
        trace.set_tracer_provider(provider)  # for any library that asks the API
    _provider, _TRACER = provider, provider.get_tracer("taskhook")
    _instrument_libraries(provider, redis_provider=inside_traces)
    ON = True
    return True


def stop() -> None:
    """Stop tracing this process: the libraries uninstrumented, the spans
    flushed (the tests' in-memory tracing, and a process's end)."""
    global ON, _provider, _TRACER
    for instrumentor in _instrumentors:
        instrumentor.uninstrument()
    _instrumentors.clear()
    _pending.clear()
    if _provider is not None:
        _provider.shutdown()
    ON, _provider, _TRACER = False, None, trace.get_tracer("taskhook")


def _exporter() -> Any:
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    # OTLP over HTTP/protobuf: no gRPC stack to install, and every collector takes it.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _instrument_libraries(provider: Any, *, redis_provider: Any) -> None:
    """SQLAlchemy (every engine made after this), Redis, httpx and Celery.
    The ASGI app is wrapped where it is built (``ingest.app``)."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    for instrumentor, its_provider in (
        (SQLAlchemyInstrumentor(), provider),
        (RedisInstrumentor(), redis_provider),
        (HTTPXClientInstrumentor(), provider),
        (CeleryInstrumentor(), provider),
    ):
        if not instrumentor.is_instrumented_by_opentelemetry:
            # The SQLAlchemy instrumentation declares "< 2.1" and we run 2.1:
            # its cursor events are the same there, and tests/integration/
            # test_tracing.py proves its statement spans; the others' ranges
            # hold, so the check is skipped for all alike.
            instrumentor.instrument(tracer_provider=its_provider, skip_dep_check=True)
            _instrumentors.append(instrumentor)


def instrument_app(app: Any) -> None:
    """The ASGI instrumentation around a Starlette ``app``, outermost, when
    tracing: every request is a server span, the webhooks' POST included."""
    if ON:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

        app.add_middleware(OpenTelemetryMiddleware, tracer_provider=_provider)


def span(name: str, **attributes: Any):
    """A span in the current trace when tracing; else a context that costs nothing."""
    if not ON:
        return nullcontext()
    return _TRACER.start_as_current_span(name, attributes=attributes or None)


def event(name: str) -> None:
    """A step of the current span, timed (``claim``, ``claimed``, ``settled``):
    an event costs a fraction of a span of its own. Nothing when not tracing."""
    if ON:
        trace.get_current_span().add_event(name)


def current_traceparent() -> str | None:
    """The current span's W3C traceparent; None when not tracing."""
    if not ON:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def _context_of(traceparent: str | None) -> otel_context.Context | None:
    if not traceparent:
        return None
    extracted = _PROPAGATOR.extract({"traceparent": traceparent})
    span_context = trace.get_current_span(extracted).get_span_context()
    return extracted if span_context.is_valid else None


# --- the relay: a context per key -------------------------------------------


def remember(pk: int, traceparent: str | None) -> None:
    """Keep the context the relay sends with ``pk`` (the ingress, after its commit)."""
    if traceparent is not None:
        if len(_pending) >= _PENDING_LIMIT:
            _pending.clear()  # those keys' messages fall back to the rows' contexts
        _pending[pk] = traceparent


def take(pks: Iterator[int] | list[int]) -> dict[int, str]:
    """The contexts of ``pks`` that were remembered, forgotten here."""
    if not _pending:
        return {}
    found = {}
    for pk in pks:
        traceparent = _pending.pop(pk, None)
        if traceparent is not None:
            found[pk] = traceparent
    return found


def relay_send(contexts: dict[int, str]) -> dict[str, str]:
    """A ``relay send`` span in each key's trace; the header value that makes
    the worker's run of each key its child."""
    header = {}
    for pk, traceparent in contexts.items():
        with _TRACER.start_as_current_span(
            "relay send",
            context=_context_of(traceparent),
            kind=SpanKind.PRODUCER,
            attributes={"taskhook.inbox_id": pk},
        ):
            header[str(pk)] = current_traceparent() or traceparent
    return header


# --- the worker: a run of one key ---------------------------------------------


#: The message a worker thread is running: its :data:`TRACES_HEADER`, and
#: whether this is its first delivery to a worker (not a redelivery or retry).
_MESSAGE: ContextVar[tuple[dict[str, str], bool] | None] = ContextVar(
    "taskhook_message", default=None
)


@contextmanager
def message(request: Any) -> Iterator[None]:
    """While a Celery task runs: what its message says of its keys' traces."""
    if not ON:
        yield
        return
    info = getattr(request, "delivery_info", None) or {}
    first = not info.get("redelivered") and not getattr(request, "retries", 0)
    sent = request.get(TRACES_HEADER) if hasattr(request, "get") else None
    token = _MESSAGE.set((sent if isinstance(sent, dict) else {}, first))
    try:
        yield
    finally:
        _MESSAGE.reset(token)


@contextmanager
def delivery_run(pk: int, stored: Callable[[], str | None]) -> Iterator[Any]:
    """The span of one run of delivery ``pk``: a child of its message's
    context on its first delivery; otherwise a new trace linked to the
    delivery's first (the message's context, else ``stored()``: the row's).
    Yields the span (None when not tracing)."""
    if not ON:
        yield None
        return
    sent, first_run = _MESSAGE.get() or ({}, True)
    traceparent = sent.get(str(pk))
    attributes = {"taskhook.inbox_id": pk}
    if traceparent is not None and first_run:
        parent, links = _context_of(traceparent), None
    else:
        first = traceparent or stored()
        linked = _context_of(first)
        span_context = trace.get_current_span(linked).get_span_context() if linked else None
        links = [Link(span_context)] if span_context is not None else None
        parent = otel_context.Context()  # a new trace
        attributes["taskhook.first_trace"] = first or ""
    with _TRACER.start_as_current_span(
        "process delivery", context=parent, links=links, attributes=attributes
    ) as current:
        yield current
