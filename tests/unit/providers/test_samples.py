"""``Provider.sample_headers`` and ``with_sent_at``: a sample delivery each
provider dresses is one the same provider reads back as sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.providers import PROVIDERS, Provider

FIXTURES = Path(__file__).parents[2] / "fixtures"
SECRET = "sample-secret"

#: A fixture of each provider, with the event it is a delivery of.
SAMPLES = [
    ("github", "issues__opened", "issues.opened"),
    ("github", "pull_request__opened", "pull_request.opened"),
    ("github", "ping__basic", "ping"),
    ("jira", "jira_issue_created__cloud", "jira:issue_created"),
    ("jira", "comment_created__cloud_compact", "comment_created"),
    ("gitlab", "issue_hook__open", "Issue Hook.open"),
    ("gitlab", "push_hook__two_commits", "Push Hook"),
]
ids = [f"{provider}:{name}" for provider, name, _ in SAMPLES]


def recorded(provider: str, name: str) -> bytes:
    return (FIXTURES / provider / f"{name}.json").read_bytes()


@pytest.mark.parametrize(("provider_name", "name", "event"), SAMPLES, ids=ids)
def test_a_dressed_sample_verifies_and_reads_back_its_event_and_delivery_id(
    provider_name: str, name: str, event: str
):
    provider = PROVIDERS[provider_name]
    body = recorded(provider_name, name)
    headers = provider.sample_headers(body, SECRET, event=event, delivery_id="sample-42")

    assert provider.verify(body, headers, [SECRET])
    assert not provider.verify(body, headers, ["another secret"])
    assert provider.delivery_id(headers, body) == "sample-42"
    payload = provider.decode_body(headers["Content-Type"], body)
    assert provider.event_of(headers, payload) == event


@pytest.mark.parametrize("provider_name", ["github", "jira"])
def test_a_signed_sample_proves_its_own_body_only(provider_name: str):
    provider = PROVIDERS[provider_name]
    body = b'{"action": "opened"}'
    headers = provider.sample_headers(body, SECRET, event="issues.opened")
    assert not provider.verify(body + b" ", headers, [SECRET])


@pytest.mark.parametrize("provider_name", sorted(PROVIDERS))
def test_each_sample_gets_a_fresh_delivery_id_unless_given_one(provider_name: str):
    provider = PROVIDERS[provider_name]
    body = b"{}"
    first, second = (
        provider.delivery_id(provider.sample_headers(body, SECRET, event="issues"), body)
        for _ in range(2)
    )
    assert first and second and first != second
    if provider_name == "jira":
        assert first.isdigit()  # Jira Cloud's identifiers are numbers


@pytest.mark.parametrize("provider_name", ["github", "gitlab"])
def test_a_provider_with_an_event_header_needs_the_event(provider_name: str):
    with pytest.raises(ValueError, match="event"):
        PROVIDERS[provider_name].sample_headers(b"{}", SECRET)


def test_a_jira_sample_says_when_it_was_sent_and_keeps_its_other_bytes():
    jira: Provider = PROVIDERS["jira"]
    body = recorded("jira", "jira_issue_created__cloud")
    recorded_at = jira.sent_at(json.loads(body))
    assert recorded_at is not None

    sent = jira.with_sent_at(body, 1_750_000_000.123)

    assert jira.sent_at(json.loads(sent)) == pytest.approx(1_750_000_000.123)
    assert jira.with_sent_at(sent, recorded_at) == body


@pytest.mark.parametrize(
    ("provider_name", "name"), [("github", "issues__opened"), ("gitlab", "issue_hook__open")]
)
def test_a_body_that_does_not_say_when_it_was_sent_is_left_as_it_is(provider_name, name):
    body = recorded(provider_name, name)
    assert PROVIDERS[provider_name].with_sent_at(body, 1_750_000_000.0) == body
