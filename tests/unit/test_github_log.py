"""The client of GitHub's delivery log (worker/catchup/github_log.py), against
httpx.MockTransport: paging, the stop at ``since``, the guid rule of
``missed_creates``, rate limits, retries, errors, and a token that never shows."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import jwt
import pytest

from worker.catchup.github_log import (
    ApiUnavailable,
    AppJwt,
    AttemptNotFound,
    BadCredentials,
    CatchUpError,
    DeliveryLog,
    Forbidden,
    LoggedAttempt,
    RateLimited,
    UnexpectedResponse,
    missed_creates,
)

TOKEN = "ghp_S3cretT0kenThatMustNeverShow0123456789"
API = "https://api.github.com"
HOOK = "repos/acme/widgets/hooks/123"
DELIVERIES = f"/{HOOK}/deliveries"
NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

Handler = Callable[[httpx.Request], httpx.Response]


class FakeTime:
    """A clock that a sleep moves forward, and the sleeps it was asked for."""

    def __init__(self) -> None:
        self.now = NOW.timestamp()
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


class FakeGitHub:
    """Answers requests in order from ``answers`` (the last one for ever), recording them."""

    def __init__(self, *answers: httpx.Response | Handler | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer(request) if callable(answer) else answer


def delivery_log(github: Handler, time: FakeTime | None = None, **options) -> DeliveryLog:
    time = time or FakeTime()
    options = {"api_base_url": API, "hook_path": HOOK, **options}
    return DeliveryLog(
        token=TOKEN,
        sleep=time.sleep,
        clock=time.clock,
        transport=httpx.MockTransport(github),
        **options,
    )


def row(
    attempt_id: int,
    guid: str,
    *,
    minutes_ago: float,
    status_code: int = 202,
    event: str = "issues",
    action: str | None = "opened",
    redelivery: bool = False,
) -> dict[str, object]:
    delivered_at = NOW - timedelta(minutes=minutes_ago)
    return {
        "id": attempt_id,
        "guid": guid,
        "delivered_at": delivered_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "redelivery": redelivery,
        "duration": 0.27,
        "status": "OK" if status_code < 300 else "Invalid HTTP Response: 502",
        "status_code": status_code,
        "event": event,
        "action": action,
        "installation_id": None,
        "repository_id": 4242,
        "throttled_at": None,
    }


def page(rows: list[dict[str, object]], *, next_cursor: str | None = None) -> httpx.Response:
    headers = {}
    if next_cursor is not None:
        # As GitHub writes it: absolute URLs, the next page among other relations.
        headers["Link"] = (
            f'<{API}{DELIVERIES}?per_page=100&cursor={next_cursor}>; rel="next", '
            f'<{API}{DELIVERIES}?per_page=100>; rel="first"'
        )
    return httpx.Response(200, json=rows, headers=headers)


def attempt(attempt_id: int, guid: str, *, minutes_ago: float, **fields) -> LoggedAttempt:
    defaults = {"redelivery": False, "status_code": 202, "event": "issues", "action": "opened"}
    return LoggedAttempt(
        id=attempt_id,
        guid=guid,
        delivered_at=NOW - timedelta(minutes=minutes_ago),
        **{**defaults, **fields},
    )


def rate_limited(status: int = 403, **headers: str) -> httpx.Response:
    return httpx.Response(
        status,
        json={"message": "API rate limit exceeded for user ID 1."},
        headers={key.replace("_", "-"): value for key, value in headers.items()},
    )


# -- the requests -------------------------------------------------------------


def test_every_request_carries_githubs_headers():
    github = FakeGitHub(page([]))
    with delivery_log(github) as log:
        assert list(log.attempts(since=NOW - timedelta(days=3))) == []

    (request,) = github.requests
    assert request.headers["Accept"] == "application/vnd.github+json"
    assert request.headers["X-GitHub-Api-Version"] == "2022-11-28"
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["User-Agent"] == "taskhook-catch-up"
    assert str(request.url) == f"{API}{DELIVERIES}?per_page=100"


@pytest.mark.parametrize(
    ("api_base_url", "hook_path"),
    [
        ("https://ghe.example/api/v3", "repos/acme/widgets/hooks/123"),
        ("https://ghe.example/api/v3/", "/repos/acme/widgets/hooks/123/"),
    ],
)
def test_an_enterprise_server_base_url_is_joined_without_double_slashes(api_base_url, hook_path):
    github = FakeGitHub(page([]), httpx.Response(202))
    with delivery_log(github, api_base_url=api_base_url, hook_path=hook_path) as log:
        list(log.attempts(since=NOW))
        log.redeliver(42)

    assert [str(request.url) for request in github.requests] == [
        "https://ghe.example/api/v3/repos/acme/widgets/hooks/123/deliveries?per_page=100",
        "https://ghe.example/api/v3/repos/acme/widgets/hooks/123/deliveries/42/attempts",
    ]


@pytest.mark.parametrize("hook_path", ["orgs/acme/hooks/7", "app/hook"])
def test_org_and_app_hooks_have_their_own_paths(hook_path):
    github = FakeGitHub(page([]))
    with delivery_log(github, hook_path=hook_path) as log:
        list(log.attempts(since=NOW))
    assert github.requests[0].url.path == f"/{hook_path}/deliveries"


@pytest.mark.parametrize("hook_path", ["repos/acme/hooks/1", "hooks/1", "app/hook/../x", ""])
def test_a_hook_path_that_names_no_hook_is_refused(hook_path):
    with pytest.raises(ValueError, match="hook_path"):
        delivery_log(FakeGitHub(page([])), hook_path=hook_path)


# -- paging -------------------------------------------------------------------


def test_attempts_follow_the_link_cursor_over_three_pages():
    def by_cursor(request: httpx.Request) -> httpx.Response:
        pages = {
            None: page(
                [row(30, "g30", minutes_ago=1), row(29, "g29", minutes_ago=2)], next_cursor="c2"
            ),
            "c2": page(
                [row(28, "g28", minutes_ago=3), row(27, "g27", minutes_ago=4)], next_cursor="c3"
            ),
            "c3": page([row(26, "g26", minutes_ago=5)]),
        }
        return pages[request.url.params.get("cursor")]

    github = FakeGitHub(by_cursor)
    with delivery_log(github) as log:
        ids = [a.id for a in log.attempts(since=NOW - timedelta(days=3))]

    assert ids == [30, 29, 28, 27, 26]
    assert [r.url.params.get("cursor") for r in github.requests] == [None, "c2", "c3"]
    # Only the cursor comes from the Link: every page is asked of the same endpoint.
    assert {r.url.path for r in github.requests} == {DELIVERIES}
    assert {r.url.params["per_page"] for r in github.requests} == {"100"}


def test_attempts_stop_at_the_first_one_delivered_before_since():
    github = FakeGitHub(
        page(
            [
                row(3, "g3", minutes_ago=5),
                row(2, "g2", minutes_ago=59),
                row(1, "g1", minutes_ago=61),
            ],
            next_cursor="older",
        )
    )
    with delivery_log(github) as log:
        ids = [a.id for a in log.attempts(since=NOW - timedelta(hours=1))]

    assert ids == [3, 2]
    assert len(github.requests) == 1  # the older page is never asked for


def test_a_next_link_without_a_cursor_is_an_error_not_a_silent_stop():
    github = FakeGitHub(
        httpx.Response(200, json=[], headers={"Link": f'<{API}{DELIVERIES}?page=2>; rel="next"'})
    )
    with delivery_log(github) as log, pytest.raises(UnexpectedResponse, match="cursor"):
        list(log.attempts(since=NOW - timedelta(days=1)))


def test_a_log_that_pages_in_a_circle_stops():
    github = FakeGitHub(page([], next_cursor="same"))
    with delivery_log(github) as log, pytest.raises(UnexpectedResponse, match="same page cursor"):
        list(log.attempts(since=NOW - timedelta(days=1)))
    assert len(github.requests) == 2


def test_delivered_at_is_aware_utc_and_a_null_action_is_tolerated():
    ping = row(5, "g5", minutes_ago=0, event="ping", action=None)
    ping["delivered_at"] = "2024-05-01T11:59:59.250Z"  # GitHub sometimes writes milliseconds
    github = FakeGitHub(page([ping]))
    with delivery_log(github) as log:
        (logged,) = log.attempts(since=NOW - timedelta(days=1))

    assert logged.delivered_at == datetime(2024, 5, 1, 11, 59, 59, 250000, tzinfo=UTC)
    assert logged.action is None
    assert logged.event_name == "ping"


def test_since_must_be_aware():
    with delivery_log(FakeGitHub(page([]))) as log, pytest.raises(ValueError, match="aware"):
        log.attempts(since=datetime(2024, 5, 1))


def test_a_row_without_a_guid_is_an_unexpected_response():
    broken = row(1, "g1", minutes_ago=1)
    del broken["guid"]
    log = delivery_log(FakeGitHub(page([broken])))
    with log, pytest.raises(UnexpectedResponse, match="'guid'"):
        list(log.attempts(since=NOW - timedelta(days=1)))


# -- one request, a redelivery ---------------------------------------------------


def test_request_of_returns_the_headers_and_payload_github_sent():
    body = {
        **row(42, "g42", minutes_ago=10, status_code=502),
        "request": {
            "headers": {"X-GitHub-Event": "issues", "X-GitHub-Delivery": "g42"},
            "payload": {"action": "opened", "issue": {"number": 7}},
        },
        "response": {"headers": {}, "payload": "bad gateway"},
    }
    github = FakeGitHub(httpx.Response(200, json=body))
    with delivery_log(github) as log:
        logged = log.request_of(42)

    assert github.requests[0].url.path == f"{DELIVERIES}/42"
    assert logged.attempt.guid == "g42"
    assert logged.attempt.status_code == 502
    assert logged.headers["X-GitHub-Delivery"] == "g42"
    assert logged.payload == {"action": "opened", "issue": {"number": 7}}


def test_redeliver_posts_to_the_attempts_of_the_delivery():
    github = FakeGitHub(httpx.Response(202, json={}))
    with delivery_log(github) as log:
        log.redeliver(42)

    (request,) = github.requests
    assert request.method == "POST"
    assert request.url.path == f"{DELIVERIES}/42/attempts"


def test_an_attempt_that_left_the_log_is_not_found():
    github = FakeGitHub(httpx.Response(404, json={"message": "Not Found"}))
    with delivery_log(github) as log, pytest.raises(AttemptNotFound, match="3 days"):
        log.request_of(42)


@pytest.mark.parametrize("attempt_id", [0, -1, True, "42/../../x"])
def test_an_attempt_id_is_a_positive_integer(attempt_id):
    with delivery_log(FakeGitHub(httpx.Response(202))) as log, pytest.raises(ValueError):
        log.redeliver(attempt_id)


# -- missed_creates: the guid rule ---------------------------------------------------


def test_a_failed_attempt_and_its_successful_redelivery_are_one_guid():
    failed = attempt(1, "g1", minutes_ago=30, status_code=502)
    redelivered = attempt(2, "g1", minutes_ago=10, status_code=202, redelivery=True)

    # Newest first, as the log lists them; the inbox lost the delivery anyway.
    missed = missed_creates(
        [redelivered, failed], known_guids=set(), create_events={"issues.opened"}
    )

    assert missed == [redelivered]  # one guid, its newest attempt to fetch
    assert (failed.succeeded, redelivered.succeeded) == (False, True)


def test_a_guid_the_inbox_holds_is_never_recovered_whatever_its_status():
    held_but_failed = attempt(1, "held", minutes_ago=20, status_code=502)
    missing_but_answered = attempt(2, "lost", minutes_ago=15, status_code=202)

    missed = missed_creates(
        [missing_but_answered, held_but_failed],
        known_guids={"held"},
        create_events={"issues.opened"},
    )

    assert missed == [missing_but_answered]


def test_only_create_events_are_recovered_oldest_delivery_first():
    newer = attempt(5, "newer", minutes_ago=5)
    comment = attempt(4, "comment", minutes_ago=6, event="issue_comment", action="created")
    ping = attempt(3, "ping", minutes_ago=7, event="ping", action=None)
    # An old delivery redelivered recently still comes first: its event came first.
    old_redelivered = attempt(6, "older", minutes_ago=1, redelivery=True, status_code=0)
    old_first = attempt(1, "older", minutes_ago=50, status_code=0)
    asked: list[list[str]] = []

    def inbox_holds(guids: list[str]) -> set[str]:
        asked.append(guids)
        return set()

    missed = missed_creates(
        [old_redelivered, newer, comment, ping, old_first],
        known_guids=inbox_holds,
        create_events=frozenset({"issues.opened", "pull_request.opened"}),
    )

    assert missed == [old_redelivered, newer]
    assert asked == [["older", "newer"]]  # asked once, about the creates only


def test_create_events_may_be_a_function_of_event_and_action():
    opened = attempt(2, "opened", minutes_ago=2)
    closed = attempt(1, "closed", minutes_ago=3, action="closed")

    def creates(event: str, action: str | None) -> bool:
        return (event, action) == ("issues", "opened")

    assert missed_creates([opened, closed], known_guids=set(), create_events=creates) == [opened]


def test_nothing_to_ask_the_inbox_about_asks_nothing():
    def inbox_holds(guids: list[str]) -> set[str]:
        raise AssertionError("not asked")

    assert missed_creates([], known_guids=inbox_holds, create_events={"issues.opened"}) == []


# -- rate limits ------------------------------------------------------------------


def test_a_rate_limit_with_retry_after_waits_that_long_then_retries():
    time = FakeTime()
    github = FakeGitHub(rate_limited(Retry_After="7"), page([row(1, "g1", minutes_ago=1)]))
    with delivery_log(github, time) as log:
        assert [a.id for a in log.attempts(since=NOW - timedelta(days=1))] == [1]

    assert time.sleeps == [7.0]
    assert len(github.requests) == 2


def test_a_secondary_rate_limit_429_with_retry_after_waits_too():
    time = FakeTime()
    github = FakeGitHub(rate_limited(429, Retry_After="12"), httpx.Response(202))
    with delivery_log(github, time) as log:
        log.redeliver(9)
    assert time.sleeps == [12.0]


def test_a_spent_rate_limit_waits_until_its_reset():
    time = FakeTime()
    reset = int(time.now) + 30
    github = FakeGitHub(
        rate_limited(X_RateLimit_Remaining="0", X_RateLimit_Reset=str(reset)),
        page([]),
    )
    with delivery_log(github, time) as log:
        list(log.attempts(since=NOW))

    # Until the reset, and one second more: the reset is in whole seconds.
    assert time.sleeps == [31.0]


def test_a_rate_limit_beyond_the_budget_raises_without_waiting():
    time = FakeTime()
    reset = int(time.now) + 3600
    github = FakeGitHub(rate_limited(X_RateLimit_Remaining="0", X_RateLimit_Reset=str(reset)))
    log = delivery_log(github, time, max_wait_seconds=60)
    with log, pytest.raises(RateLimited) as raised:
        list(log.attempts(since=NOW))

    assert time.sleeps == []
    assert raised.value.retry_at == datetime.fromtimestamp(reset + 1, UTC)
    assert "2024-05-01T13:00:01Z" in str(raised.value)


def test_the_wait_budget_is_shared_by_every_request_of_the_client():
    time = FakeTime()
    github = FakeGitHub(
        rate_limited(Retry_After="40"), httpx.Response(202), rate_limited(Retry_After="40")
    )
    with delivery_log(github, time, max_wait_seconds=60) as log:
        log.redeliver(1)
        with pytest.raises(RateLimited, match="20s left"):
            log.redeliver(2)
    assert time.sleeps == [40.0]


def test_a_rate_limit_that_never_lifts_is_bounded_by_the_retries():
    time = FakeTime()
    github = FakeGitHub(rate_limited(Retry_After="0"))
    with delivery_log(github, time, retries=3) as log, pytest.raises(RateLimited, match="4 tries"):
        log.redeliver(1)
    assert len(github.requests) == 4


def test_a_rate_limit_that_says_not_how_long_waits_a_minute():
    # GitHub's advice for a secondary rate limit that sends no header.
    time = FakeTime()
    secondary = httpx.Response(
        403, json={"message": "You have exceeded a secondary rate limit. Please wait."}
    )
    github = FakeGitHub(secondary, rate_limited(429), httpx.Response(202))
    with delivery_log(github, time, max_wait_seconds=120) as log:
        log.redeliver(1)
    assert time.sleeps == [60.0, 60.0]


def test_retry_after_may_be_an_http_date():
    time = FakeTime()
    github = FakeGitHub(rate_limited(Retry_After="Wed, 01 May 2024 12:00:20 GMT"), page([]))
    with delivery_log(github, time) as log:
        list(log.attempts(since=NOW))
    assert time.sleeps == [20.0]


@pytest.mark.parametrize("remaining", [None, "4999"])
def test_a_403_that_is_no_rate_limit_is_forbidden(remaining):
    # GitHub sends X-RateLimit-Remaining on every answer: only 0 is a limit.
    headers = {} if remaining is None else {"X-RateLimit-Remaining": remaining}
    github = FakeGitHub(
        httpx.Response(403, json={"message": "Resource not accessible"}, headers=headers)
    )
    with delivery_log(github) as log, pytest.raises(Forbidden) as raised:
        list(log.attempts(since=NOW))

    assert isinstance(raised.value, BadCredentials)
    assert "403 Resource not accessible" in str(raised.value)
    assert len(github.requests) == 1


# -- retries ------------------------------------------------------------------------


def test_a_5xx_is_retried_after_a_short_backoff():
    time = FakeTime()
    github = FakeGitHub(httpx.Response(502), page([row(1, "g1", minutes_ago=1)]))
    with delivery_log(github, time) as log:
        assert [a.id for a in log.attempts(since=NOW - timedelta(days=1))] == [1]
    assert time.sleeps == [0.5]


def test_a_5xx_on_every_try_is_api_unavailable():
    time = FakeTime()
    github = FakeGitHub(httpx.Response(503))
    log = delivery_log(github, time, retries=3)
    with log, pytest.raises(ApiUnavailable, match=r"answered 503 to GET \S+ on each of 4 tries"):
        list(log.attempts(since=NOW))
    assert len(github.requests) == 4
    assert time.sleeps == [0.5, 1.0, 2.0]


def test_a_connection_error_is_retried_then_api_unavailable():
    time = FakeTime()
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    github = FakeGitHub(refused, httpx.ReadTimeout("timed out"), httpx.Response(202))
    with delivery_log(github, time, retries=2) as log:
        log.redeliver(1)
    assert time.sleeps == [0.5, 1.0]

    log = delivery_log(FakeGitHub(refused), retries=1)
    with log, pytest.raises(ApiUnavailable, match="ConnectError"):
        log.redeliver(1)


def test_a_moved_hook_is_an_error_naming_where_not_a_followed_redirect():
    moved = httpx.Response(
        301, headers={"Location": f"{API}/repositories/99/hooks/123/deliveries?per_page=100"}
    )
    github = FakeGitHub(moved)
    log = delivery_log(github)
    with log, pytest.raises(UnexpectedResponse, match="moved to /repositories/99/hooks/123/"):
        list(log.attempts(since=NOW))
    assert len(github.requests) == 1


# -- credentials, and the token that never shows -------------------------------------


def test_401_is_bad_credentials_with_a_clear_message():
    github = FakeGitHub(httpx.Response(401, json={"message": "Bad credentials"}))
    with delivery_log(github) as log, pytest.raises(BadCredentials) as raised:
        list(log.attempts(since=NOW))

    message = str(raised.value)
    assert message == (
        f"GitHub rejected the token for GET {HOOK}/deliveries (401 Bad credentials): "
        "it is wrong, expired or revoked"
    )
    assert len(github.requests) == 1  # never retried


def test_404_on_the_hook_says_the_token_may_not_see_it():
    github = FakeGitHub(httpx.Response(404, json={"message": "Not Found"}))
    with delivery_log(github) as log, pytest.raises(BadCredentials, match="may not see it"):
        list(log.attempts(since=NOW))


def _every_failure() -> list[httpx.Response | Exception]:
    echo = {"message": f"Validation failed for Bearer {TOKEN}"}  # a server that echoes it
    return [
        httpx.Response(401, json={"message": "Bad credentials"}),
        httpx.Response(403, json={"message": f"no access for {TOKEN}"}),
        httpx.Response(404, json={"message": "Not Found"}),
        httpx.Response(422, json=echo),
        httpx.Response(502, text=TOKEN),
        rate_limited(Retry_After="99999"),
        httpx.ConnectError(f"could not connect with {TOKEN}"),
    ]


@pytest.mark.parametrize("failure", _every_failure())
def test_the_token_never_shows_in_an_error_a_log_line_or_a_repr(failure, caplog):
    caplog.set_level(logging.DEBUG)
    with delivery_log(FakeGitHub(failure), retries=1) as log:
        assert TOKEN not in repr(log)
        with pytest.raises(CatchUpError) as raised:
            list(log.attempts(since=NOW))

    error = raised.value
    assert TOKEN not in str(error)
    assert TOKEN not in repr(error)
    assert "\n" not in str(error)
    assert TOKEN not in caplog.text


@pytest.mark.parametrize(
    "said",
    [
        "x" * 190 + f" {TOKEN}",  # whole, where a cut to 200 characters falls inside it
        f"token {TOKEN[:12]}... is invalid",  # a prefix, as a provider shortens it
        f"{TOKEN[4:20]} and {TOKEN[-9:]}",  # pieces of it anywhere
        "y" * 5000 + TOKEN,  # far past what is quoted
    ],
    ids=["at the cut", "a prefix", "pieces", "long"],
)
@pytest.mark.parametrize("status", [401, 403, 422])
def test_no_piece_of_the_token_of_8_characters_shows_in_an_error(said, status):
    github = FakeGitHub(httpx.Response(status, json={"message": said}))
    with delivery_log(github) as log, pytest.raises(CatchUpError) as raised:
        list(log.attempts(since=NOW))
    error = str(raised.value)
    assert not [TOKEN[at : at + 8] for at in range(len(TOKEN) - 7) if TOKEN[at : at + 8] in error]
    assert "x" * 200 not in error and "y" * 200 not in error  # still cut


def test_a_token_no_header_can_carry_is_refused_without_quoting_it():
    with pytest.raises(ValueError) as raised:
        DeliveryLog(api_base_url=API, hook_path=HOOK, token="ghp_secret\r\nX-Evil: 1")
    assert "ghp_secret" not in str(raised.value)


# -- a GitHub App's JWT --------------------------------------------------------------

APP_ID = "4200"


def _rsa_pem() -> tuple[str, object]:
    """A throwaway RSA key, as GitHub hands an App's (PKCS#1 PEM), and its public half."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()
    return pem, key.public_key()


APP_KEY_PEM, APP_PUBLIC_KEY = _rsa_pem()


def app_jwt(time: FakeTime) -> AppJwt:
    return AppJwt(app_id=APP_ID, private_key=APP_KEY_PEM, clock=time.clock)


def claims_of(authorization: str) -> tuple[dict, dict]:
    """The header and the claims of a ``Bearer <JWT>``, its signature checked with
    the public key (its times are checked by the tests, against the fake clock)."""
    scheme, _, token = authorization.partition(" ")
    assert scheme == "Bearer"
    claims = jwt.decode(
        token,
        APP_PUBLIC_KEY,
        algorithms=["RS256"],
        issuer=APP_ID,
        options={"verify_exp": False, "verify_iat": False, "require": ["iat", "exp", "iss"]},
    )
    return jwt.get_unverified_header(token), claims


def test_an_app_jwt_is_rs256_issued_by_the_app_a_minute_back_for_nine_minutes():
    time = FakeTime()
    header, claims = claims_of(app_jwt(time)())

    now = int(time.now)
    assert header["alg"] == "RS256"
    assert claims["iss"] == APP_ID
    assert claims["iat"] == now - 60  # GitHub's advice, for clock drift
    assert claims["exp"] == now + 9 * 60
    assert claims["exp"] - claims["iat"] <= 10 * 60  # GitHub refuses longer


def test_an_app_jwt_is_reused_then_minted_again_within_a_minute_of_its_expiry():
    time = FakeTime()
    credential = app_jwt(time)
    first = credential()

    time.now += 7 * 60 + 59  # 61 s left: still good
    assert credential() == first
    time.now += 1  # 60 s left: replaced
    renewed = credential()
    assert renewed != first
    _, claims = claims_of(renewed)
    assert claims["iat"] == int(time.now) - 60
    assert claims["exp"] == int(time.now) + 9 * 60


def test_a_long_run_never_sends_an_expired_jwt():
    time = FakeTime()
    sent: list[tuple[float, str]] = []  # when each request left, and its Authorization

    def github(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/app/hook/deliveries"
        sent.append((time.now, request.headers["Authorization"]))
        return page([])

    log = DeliveryLog(
        api_base_url=API,
        hook_path="app/hook",
        authorization=app_jwt(time),
        sleep=time.sleep,
        clock=time.clock,
        transport=httpx.MockTransport(github),
    )
    with log:
        for _ in range(30):  # a request a minute, for half an hour
            list(log.attempts(since=NOW))
            time.now += 60
    assert len({authorization for _, authorization in sent}) > 1
    for sent_at, authorization in sent:
        _, claims = claims_of(authorization)
        assert claims["exp"] - sent_at > 60  # more than a minute left when sent


def test_an_app_id_is_a_number_and_a_key_must_be_an_rsa_pem():
    with pytest.raises(ValueError, match="App id is a number"):
        AppJwt(app_id="Iv1.abc", private_key=APP_KEY_PEM)
    not_a_key = (
        "-----BEGIN RSA PRIVATE KEY-----\nc2VjcmV0IGJ1dCBicm9rZW4=\n-----END RSA PRIVATE KEY-----\n"
    )
    with pytest.raises(ValueError) as raised:
        AppJwt(app_id=APP_ID, private_key=not_a_key)
    assert "c2VjcmV0" not in str(raised.value) and raised.value.__cause__ is None


@pytest.mark.parametrize("failure", _every_failure()[:5])
def test_the_key_and_the_jwt_never_show_in_an_error_a_log_line_or_a_repr(failure, caplog):
    caplog.set_level(logging.DEBUG)
    time = FakeTime()
    credential = app_jwt(time)
    sent_jwt = credential().partition(" ")[2]

    def echo_the_jwt(request: httpx.Request) -> httpx.Response:
        if isinstance(failure, Exception):
            raise failure
        return httpx.Response(failure.status_code, json={"message": f"bad JWT {sent_jwt}"})

    log = DeliveryLog(
        api_base_url=API,
        hook_path="app/hook",
        authorization=credential,
        retries=1,
        sleep=time.sleep,
        clock=time.clock,
        transport=httpx.MockTransport(FakeGitHub(echo_the_jwt)),
    )
    with log, pytest.raises(CatchUpError) as raised:
        list(log.attempts(since=NOW))

    key_body = APP_KEY_PEM.splitlines()[1]
    shown = [str(raised.value), repr(raised.value), repr(log), repr(credential), caplog.text]
    for text in shown:
        assert sent_jwt not in text and key_body not in text


def test_a_delivery_log_takes_a_token_or_an_authorization_not_both():
    credential = app_jwt(FakeTime())
    with pytest.raises(ValueError, match="either a token or an authorization"):
        DeliveryLog(api_base_url=API, hook_path="app/hook", token=TOKEN, authorization=credential)
    with pytest.raises(ValueError, match="either a token or an authorization"):
        DeliveryLog(api_base_url=API, hook_path="app/hook")
