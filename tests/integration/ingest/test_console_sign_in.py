"""The console's front door, on SQLite and PostgreSQL: guesses at the sign-in
form are limited per client address and per token prefix (429 with
Retry-After), a refused sign-in is logged without its token, and every
sign-in is in the operations history, on the console and in the CLI."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from ingest.console.auth import SignInLimits
from models.db import session_scope
from models.operations import list_operations
from models.tokens import SHOWN_PREFIX_LENGTH
from tests.support.cli import as_json, taskhook
from tests.support.console import Console, csrf_of, open_console
from tests.support.stores import Store

#: Wrong tokens each address and each prefix may try in a window, here.
FAILURES = 3
WINDOW = 60.0


@pytest.fixture
def console(store: Store) -> Iterator[Console]:
    yield from open_console(
        store, console_sign_in_failures=FAILURES, console_sign_in_window_seconds=WINDOW
    )


def browser(console: Console, address: str) -> TestClient:
    """A browser at client ``address``."""
    return TestClient(console.client.app, client=(address, 50000))


def sign_in(client: TestClient, token: str):
    form = client.get("/console/sign-in")
    return client.post(
        "/console/sign-in",
        data={"token": token, "csrf": csrf_of(form.text), "next": "/console/"},
        follow_redirects=False,
    )


def wrong_like(token: str, n: int) -> str:
    """A wrong token with ``token``'s shown prefix."""
    return token[:SHOWN_PREFIX_LENGTH] + f"wrong-guess-{n}-" + "x" * 20


def test_too_many_wrong_tokens_from_one_address_answer_429(console: Console) -> None:
    attacker = browser(console, "203.0.113.7")
    for n in range(FAILURES):
        assert sign_in(attacker, f"th_guess-{n}-abcdefghijklmnop").status_code == 401

    refused = sign_in(attacker, "th_guess-again-abcdefghijklmnop")
    # Even the right token: else the guesses would simply go on.
    right = sign_in(attacker, console.tokens["acme-member"])

    for answer in (refused, right):
        assert answer.status_code == 429
        assert 1 <= int(answer.headers["retry-after"]) <= WINDOW
        assert "Too many wrong tokens" in answer.text
        assert "taskhook_session" not in answer.headers.get("set-cookie", "")
    assert console.store.scalar("SELECT count(*) FROM console_sessions") == 0
    # Another address is not held up.
    assert sign_in(browser(console, "198.51.100.2"), console.tokens["acme-member"]).status_code == (
        303
    )


def test_too_many_wrong_tokens_for_one_prefix_answer_429_from_any_address(
    console: Console,
) -> None:
    target = console.tokens["acme-operator"]
    for n in range(FAILURES):  # each guess from an address of its own
        assert sign_in(browser(console, f"192.0.2.{n + 1}"), wrong_like(target, n)).status_code == (
            401
        )

    fresh = browser(console, "192.0.2.200")
    guessed = sign_in(fresh, wrong_like(target, 99))
    right = sign_in(fresh, target)

    for answer in (guessed, right):
        assert answer.status_code == 429
        assert 1 <= int(answer.headers["retry-after"]) <= WINDOW
    # Another token, from that same address, is let in.
    assert sign_in(fresh, console.tokens["acme-member"]).status_code == 303


def test_after_the_window_sign_in_is_taken_again(console: Console) -> None:
    now = [1000.0]
    console.client.app.state.console_sign_in_limits = SignInLimits(
        failures=FAILURES, window_seconds=WINDOW, clock=lambda: now[0]
    )
    attacker = browser(console, "203.0.113.9")
    for n in range(FAILURES):
        now[0] += 1
        sign_in(attacker, f"th_guess-{n}-abcdefghijklmnop")

    held = sign_in(attacker, console.tokens["acme-member"])
    assert held.status_code == 429
    # The first wrong token leaves the window WINDOW seconds after it came.
    assert int(held.headers["retry-after"]) == WINDOW - (FAILURES - 1)

    now[0] += int(held.headers["retry-after"])
    assert sign_in(attacker, console.tokens["acme-member"]).status_code == 303


def test_a_refused_sign_in_is_logged_without_its_token(
    console: Console, caplog: pytest.LogCaptureFixture
) -> None:
    target = console.tokens["acme-operator"]
    pasted = "ghp_SomeoneElsesSecretPastedHere0123456789"
    guesses = [wrong_like(target, n) for n in range(FAILURES)]
    attacker = browser(console, "203.0.113.20")
    with caplog.at_level(logging.DEBUG):
        sign_in(browser(console, "203.0.113.21"), pasted)
        for guess in guesses:
            sign_in(attacker, guess)
        sign_in(attacker, target)  # 429, with the right token

    lines = [r.getMessage() for r in caplog.records if "sign-in refused" in r.getMessage()]
    assert len(lines) == 1 + FAILURES + 1
    text = "\n".join(record.getMessage() for record in caplog.records)
    for secret in [*guesses, target, pasted]:
        assert secret not in text
        # Nothing past the shown prefix, of any of them.
        assert secret[SHOWN_PREFIX_LENGTH:][:6] not in text
    # Of a pasted secret that is no token's, not even its first characters.
    assert pasted[:4] not in text
    assert "console sign-in refused from 203.0.113.21: not a valid token" in lines[0]
    assert f"token prefix {target[:SHOWN_PREFIX_LENGTH]}" in lines[1]
    assert "203.0.113.20: too many wrong tokens" in lines[-1]


def test_sign_ins_are_in_the_operations_history(console: Console) -> None:
    sign_in(browser(console, "198.51.100.40"), console.tokens["acme-member"])
    sign_in(browser(console, "198.51.100.41"), "th_not-a-token-at-all-xxxxxxxx")

    listed = as_json(
        taskhook(console.store, "operations", "list", "--kind", "console-sign-in", "--json")
    )["operations"]
    table = taskhook(console.store, "operations", "list").stdout

    (signed_in,) = listed  # a refused sign-in is logged, not recorded
    assert signed_in["kind"] == "console-sign-in"
    assert signed_in["operator"] == "acme-member"
    assert signed_in["criteria"] == {
        "token": console.tokens["acme-member"][:SHOWN_PREFIX_LENGTH],
        "role": "member",
        "address": "198.51.100.40",
    }
    assert signed_in["started_at"] is not None
    assert "console-sign-in" in table and "acme-member" in table
    assert console.tokens["acme-member"] not in table

    # On the console, to a token that sees the member's workspace; not to another's.
    console.sign_in("acme-operator")
    page = console.client.get("/console/operations").text
    assert "acme-member signed in to the console" in page
    assert "address=198.51.100.40" in page
    console.sign_in("globex-operator")
    page = console.client.get("/console/operations").text
    assert "acme-member" not in page and "globex-operator signed in to the console" in page


def test_operations_list_takes_only_known_kinds(console: Console) -> None:
    answer = taskhook(console.store, "operations", "list", "--kind", "sign-in")
    assert answer.exit_code == 2
    with session_scope(console.store.sessions) as session:
        assert list_operations(session=session, kinds=["bulk-replay"]) == []
