"""Catch-up from GitHub's delivery log, against a local server that speaks
GitHub's API (bench/fakes/github_api.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import copy
import json
from datetime import timedelta

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from bench.fakes.github_api import FakeGitHub
from models.catchup import log_settings, set_app_access, set_log_access
from models.db import session_scope
from models.errors import InvalidSource
from models.tables import CatchUpRun, CatchUpSource, Delivery, Workspace, utcnow
from tests.support.deliveries import FIXTURES
from tests.support.feeds import tasks_of
from tests.support.runs import run
from tests.support.scenarios import a_source, reading_the_github_log
from tests.support.stores import Store
from worker.catchup.github_log import ApiUnavailable, BadCredentials, DeliveryLog, RateLimited
from worker.catchup.service import catch_up_github

TOKEN = "ghp_catchup_token_never_shown"
HOOK = "repos/acme/widgets/hooks/123"
OPENED = json.loads((FIXTURES / "github" / "issues__opened.json").read_text())


def issue_opened(number: int) -> dict:
    payload = copy.deepcopy(OPENED)
    payload["issue"]["number"] = number
    payload["issue"]["title"] = f"Issue {number} opened while the ingress was down"
    return payload


@pytest.fixture
def github():
    with FakeGitHub(token=TOKEN) as fake:
        yield fake


@pytest.fixture
def source(store: Store, github: FakeGitHub) -> str:
    workspace = store.workspace()
    a_source(store, workspace.id)
    reading_the_github_log(store.sessions, github.base_url, TOKEN)
    return "acme-github"


def workspace_id(store: Store) -> int:
    with session_scope(store.sessions) as session:
        return session.scalar(select(Workspace.id))


def catch_up(store: Store, sent: list[int] | None = None, **options):
    sent = [] if sent is None else sent
    options.setdefault("send", sent.extend)
    return catch_up_github(sessions=store.sessions, slug="acme-github", **options)


def failed_deliveries(github: FakeGitHub, count: int, *, first: int = 1) -> list[str]:
    guids = []
    for number in range(first, first + count):
        guid = f"00000000-0000-4000-8000-{number:012d}"
        github.log_delivery(
            hook=HOOK,
            guid=guid,
            event="issues",
            action="opened",
            payload=issue_opened(number),
            status_code=502,
        )
        guids.append(guid)
    return guids


def test_missed_creates_are_stored_once_and_become_tasks_once(
    store: Store, github: FakeGitHub, source: str
):
    github.page_size_cap = 7  # several pages
    guids = failed_deliveries(github, 20)
    sent: list[int] = []

    report = catch_up(store, sent)

    assert sorted(report.missed) == sorted(guids)
    assert len(report.recovered) == len(sent) == 20
    for pk in sent:
        assert run(store, pk).status.value == "done"
    with session_scope(store.sessions) as session:
        rows = session.scalars(select(Delivery)).all()
        assert {row.delivery_id for row in rows} == set(guids)
        assert {row.origin for row in rows} == {"catch-up"}
    assert len(tasks_of(store.sessions, workspace_id(store))) == 20

    again = catch_up(store, since=utcnow() - timedelta(days=1))
    assert again.missed == [] and again.recovered == []
    assert len(tasks_of(store.sessions, workspace_id(store))) == 20


def test_a_delivery_that_got_through_on_redelivery_is_not_recovered(
    store: Store, github: FakeGitHub, source: str
):
    (guid,) = failed_deliveries(github, 1)
    # GitHub redelivered it and the ingress took it: the inbox holds the guid.
    catch_up(store)  # stores it, as the ingress would have
    github.log_delivery(
        hook=HOOK,
        guid=guid,
        event="issues",
        action="opened",
        payload=issue_opened(1),
        status_code=202,
        redelivery=True,
    )
    report = catch_up(store, since=utcnow() - timedelta(hours=1))
    assert report.missed == []


def test_events_that_create_nothing_are_not_recovered(
    store: Store, github: FakeGitHub, source: str
):
    github.log_delivery(
        hook=HOOK,
        guid="00000000-0000-4000-8000-00000000aaaa",
        event="issues",
        action="closed",
        payload=issue_opened(5) | {"action": "closed"},
        status_code=502,
    )
    assert catch_up(store).missed == []


def test_a_dry_run_stores_nothing_and_moves_no_cursor(
    store: Store, github: FakeGitHub, source: str
):
    guids = failed_deliveries(github, 3)
    report = catch_up(store, dry_run=True)
    assert sorted(report.missed) == sorted(guids) and report.recovered == []
    with session_scope(store.sessions) as session:
        assert session.scalars(select(Delivery)).all() == []
        run_row = session.get(CatchUpRun, report.run_id)
        assert run_row.covered_until is None and run_row.missed == 3


def test_a_run_interrupted_halfway_then_run_again_misses_nothing_and_stores_nothing_twice(
    store: Store, github: FakeGitHub, source: str
):
    github.page_size_cap = 5
    guids = failed_deliveries(github, 12)
    fetched: list[int] = []

    class GoneAfterSix(DeliveryLog):
        """GitHub stops answering after six deliveries were fetched."""

        def request_of(self, attempt_id):
            if len(fetched) == 6:
                raise ApiUnavailable("GitHub answered 502 on each of 4 tries")
            fetched.append(attempt_id)
            return super().request_of(attempt_id)

    def cut_off(settings):
        return GoneAfterSix(
            hook_path=settings.hook_path, api_base_url=settings.api_base_url, token=TOKEN
        )

    with pytest.raises(ApiUnavailable):
        catch_up(store, open_log=cut_off)
    with session_scope(store.sessions) as session:
        # What was fetched before GitHub went away is stored, not dropped.
        assert len(session.scalars(select(Delivery)).all()) == 6
        (interrupted,) = session.scalars(select(CatchUpRun)).all()
        assert interrupted.covered_until is None and "502" in interrupted.error

    again = catch_up(store)
    assert len(again.recovered) == 6
    with session_scope(store.sessions) as session:
        assert sorted(session.scalars(select(Delivery.delivery_id))) == sorted(guids)


def test_stored_deliveries_the_broker_did_not_take_wait_queued_for_the_sweeper(
    store: Store, github: FakeGitHub, source: str
):
    guids = failed_deliveries(github, 8)

    def broker_is_down(pks: list[int]) -> None:
        raise ConnectionError("the broker went away")

    with pytest.raises(ConnectionError):
        catch_up(store, send=broker_is_down)
    with session_scope(store.sessions) as session:
        rows = session.scalars(select(Delivery)).all()
        # Committed before they were sent: all stored, and still queued.
        assert sorted(row.delivery_id for row in rows) == sorted(guids)
        assert {row.status for row in rows} == {"queued"}
    assert catch_up(store).missed == []


def test_bad_credentials_are_one_clear_error_recorded_on_the_run(
    store: Store, github: FakeGitHub, source: str
):
    with session_scope(store.sessions) as session:
        set_log_access(
            session=session,
            slug="acme-github",
            target="repos/acme/widgets",
            hook_id="123",
            token="ghp_wrong",
            api_base_url=github.base_url,
        )
    with pytest.raises(BadCredentials) as refused:
        catch_up(store)
    assert "ghp_wrong" not in str(refused.value)
    with session_scope(store.sessions) as session:
        (run_row,) = session.scalars(select(CatchUpRun)).all()
        assert run_row.error and "ghp_wrong" not in run_row.error


def test_a_rate_limit_longer_than_the_budget_stops_the_run_cleanly(
    store: Store, github: FakeGitHub, source: str
):
    failed_deliveries(github, 2)
    github.rate_limit_next(1, retry_after=3600)
    with pytest.raises(RateLimited):
        catch_up(store)


def test_a_source_without_log_access_says_how_to_give_it(store: Store):
    workspace = store.workspace()
    a_source(store, workspace.id)
    with pytest.raises(InvalidSource, match="taskhook source catch-up acme-github --repo"):
        catch_up(store)


# -- a GitHub App's own hook, read with its JWT --------------------------------------

APP_ID = "4200"


def rsa_key() -> rsa.RSAPrivateKey:
    """A throwaway key, in place of the one GitHub generates for an App."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def pem_of(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()


def give_app_access(store: Store, github: FakeGitHub, key: rsa.RSAPrivateKey) -> None:
    with session_scope(store.sessions) as session:
        set_app_access(
            session=session,
            slug="acme-github",
            app_id=APP_ID,
            private_key=pem_of(key),
            api_base_url=github.base_url,
        )


def test_an_app_source_is_caught_up_from_the_apps_own_hook_with_a_signed_jwt(
    store: Store, github: FakeGitHub
):
    key = rsa_key()
    workspace = store.workspace()
    a_source(store, workspace.id)
    give_app_access(store, github, key)
    guids = [f"00000000-0000-4000-8000-{number:012d}" for number in (1, 2)]
    for number, guid in enumerate(guids, start=1):
        github.log_delivery(
            hook="app/hook", guid=guid, event="issues", payload=issue_opened(number)
        )
    sent: list[int] = []

    report = catch_up(store, sent)

    assert sorted(report.missed) == guids and len(sent) == 2
    for pk in sent:
        assert run(store, pk).status.value == "done"
    assert len(tasks_of(store.sessions, workspace_id(store))) == 2
    # Each request carried a JWT the App's key signed, for at most 10 minutes.
    assert len(github.app_jwts) >= 3  # the list, then each delivery
    claims = jwt.decode(github.app_jwts[0], key.public_key(), algorithms=["RS256"], issuer=APP_ID)
    assert 0 < claims["exp"] - claims["iat"] <= 600


def test_app_access_replaces_a_token_and_hides_the_key(
    store: Store, github: FakeGitHub, source: str
):
    key = rsa_key()
    give_app_access(store, github, key)
    key_line = pem_of(key).splitlines()[1]
    with session_scope(store.sessions) as session:
        settings = log_settings(session=session, slug=source)
        row = session.get(CatchUpSource, settings.source_id)
        assert (row.target, row.hook_id, row.token) == ("app", None, None)
        assert key_line not in repr(row)
    assert (settings.hook_path, settings.token, settings.app_id) == ("app/hook", None, APP_ID)
    assert key_line not in repr(settings)


def test_a_source_holds_a_token_or_an_app_never_both(store: Store, github: FakeGitHub, source: str):
    give_app_access(store, github, rsa_key())
    with pytest.raises(IntegrityError), session_scope(store.sessions) as session:
        session.get(CatchUpSource, 1).token = TOKEN


def test_a_bad_app_id_or_key_is_refused_without_quoting_the_key(store: Store, source: str):
    key_text = pem_of(rsa_key()).replace("MII", "MIX", 1)  # no longer parses
    with session_scope(store.sessions) as session:
        with pytest.raises(InvalidSource, match="App id is a number"):
            set_app_access(session=session, slug=source, app_id="Iv1.x", private_key=key_text)
        with pytest.raises(InvalidSource) as refused:
            set_app_access(session=session, slug=source, app_id=APP_ID, private_key=key_text)
    assert key_text.splitlines()[1] not in str(refused.value)
