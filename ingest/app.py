"""The ingress application, served by ``python -m ingest.server`` (uvicorn with bounds).

Nothing connects at import: the lifespan builds the engine, the sessions and
the relay from settings when the server starts. Tests call :func:`create_app`
with their own database and publisher.
"""

from __future__ import annotations

import hmac
import importlib.metadata
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, RedirectResponse, Response
from kombu import Connection
from mcp.server.transport_security import TransportSecuritySettings
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingest import api, console, events, rest, webhooks
from ingest.heartbeat import beating
from ingest.limits import BodyLimit, Lifetime, StreamSlots
from ingest.mcp import BearerGuard, build_mcp_server, principal_from_scope
from ingest.metrics import InboxReading, IngressMetrics
from ingest.relay import Publish, Relay, celery_publisher
from ingest.runtime import IngressRuntime, StoreUnavailable, inbox_opened
from models import tracing
from models.broker.connection import broker_transport, broker_transport_options
from models.db import make_engine, make_session_factory, session_scope
from models.errors import TaskStoreError
from models.providers import PROVIDERS
from models.reports import Gaps, gaps
from models.settings import Settings, get_settings

log = logging.getLogger(__name__)


def _summary() -> str:
    """The API document's one line, naming every provider registered, so a new
    provider cannot leave it stale."""
    labels = [provider.label for provider in PROVIDERS.values()]
    named = f"{', '.join(labels[:-1])} and {labels[-1]}" if len(labels) > 1 else labels[0]
    return f"{named} webhooks in, tasks out: exactly once per external identity."


def create_app(settings: Settings | None = None, *, publish: Publish | None = None) -> FastAPI:
    """The ingress for ``settings`` (the environment's by default). ``publish``
    replaces the Celery publisher (tests use it to see what would be enqueued)."""
    settings = settings or get_settings()
    # Before the lifespan makes its engine: the SQLAlchemy instrumentation
    # traces the engines made after it (models.tracing; off by default).
    tracing.start("ingress")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url, settings=settings)
        metrics = IngressMetrics()
        relay = Relay(
            publish if publish is not None else celery_publisher(settings),
            on_dropped=metrics.relay_dropped.inc,
            on_published=metrics.relay_published.inc,
        )
        streams = StreamSlots(
            total=settings.max_event_streams, per_token=settings.max_event_streams_per_token
        )
        app.state.runtime = runtime = IngressRuntime(
            settings, make_session_factory(engine), relay, metrics, streams
        )
        relay.start()
        try:
            # An MCP session manager runs once, so each lifespan builds its own.
            mcp_server = build_mcp_server(
                sessions=lambda: app.state.runtime.sessions, principal_of=principal_from_scope
            )
            app.state.mcp_http = mcp_server.streamable_http_app(
                streamable_http_path="/",
                # Stateless: every call carries its token; nothing is kept per session.
                stateless_http=True,
                json_response=True,
                # DNS-rebinding checks guard unauthenticated local servers; this
                # one authenticates every request instead.
                transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            )
            async with (
                inbox_opened(runtime),
                events.listening(runtime),
                beating(runtime),
                mcp_server.session_manager.run(),
            ):
                yield
        finally:
            relay.stop()
            engine.dispose()

    app = FastAPI(
        title="taskhook",
        summary=_summary(),
        version=importlib.metadata.version("taskhook"),
        lifespan=lifespan,
    )
    # First, and outside FastAPI's endpoint machinery: the hot path (see ingest.webhooks).
    app.router.routes.extend(webhooks.routes())
    app.include_router(api.router)
    app.include_router(events.router)
    # MCP over streamable HTTP at /mcp/, behind the REST API's bearer tokens;
    # its GET stream, idle in stateless mode, is closed after a while.
    app.mount(
        "/mcp",
        BearerGuard(
            Lifetime(
                lambda scope, receive, send: app.state.mcp_http(scope, receive, send),
                seconds=settings.mcp_stream_seconds,
            ),
            sessions=lambda: app.state.runtime.sessions,
        ),
    )
    _add_operational_routes(app)
    _add_error_handlers(app, settings)
    console.install(app, settings)
    if settings.cors_origins:
        # Closed unless origins are listed: then a page of one of them may
        # call the API with its bearer token, and read the event stream.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
            allow_credentials=True,
            max_age=600,
        )
    # Innermost: a REST or MCP body over the limit is a 413 before anything
    # reads it whole, not an unexpected error.
    app.add_middleware(BodyLimit, limit=settings.max_api_body_bytes, exempt=(webhooks.PATH_PREFIX,))
    # Around the app's middleware that see every request: an unexpected error
    # is answered here, without re-raising (Starlette's catch-all would answer
    # and then re-raise, so uvicorn would log it again and drop the
    # keep-alive connection).
    app.add_middleware(UnexpectedErrors, retry_after=settings.retry_after_seconds)
    tracing.instrument_app(app)
    app.openapi = lambda: _openapi_without_422(app)  # type: ignore[method-assign]
    return app


class UnexpectedErrors:
    """Never a 500: whatever went wrong, nothing was half-stored (the store
    commits or rolls back as one), so the caller may simply retry (503)."""

    def __init__(self, app: ASGIApp, retry_after: int) -> None:
        self.app = app
        self.retry_after = retry_after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answered = False

        async def watching(message: Message) -> None:
            nonlocal answered
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watching)
        except Exception:
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if not answered:
                response = JSONResponse(
                    {"error": rest.UNAVAILABLE},
                    status_code=503,
                    headers={"Retry-After": str(self.retry_after)},
                )
                await response(scope, receive, send)


def _openapi_without_422(app: FastAPI) -> dict:
    """The OpenAPI document, minus FastAPI's stock 422 answers: taskhook turns
    every request validation error into a 400 with ``{"error": ...}``."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title,
            version=app.version,
            summary=app.summary,
            # The webhook routes are bare ASGI; their description is kept apart.
            routes=[*webhooks.documentation.routes, *app.routes],
        )
        for path in schema["paths"].values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for (path, method), names in api.REQUIRED_QUERY_PARAMETERS.items():
            for parameter in schema["paths"][path][method].get("parameters", []):
                if parameter["in"] == "query" and parameter["name"] in names:
                    parameter["required"] = True
                    parameter["schema"] = {"type": "string", "minLength": 1}
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


def _add_error_handlers(app: FastAPI, settings: Settings) -> None:
    """Every error is JSON ``{"error": ...}`` with a precise status."""

    def unavailable() -> JSONResponse:
        return JSONResponse(
            {"error": rest.UNAVAILABLE},
            status_code=503,
            headers={"Retry-After": str(settings.retry_after_seconds)},
        )

    @app.exception_handler(rest.ApiError)
    async def _api_error(request: Request, error: rest.ApiError) -> JSONResponse:
        return rest.api_error_response(error)

    @app.exception_handler(TaskStoreError)
    async def _domain_error(request: Request, error: TaskStoreError) -> Response:
        if console.serves(request):
            return await run_in_threadpool(console.pages.domain_error_page, request, error)
        return rest.domain_error_response(request, error)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, error: RequestValidationError) -> Response:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        if console.serves(request):
            return console.pages.error_page(request, None, 400, f"{where}: {problem['msg']}")
        return JSONResponse({"error": f"{where}: {problem['msg']}"}, status_code=400)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, error: HTTPException) -> Response:
        if console.serves(request):
            return console.pages.error_page(request, None, error.status_code, str(error.detail))
        return JSONResponse(
            {"error": str(error.detail)}, status_code=error.status_code, headers=error.headers
        )

    @app.exception_handler(RecursionError)
    async def _too_deep(request: Request, error: RecursionError) -> JSONResponse:
        # Raised while a request's JSON is parsed: the sender's mistake.
        return JSONResponse({"error": "request body nested too deeply"}, status_code=400)

    @app.exception_handler(StoreUnavailable)
    async def _store_unavailable(request: Request, error: StoreUnavailable) -> Response:
        if console.serves(request):
            return console.pages.error_page(request, None, 503, rest.UNAVAILABLE)
        return unavailable()


def _add_operational_routes(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        """A person who opens the ingress's address lands on the console."""
        return RedirectResponse(f"{console.PREFIX}/", status_code=307)

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"])
    async def readyz(request: Request) -> JSONResponse:
        """The database and the broker are reachable."""
        runtime: IngressRuntime = request.app.state.runtime
        checks = {
            "database": await run_in_threadpool(_database_ready, runtime),
            "broker": await run_in_threadpool(_broker_ready, runtime.settings),
        }
        ready = all(state == "ok" for state in checks.values())
        return JSONResponse(
            {"status": "ready" if ready else "not ready", "checks": checks},
            status_code=200 if ready else 503,
        )

    @app.get("/metrics", tags=["operations"])
    async def metrics(request: Request) -> Response:
        """Prometheus text: deliveries by provider and result, ingress latency,
        unexpected errors, payload mismatches, rejected signatures, relay
        counters and its pending keys; and, read from the database at each
        scrape, the inbox by status, the oldest queued delivery's age, the
        backed-up workspaces' backlogs and waits, the sweeper's lag, each
        source's last delivery and last catch-up, and the downtime no
        catch-up has covered (``models.reports.gaps``). With
        TASKHOOK_METRICS_TOKEN set, only for ``Authorization: Bearer <token>``."""
        runtime: IngressRuntime = request.app.state.runtime
        wanted = runtime.settings.metrics_token
        if wanted and not _bearer_is(request.headers.get("authorization"), wanted):
            return JSONResponse(
                {"error": "/metrics needs 'Authorization: Bearer <TASKHOOK_METRICS_TOKEN>'"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        runtime.metrics.show_relay(pending=runtime.relay.pending())
        runtime.metrics.flooding_sources.set(len(runtime.flood_gate.flooding()))
        try:
            found = await runtime.in_store_thread(_gaps, runtime)
            inbox = await runtime.in_store_thread(_inbox, runtime)
        except StoreUnavailable:
            pass  # the process's own counters still answer; the gauges keep their last values
        else:
            by_source = runtime.settings.metrics_source_labels
            runtime.metrics.show_gaps(found, by_source=by_source)
            grace = runtime.settings.queued_grace_seconds
            runtime.metrics.show_inbox(inbox, by_source=by_source, queued_grace_seconds=grace)
        return Response(generate_latest(runtime.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _bearer_is(authorization: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time."""
    scheme, _, presented = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode(), token.encode()
    )


def _gaps(runtime: IngressRuntime) -> Gaps:
    with runtime.store_errors(), session_scope(runtime.sessions) as session:
        return gaps(session=session, heartbeat_seconds=runtime.settings.ingress_heartbeat_seconds)


def _inbox(runtime: IngressRuntime) -> InboxReading:
    with runtime.store_errors(), session_scope(runtime.sessions) as session:
        return runtime.metrics.read_inbox(session=session)


def _database_ready(runtime: IngressRuntime) -> str:
    try:
        with runtime.store_errors(), session_scope(runtime.sessions) as session:
            session.execute(text("SELECT 1"))
    except StoreUnavailable as error:
        return f"unavailable ({error})"
    return "ok"


def _broker_ready(settings: Settings) -> str:
    try:
        with Connection(
            settings.broker_url,
            transport=broker_transport(settings),
            transport_options=broker_transport_options(settings),
            connect_timeout=settings.enqueue_timeout_seconds,
        ) as connection:
            connection.ensure_connection(max_retries=1, timeout=settings.enqueue_timeout_seconds)
    except Exception as error:  # any failure to connect means "not ready"
        return f"unavailable ({error.__class__.__name__})"
    return "ok"


app = create_app()
