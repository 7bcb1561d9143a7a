"""``taskhook demo setup``: the run command's demo workspace."""

from __future__ import annotations

from tests.support.cli import PUBLIC_URL, as_json, refused, taskhook
from tests.support.stores import Store


def test_demo_setup_for_the_run_command_touches_only_the_embedded_database(store: Store):
    embedded = store.dialect == "sqlite"

    first = as_json(taskhook(store, "demo", "setup", "--embedded-only", "--json"))
    said = taskhook(store, "demo", "setup", "--embedded-only").stdout

    assert first["created"] is embedded
    assert store.scalar("SELECT count(*) FROM workspaces") == (1 if embedded else 0)
    assert store.scalar("SELECT count(*) FROM webhook_sources") == (2 if embedded else 0)
    if embedded:
        assert "existing workspaces kept" in said
    else:
        assert said.startswith("==> no demo workspace on postgresql+psycopg://")
        assert "ask for one with `taskhook demo setup`" in said


def test_demo_setup_asked_for_by_name_works_on_any_database(store: Store):
    document = as_json(taskhook(store, "demo", "setup", "--json"))

    assert document["created"] is True
    assert [s["url"] for s in document["sources"]] == [
        f"{PUBLIC_URL}/webhooks/github/demo-github",
        f"{PUBLIC_URL}/webhooks/jira/demo-jira",
    ]


def test_a_redelivery_needs_a_delivery_to_send_again(store: Store):
    taskhook(store, "demo", "setup")

    result = taskhook(store, "demo", "send", "github", "--redeliver")

    assert refused(result) == (
        "Error: source 'demo-github' has no delivery to send again: send one first"
    )
    assert store.scalar("SELECT count(*) FROM deliveries") == 0
