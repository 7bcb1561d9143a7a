"""read_delivery: what the ingress keeps about the task a body describes."""

from __future__ import annotations

import json

import pytest

from models.intake import NOTHING_READ, read_delivery
from models.providers import PROVIDERS
from models.tasks import MAX_TITLE_LENGTH, SourceLink
from tests.support.deliveries import fixture

SITE = "https://acme.atlassian.net"


@pytest.mark.parametrize(
    ("provider", "name", "event", "expected"),
    [
        ("github", "issues__opened", "issues.opened", "gh-issue/Codertocat/Hello-World#1"),
        ("github", "pull_request__opened", "pull_request.opened", "gh-pr/Codertocat/Hello-World#2"),
        ("jira", "jira_issue_created__cloud", "jira:issue_created", "jira:TES-41"),
    ],
)
def test_it_is_the_task_the_worker_would_read(provider, name, event, expected):
    payload = json.loads(fixture(provider, name))
    adapter = PROVIDERS[provider]
    draft = adapter.to_draft(event, payload, site=SITE)

    reading = read_delivery(adapter, event, payload, SITE)

    assert reading.external_id == expected == draft.external_id
    assert reading.task is not None
    assert (reading.task.title, reading.task.description) == (draft.title, draft.description)
    assert reading.task.external_id == expected
    assert reading.task.source == SourceLink(draft.provider, draft.url, draft.remote_key)


def test_a_body_that_names_none_the_worker_could_use_reads_nothing():
    github = PROVIDERS["github"]
    opened = json.loads(fixture("github", "issues__opened"))
    assert read_delivery(github, "issues.opened", {"action": "opened"}, None) == NOTHING_READ
    assert read_delivery(github, "issues.closed", opened, None) == NOTHING_READ


def test_a_malformed_identity_reads_nothing_not_an_error():
    payload = json.loads(fixture("jira", "jira_issue_created__cloud"))
    payload["issue"]["key"] = "TES-\x0041"
    assert read_delivery(PROVIDERS["jira"], "jira:issue_created", payload, None) == NOTHING_READ


def test_a_task_the_store_would_refuse_keeps_the_identity_and_no_task(monkeypatch):
    # The adapters cut titles to what the store accepts; were one not to, the
    # worker must read the body itself and say why the task cannot be made.
    jira = PROVIDERS["jira"]
    payload = json.loads(fixture("jira", "jira_issue_created__cloud"))
    draft = jira.to_draft("jira:issue_created", payload, site=SITE)
    too_long = type(draft)(**{**draft.__dict__, "title": "x" * (MAX_TITLE_LENGTH + 1)})
    monkeypatch.setattr(jira, "to_draft", lambda *_args, **_kwargs: too_long)

    reading = read_delivery(jira, "jira:issue_created", payload, SITE)

    assert (reading.external_id, reading.task) == ("jira:TES-41", None)


def test_a_link_no_database_can_store_keeps_the_identity_and_no_task(monkeypatch):
    jira = PROVIDERS["jira"]
    payload = json.loads(fixture("jira", "jira_issue_created__cloud"))
    draft = jira.to_draft("jira:issue_created", payload, site=SITE)
    unstorable = type(draft)(**{**draft.__dict__, "remote_key": "TES-41\x00"})
    monkeypatch.setattr(jira, "to_draft", lambda *_args, **_kwargs: unstorable)

    reading = read_delivery(jira, "jira:issue_created", payload, SITE)

    assert (reading.external_id, reading.task) == ("jira:TES-41", None)
