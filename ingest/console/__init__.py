"""The operator console: ``/console``, server-rendered pages for a browser.

:func:`install` adds it to the ingress: the pages (``pages``), the live
deliveries stream (``live``), the static files (``static/``: the console's
own script and style, and the vendored chart library -- no CDN: a console
must work with no internet), the answers for a signed-out browser and a
refused action, and the security headers of every console response.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingest.console import auth, live, pages  # noqa: F401 (live registers its route)
from ingest.console.auth import PREFIX, Refused, SignInRequired
from ingest.rest import console_session_of
from models.settings import Settings

#: No inline script and no inline style, nothing from another origin, no
#: framing; forms post only to the console itself.
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    )
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


def serves(request: Request) -> bool:
    """Whether ``request`` is the console's (answered with pages, not JSON)."""
    path = request.url.path
    return path == PREFIX or path.startswith(PREFIX + "/")


def install(app: FastAPI, settings: Settings) -> None:
    app.state.console_sign_in_limits = auth.SignInLimits(
        failures=settings.console_sign_in_failures,
        window_seconds=settings.console_sign_in_window_seconds,
    )
    app.include_router(pages.router)
    app.mount(
        f"{PREFIX}/static",
        StaticFiles(directory=Path(__file__).parent / "static"),
        name="console-static",
    )

    @app.exception_handler(SignInRequired)
    async def _sign_in(request: Request, error: SignInRequired) -> RedirectResponse:
        return RedirectResponse(auth.sign_in_path(error.next_path), status_code=303)

    @app.exception_handler(Refused)
    async def _refused(request: Request, error: Refused) -> HTMLResponse:
        user = await run_in_threadpool(console_session_of, request)
        return pages.error_page(request, user, error.status, error.message)

    app.add_middleware(ConsoleHeaders)


class ConsoleHeaders:
    """The security headers on every console response; and no caching of a
    page, which may show what only a signed-in operator may see."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return
        static = path.startswith(f"{PREFIX}/static/")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if static or name.lower() != b"cache-control"
                ]
                headers += SECURITY_HEADERS
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
