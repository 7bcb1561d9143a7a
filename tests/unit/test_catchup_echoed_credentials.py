"""A provider that echoes the credential it was sent (worker/catchup/api.py):
in a redirect's Location, or in a Link's cursor and its headers. The
catch-up's error, and every log line of the process even at DEBUG, still
never hold it. Found by the canary session (tests/e2e/test_canaries.py)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from bench.fakes.server import Answer, FakeServer, ReceivedRequest
from worker.catchup.api import UnexpectedResponse
from worker.catchup.github_log import DeliveryLog
from worker.catchup.jira_search import JiraSearch

TOKEN = "ghp_EchoedByTheProviderNeverShown"
HOOK = "repos/acme/widgets/hooks/1"


class Echoing(FakeServer):
    """Answers an empty log page whose Link's cursor, and a header, echo the
    token; the page after it, asked of the same host, ends the log."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[ReceivedRequest] = []

    def _answer(self, request: ReceivedRequest) -> Answer:
        self.asked.append(request)
        token = request.headers["authorization"].partition(" ")[2]
        if "cursor" in request.query:
            return Answer(200, [])
        link = f'<http://elsewhere.example{request.path}?cursor=v1_{token}>; rel="next"'
        return Answer(200, [], {"Link": link, "X-Echo": token})


def test_a_redirect_that_names_the_credential_is_reported_without_it():
    def moved(request: httpx.Request) -> httpx.Response:
        token = request.headers["authorization"].partition(" ")[2]
        return httpx.Response(302, headers={"Location": f"https://other.example/to/{token}/x"})

    search = JiraSearch(
        site_url="https://jira.example",
        token=TOKEN,
        transport=httpx.MockTransport(moved),
        sleep=lambda seconds: None,
    )
    with search, pytest.raises(UnexpectedResponse) as refused:
        list(search.created_since(since=datetime.now(UTC) - timedelta(hours=1), jql=None))
    assert TOKEN not in str(refused.value)
    assert "moved to /to/[credential]/x; update the URL" in str(refused.value)


def test_no_log_line_holds_an_echoed_credential_even_at_debug(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    with (
        Echoing() as provider,
        DeliveryLog(hook_path=HOOK, api_base_url=provider.base_url, token=TOKEN) as delivery_log,
    ):
        assert list(delivery_log.attempts(since=datetime.now(UTC) - timedelta(hours=1))) == []
    assert len(provider.asked) == 2  # the cursor was followed, on the same host
    assert TOKEN not in caplog.text
