"""A real headless Chromium for the console's tests, through Playwright.

The browser is Debian's ``chromium`` (``executable_path``), never one that
Playwright downloads: scripts/test installs it (``ensure_chromium``). The
fixtures ``browser``, ``browser_log`` and ``page`` (tests/e2e/conftest.py)
are made of ``launched_chromium`` and ``watched_page``; a test module imports
the helpers (``sign_in``, ``screenshot``, ``BrowserLog``).

``watched_page`` is a fresh context per test. It dismisses every dialog and records
it, records console errors, uncaught errors, Content-Security-Policy
violations and subresources that failed to load, and fails the test at
teardown if a dialog opened, a script raised, the policy refused anything or
a part of the page did not load: the console runs no inline script, so any
of those is a bug (or an injection) the test would otherwise miss.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Dialog,
    Error,
    Page,
    Response,
    sync_playwright,
)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",  # the tests may run as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-dev-shm-usage",  # a container's small /dev/shm crashes tabs
    "--disable-background-networking",  # no calls home: the machine may be offline
]
#: Where Playwright waits, at most, for a page to load or an element to appear.
TIMEOUT_MS = 10_000

#: Run by Playwright in every document before the page's own scripts; the
#: page's CSP does not apply to it. It reports each violation of the policy
#: to the test through the binding ``page`` exposes.
_REPORT_CSP_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (event) => {
  window.__taskhookCspViolation(JSON.stringify({
    directive: event.violatedDirective,
    blocked: event.blockedURI,
    source: event.sourceFile,
    line: event.lineNumber,
    sample: event.sample,
  }));
}, true);
"""


@dataclass
class BrowserLog:
    """What a page did that a test may assert on; ``page`` fails on the first three."""

    dialogs: list[str] = field(default_factory=list)
    csp_violations: list[dict] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    #: A script, stylesheet, fetch or stream the page asked for and did not
    #: get (status >= 400): a page that is missing a part of itself.
    failed_loads: list[str] = field(default_factory=list)
    #: Not a failure by themselves: a page answered 401 is logged as a failed load.
    console_errors: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return (
            [f"dialog opened: {text}" for text in self.dialogs]
            + [f"CSP violation: {violation}" for violation in self.csp_violations]
            + [f"uncaught error: {error}" for error in self.page_errors]
            + [f"failed to load: {load}" for load in self.failed_loads]
        )


@contextmanager
def launched_chromium() -> Iterator[Browser]:
    """Debian's Chromium, headless; a missing or broken one fails the test."""
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"chromium is not installed ({CHROMIUM} missing): run scripts/test, which "
            "installs Debian's chromium (apt-get install chromium chromium-driver)",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
        except Error as error:
            pytest.fail(
                f"chromium ({CHROMIUM}) did not start: {error}\nrun scripts/test, which "
                "installs Debian's chromium (apt-get install chromium chromium-driver)",
                pytrace=False,
            )
        try:
            yield launched
        finally:
            launched.close()


@contextmanager
def watched_page(browser: Browser, browser_log: BrowserLog) -> Iterator[Page]:
    """A page in a context of its own, whose doings go to ``browser_log``; on
    leaving, the test fails if the log holds a problem."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    context.expose_binding(
        "__taskhookCspViolation",
        lambda _source, report: browser_log.csp_violations.append(json.loads(report)),
    )
    context.add_init_script(_REPORT_CSP_VIOLATIONS)
    opened = context.new_page()

    def on_dialog(dialog: Dialog) -> None:
        browser_log.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            browser_log.console_errors.append(message.text)

    def on_response(response: Response) -> None:
        request = response.request
        # A page answered 401 or 409 is a test's to judge; the browser's own
        # favicon request is no part of the page.
        if (
            response.status >= 400
            and not request.is_navigation_request()
            and urlsplit(response.url).path != "/favicon.ico"
        ):
            browser_log.failed_loads.append(f"{response.status} {request.method} {response.url}")

    opened.on("dialog", on_dialog)
    opened.on("console", on_console)
    opened.on("pageerror", lambda error: browser_log.page_errors.append(str(error)))
    opened.on("response", on_response)
    try:
        yield opened
    finally:
        context.close()
    if problems := browser_log.problems():
        pytest.fail("the browser saw:\n" + "\n".join(problems), pytrace=False)


def sign_in(page: Page, base_url: str, token: str) -> None:
    """Sign in through the console's form, as a person would, and land on the overview."""
    page.goto(f"{base_url}/console/sign-in")
    page.fill("form#sign-in input[name=token]", token)
    with page.expect_navigation():
        page.click("form#sign-in [type=submit]")
    if not page.url.rstrip("/").endswith("/console"):
        pytest.fail(f"signing in led to {page.url}, not /console/", pytrace=False)


def screenshot(page: Page, view: str) -> None:
    """With TASKHOOK_CONSOLE_SCREENSHOTS=DIR set, a full-page PNG of the view
    as ``DIR/console-<view>.png`` (docs/console/ is filled this way)."""
    folder = os.environ.get("TASKHOOK_CONSOLE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"console-{view}.png"), full_page=True)
