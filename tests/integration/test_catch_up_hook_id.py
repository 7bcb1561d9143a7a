"""Which hook's log a GitHub catch-up reads when no ``--hook-id`` was given,
through the real ingress and against the fake GitHub API, on SQLite and
PostgreSQL. ``X-GitHub-Hook-ID`` is outside the signature: anyone holding
one signed body can resend it under a new delivery id with a hook id of
their choosing. Such a header never breaks the catch-up nor points it at
another hook's log; the hook is the one whose own log lists a delivery the
inbox holds from the source under it, recorded once confirmed."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from bench.fakes.github_api import FakeGitHub
from models.catchup import log_settings, set_log_access
from models.db import session_scope
from models.errors import InvalidSource
from models.tables import CatchUpRun, CatchUpSource, Delivery
from tests.support.cli import refused, taskhook
from tests.support.deliveries import FIXTURES, github_headers
from tests.support.ingress import GITHUB_SECRET, Ingress, open_ingress
from worker.catchup.github_log import BadCredentials
from worker.catchup.service import catch_up_github

TOKEN = "ghp_catchup_token_never_shown"
OURS = "repos/acme/widgets/hooks/123"
#: Another hook of the same repository, posting elsewhere: the token reads its log too.
THEIRS = "repos/acme/widgets/hooks/456"
OPENED = json.loads((FIXTURES / "github" / "issues__opened.json").read_text())
GENUINE = "00000000-0000-4000-8000-000000000001"
MISSED = "00000000-0000-4000-8000-000000000003"
OTHER_HOOKS = "00000000-0000-4000-8000-000000000004"


def issue_opened(number: int) -> dict:
    payload = copy.deepcopy(OPENED)
    payload["issue"]["number"] = number
    payload["issue"]["title"] = f"Issue {number}"
    return payload


@pytest.fixture
def ingress(store) -> Iterator[Ingress]:
    yield from open_ingress(store)


@pytest.fixture
def github(ingress: Ingress) -> Iterator[FakeGitHub]:
    """Our hook's log: the delivery the ingress took, and one it missed;
    another hook's log: a create that was never the source's."""
    with FakeGitHub(token=TOKEN) as fake:
        with session_scope(ingress.store.sessions) as session:
            set_log_access(
                session=session,
                slug="acme-github",
                target="repos/acme/widgets",
                token=TOKEN,
                api_base_url=fake.base_url,
            )
        fake.log_delivery(
            hook=OURS, guid=GENUINE, event="issues", payload=issue_opened(1), status_code=202
        )
        fake.log_delivery(
            hook=OURS, guid=MISSED, event="issues", payload=issue_opened(3), status_code=502
        )
        fake.log_delivery(
            hook=THEIRS, guid=OTHER_HOOKS, event="issues", payload=issue_opened(4), status_code=502
        )
        yield fake


def post(ingress: Ingress, body: bytes, headers: dict[str, str]):
    answer = ingress.client.post("/webhooks/github/acme-github", content=body, headers=headers)
    assert answer.status_code < 300, answer.text
    return answer


def genuine(ingress: Ingress) -> tuple[bytes, dict[str, str]]:
    """The delivery GitHub signed and sent from our hook; what it sent, to replay."""
    body = json.dumps(issue_opened(1)).encode()
    headers = github_headers(
        "issues__opened", body, GITHUB_SECRET, delivery=GENUINE, **{"X-GitHub-Hook-ID": "123"}
    )
    post(ingress, body, headers)
    return body, headers


def replay(ingress: Ingress, captured: tuple[bytes, dict[str, str]], *, hook_id: str, guid: str):
    """The captured signed body, resent under a new delivery id and a forged hook id."""
    body, headers = captured
    post(ingress, body, headers | {"X-GitHub-Delivery": guid, "X-GitHub-Hook-ID": hook_id})
    with session_scope(ingress.store.sessions) as session:
        newest = session.scalars(select(Delivery).order_by(Delivery.id.desc()).limit(1)).one()
        assert (newest.delivery_id, newest.hook_id) == (guid, hook_id)  # the inbox kept it


def catch_up(ingress: Ingress):
    return catch_up_github(sessions=ingress.store.sessions, slug="acme-github", send=lambda _: None)


def stored_ids(ingress: Ingress) -> set[str]:
    with session_scope(ingress.store.sessions) as session:
        return set(
            session.scalars(select(Delivery.delivery_id).where(Delivery.origin != "webhook"))
        )


def recorded_hook(ingress: Ingress) -> str | None:
    with session_scope(ingress.store.sessions) as session:
        return session.scalar(select(CatchUpSource.hook_id))


def logs_read(github: FakeGitHub) -> set[str]:
    return {
        request.path.rpartition("/deliveries")[0].lstrip("/")
        for request in github.requests
        if "/deliveries" in request.path
    }


def test_a_replay_naming_hook_x_neither_breaks_the_catch_up_nor_reaches_a_url(
    ingress: Ingress, github: FakeGitHub
):
    captured = genuine(ingress)
    replay(ingress, captured, hook_id="x", guid="00000000-0000-4000-8000-0000000000f1")

    report = catch_up(ingress)

    assert report.missed == [MISSED] and len(report.recovered) == 1
    assert recorded_hook(ingress) == "123"
    assert logs_read(github) == {OURS}


def test_a_replay_naming_another_numeric_hook_does_not_redirect_the_catch_up(
    ingress: Ingress, github: FakeGitHub
):
    captured = genuine(ingress)
    replay(ingress, captured, hook_id="456", guid="00000000-0000-4000-8000-0000000000f2")

    report = catch_up(ingress)

    # Hook 456's log was listed (it is a candidate) and found to hold nothing of
    # the source's: nothing of it is stored, and our hook is read and recorded.
    assert report.missed == [MISSED]
    assert OTHER_HOOKS not in stored_ids(ingress)
    assert recorded_hook(ingress) == "123"

    # Confirmed: a later forged header is not even asked about.
    replay(ingress, captured, hook_id="456", guid="00000000-0000-4000-8000-0000000000f3")
    github.requests.clear()
    catch_up(ingress)
    assert logs_read(github) == {OURS}
    assert OTHER_HOOKS not in stored_ids(ingress)


def test_a_hook_no_log_confirms_is_a_failed_run_that_says_what_to_set(
    ingress: Ingress, github: FakeGitHub
):
    # The only deliveries name hooks whose logs hold nothing the source was sent.
    body = json.dumps(issue_opened(9)).encode()
    post(
        ingress,
        body,
        github_headers("issues__opened", body, GITHUB_SECRET, **{"X-GitHub-Hook-ID": "456"}),
    )
    post(
        ingress,
        body,
        github_headers("issues__opened", body, GITHUB_SECRET, **{"X-GitHub-Hook-ID": "789"}),
    )

    with pytest.raises(InvalidSource, match="--hook-id ID"):
        catch_up(ingress)

    assert OTHER_HOOKS not in stored_ids(ingress) and recorded_hook(ingress) is None
    with session_scope(ingress.store.sessions) as session:
        (failed,) = session.scalars(select(CatchUpRun)).all()
        assert failed.covered_until is None and "no hook its deliveries named" in failed.error


def test_a_non_numeric_stored_hook_id_never_reaches_a_url(ingress: Ingress, github: FakeGitHub):
    with session_scope(ingress.store.sessions) as session:
        session.scalars(select(CatchUpSource)).one().hook_id = "../../x"
    with session_scope(ingress.store.sessions) as session, pytest.raises(InvalidSource):
        log_settings(session=session, slug="acme-github")
    with pytest.raises(InvalidSource):
        catch_up(ingress)
    assert github.requests == []


def test_a_token_no_candidate_log_accepts_is_reported_as_the_bad_token(
    ingress: Ingress, github: FakeGitHub
):
    genuine(ingress)
    with session_scope(ingress.store.sessions) as session:
        set_log_access(
            session=session,
            slug="acme-github",
            target="repos/acme/widgets",
            token="ghp_wrong",
            api_base_url=github.base_url,
        )

    with pytest.raises(BadCredentials):
        catch_up(ingress)
    assert recorded_hook(ingress) is None


def test_a_dry_run_confirms_the_hook_but_records_nothing(ingress: Ingress, github: FakeGitHub):
    genuine(ingress)

    report = catch_up_github(
        sessions=ingress.store.sessions, slug="acme-github", send=lambda _: None, dry_run=True
    )

    assert report.missed == [MISSED] and recorded_hook(ingress) is None


def test_the_cli_names_hook_id_when_no_log_confirms_a_hook_and_survives_hook_x(
    ingress: Ingress, github: FakeGitHub
):
    store, command = ingress.store, ("catch-up", "github", "--source", "acme-github", "--dry-run")
    body = json.dumps(issue_opened(9)).encode()
    forged = github_headers("issues__opened", body, GITHUB_SECRET, **{"X-GitHub-Hook-ID": "456"})
    post(ingress, body, forged)

    line = refused(taskhook(store, *command))
    assert "no hook its deliveries named (456)" in line and "--hook-id ID" in line

    replay(ingress, genuine(ingress), hook_id="x", guid="00000000-0000-4000-8000-0000000000f4")
    result = taskhook(store, *command)
    assert result.exit_code == 0, result.output
    assert "Missed creates 1" in " ".join(result.output.split())
