"""Values the models would refuse, for every command that takes one: a usage
error (exit 2), caught before anything is stored."""

from __future__ import annotations

import pytest

from tests.support.cli import taskhook, usage_error
from tests.support.scenarios import a_source
from tests.support.stores import Store

#: Every option or argument whose value the models would refuse, by command:
#: each is a usage error (exit 2, as docs/runbook.md says), caught before
#: anything is stored.
INVALID_VALUES = {
    "workspace slug": (("workspace", "add", "Bad Slug", "--name", "A", "--prefix", "A"), "SLUG"),
    "workspace name": (("workspace", "add", "beta", "--name", " ", "--prefix", "A"), "--name"),
    "workspace prefix": (("workspace", "add", "beta", "--name", "A", "--prefix", "a"), "--prefix"),
    "wip limit": (
        ("workspace", "add", "beta", "--name", "A", "--prefix", "A", "--wip-limit", "-1"),
        "--wip-limit",
    ),
    "source name": (("source", "add", "github", "--workspace", "acme", "--name", "A!"), "--name"),
    "source secret": (
        ("source", "add", "github", "--workspace", "acme", "--name", "b", "--secret", " "),
        "--secret",
    ),
    "rotated secret": (("source", "rotate-secret", "acme-github", "--secret", "  "), "--secret"),
    "token name": (("token", "add", "--workspace", "acme", "--name", "a\x01b"), "--name"),
}


@pytest.mark.parametrize("case", sorted(INVALID_VALUES))
def test_an_invalid_value_is_a_usage_error_and_stores_nothing(store: Store, case: str):
    a_source(store, store.workspace().id)  # acme-github
    command, parameter = INVALID_VALUES[case]
    counts = "SELECT (SELECT count(*) FROM workspaces) + (SELECT count(*) FROM webhook_sources)"
    counts += " + (SELECT count(*) FROM source_secrets) + (SELECT count(*) FROM api_tokens)"
    before = store.scalar(counts)

    line = usage_error(taskhook(store, *command))

    assert line.startswith(f"Error: Invalid value for '{parameter}': ")
    assert store.scalar(counts) == before
