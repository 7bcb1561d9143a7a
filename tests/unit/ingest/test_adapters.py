"""named_identity: the identity the ingress keeps for the worker's claim."""

from __future__ import annotations

import json

import pytest

from ingest.adapters import ADAPTERS, named_identity
from tests.deliveries import fixture


@pytest.mark.parametrize(
    ("provider", "name", "event", "expected"),
    [
        ("github", "issues__opened", "issues.opened", "gh-issue/Codertocat/Hello-World#1"),
        ("github", "pull_request__opened", "pull_request.opened", "gh-pr/Codertocat/Hello-World#2"),
        ("jira", "jira_issue_created__cloud", "jira:issue_created", "jira:TES-41"),
    ],
)
def test_it_is_the_external_id_the_worker_reads(provider, name, event, expected):
    payload = json.loads(fixture(provider, name))
    adapter = ADAPTERS[provider]

    assert named_identity(adapter, event, payload, "https://acme.atlassian.net") == expected
    assert adapter.to_draft(event, payload, site="https://acme.atlassian.net").external_id == (
        expected
    )


def test_a_body_that_names_none_the_worker_could_use_is_none():
    github = ADAPTERS["github"]
    assert named_identity(github, "issues.opened", {"action": "opened"}, None) is None
    assert (
        named_identity(
            github, "issues.closed", json.loads(fixture("github", "issues__opened")), None
        )
        is None
    )


def test_a_malformed_identity_is_none_not_an_error():
    payload = json.loads(fixture("jira", "jira_issue_created__cloud"))
    payload["issue"]["key"] = "TES-\x0041"
    assert named_identity(ADAPTERS["jira"], "jira:issue_created", payload, None) is None
