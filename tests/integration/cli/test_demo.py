"""``taskhook demo setup``: the run command's demo workspace."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import select

from models.tables import Delivery, WebhookSource
from tests.support.cli import PUBLIC_URL, as_json, refused, taskhook
from tests.support.processes import Ingress
from tests.support.stores import Store
from worker.cli import cli


def test_demo_setup_for_the_run_command_touches_only_the_embedded_database(store: Store):
    embedded = store.dialect == "sqlite"

    first = as_json(taskhook(store, "demo", "setup", "--embedded-only", "--json"))
    said = taskhook(store, "demo", "setup", "--embedded-only").stdout

    assert first["created"] is embedded
    assert store.scalar("SELECT count(*) FROM workspaces") == (1 if embedded else 0)
    assert store.scalar("SELECT count(*) FROM webhook_sources") == (3 if embedded else 0)
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
        f"{PUBLIC_URL}/webhooks/gitlab/demo-gitlab",
        f"{PUBLIC_URL}/webhooks/jira/demo-jira",
    ]


def test_a_redelivery_needs_a_delivery_to_send_again(store: Store):
    taskhook(store, "demo", "setup")

    result = taskhook(store, "demo", "send", "github", "--redeliver")

    assert refused(result) == (
        "Error: source 'demo-github' has no delivery to send again: send one first"
    )
    assert store.scalar("SELECT count(*) FROM deliveries") == 0


def test_demo_send_gitlab_posts_a_delivery_a_real_ingress_takes(store: Store, tmp_path: Path):
    """The demo's GitLab sample through a real ingress process: taken, a new
    delivery each send, and the same one again answered duplicate."""
    document = as_json(taskhook(store, "demo", "setup", "--json"))
    assert f"{PUBLIC_URL}/webhooks/gitlab/demo-gitlab" in [s["url"] for s in document["sources"]]
    broker = tmp_path / "broker"
    ingress = Ingress(tmp_path, store.url, "filesystem://", TASKHOOK_BROKER_FOLDER=str(broker))
    try:
        runner = CliRunner(
            env={"TASKHOOK_DATABASE_URL": store.url, "TASKHOOK_PUBLIC_URL": ingress.url}
        )
        said = runner.invoke(cli, ["demo", "send", "gitlab"])
        second = runner.invoke(cli, ["demo", "send", "gitlab", "--json"])
        again = runner.invoke(cli, ["demo", "send", "gitlab", "--redeliver", "--json"])
    finally:
        ingress.stop()

    assert said.exit_code == 0, said.output
    assert f"POST {ingress.url}/webhooks/gitlab/demo-gitlab → 202" in said.stdout
    assert "taskhook task lookup --workspace demo 'gl-issue/gitlabhq/gitlab-test#23'" in (
        said.stdout
    )
    assert (json.loads(second.stdout)["status"], json.loads(again.stdout)["status"]) == (202, 202)
    assert json.loads(second.stdout)["answer"]["status"] == "queued"
    assert json.loads(again.stdout)["answer"]["status"] == "duplicate"
    with store.sessions() as session:
        rows = session.execute(
            select(WebhookSource.slug, Delivery.event, Delivery.external_id, Delivery.status)
            .join(WebhookSource, WebhookSource.id == Delivery.source_id)
            .order_by(Delivery.id)
        ).all()
    assert [tuple(row) for row in rows] == [
        ("demo-gitlab", "Issue Hook.open", "gl-issue/gitlabhq/gitlab-test#23", "queued")
    ] * 2
