"""``taskhook source``: add, list, disable and enable, rotate a secret -- and
secrets shown once, never again."""

from __future__ import annotations

import json

from models.broker.lanes import SourceLane
from models.broker.messages import BACKGROUND_QUEUE, PROCESS_DELIVERY
from models.sources import verifying_source
from tests.support.cli import PUBLIC_URL, as_json, refused, taskhook
from tests.support.scenarios import SECRET, a_delivery, a_source
from tests.support.stores import Store


def test_source_add_prints_the_url_and_a_generated_secret_once(store: Store):
    store.workspace()

    result = taskhook(store, "source", "add", "github", "--workspace", "acme")

    assert result.exit_code == 0
    assert f"{PUBLIC_URL}/webhooks/github/acme-github" in result.stdout
    assert "will not be shown again" in result.stdout
    (secret_line,) = [line for line in result.stdout.splitlines() if line.startswith("Secret:")]
    printed = secret_line.split()[-1]
    with store.sessions() as session:
        source = verifying_source(session=session, provider="github", slug="acme-github")
    assert source.secrets == (printed,)
    assert source.create_events == {"issues.opened", "pull_request.opened"}
    assert printed not in taskhook(store, "source", "list").output
    assert printed not in taskhook(store, "source", "list", "--json").output


def test_a_given_secret_is_never_printed(store: Store):
    store.workspace()
    given = "s3cret-from-the-vault"

    result = taskhook(
        store,
        "source",
        "add",
        "jira",
        "--workspace",
        "acme",
        "--secret",
        given,
        "--site",
        "https://acme.atlassian.net/",
        "--name",
        "acme-jira",
    )
    document = as_json(
        taskhook(
            store, "source", "add", "github", "--workspace", "acme", "--secret", given, "--json"
        )
    )

    assert result.exit_code == 0
    assert given not in result.output
    assert "secret" not in document
    assert document["url"] == f"{PUBLIC_URL}/webhooks/github/acme-github"
    with store.sessions() as session:
        jira = verifying_source(session=session, provider="jira", slug="acme-jira")
    assert (jira.secrets, jira.site_url, jira.create_events) == (
        (given,),
        "https://acme.atlassian.net",
        {"jira:issue_created"},
    )


def test_source_add_for_scripts_carries_a_generated_secret(store: Store):
    store.workspace()
    document = as_json(taskhook(store, "source", "add", "jira", "--workspace", "acme", "--json"))
    with store.sessions() as session:
        jira = verifying_source(session=session, provider="jira", slug="acme-jira")
    assert jira.secrets == (document["secret"],)
    assert document["events"] == ["jira:issue_created"]


def test_source_events_are_validated_against_the_adapter(store: Store):
    store.workspace()
    unknown = taskhook(
        store, "source", "add", "jira", "--workspace", "acme", "--events", "issues.opened"
    )
    chosen = taskhook(
        store,
        "source",
        "add",
        "github",
        "--workspace",
        "acme",
        "--events",
        "issues.opened, issues.reopened",
    )

    assert unknown.exit_code == 2
    assert "jira:issue_created" in unknown.stderr
    assert chosen.exit_code == 0
    with store.sessions() as session:
        github = verifying_source(session=session, provider="github", slug="acme-github")
    assert github.create_events == {"issues.opened", "issues.reopened"}


def test_source_add_mistakes(store: Store):
    store.workspace()
    no_workspace = refused(taskhook(store, "source", "add", "github", "--workspace", "nope"))
    site_on_github = taskhook(
        store, "source", "add", "github", "--workspace", "acme", "--site", "https://x.example"
    )
    bad_site = taskhook(store, "source", "add", "jira", "--workspace", "acme", "--site", "acme")
    unknown_provider = taskhook(store, "source", "add", "bitbucket", "--workspace", "acme")
    taskhook(store, "source", "add", "github", "--workspace", "acme")
    duplicate = refused(taskhook(store, "source", "add", "github", "--workspace", "acme"))

    assert no_workspace == "Error: workspace 'nope' not found"
    assert (site_on_github.exit_code, bad_site.exit_code, unknown_provider.exit_code) == (2, 2, 2)
    assert duplicate == "Error: a source named 'acme-github' already exists"
    assert store.scalar("SELECT count(*) FROM webhook_sources") == 1


def test_source_list_shows_active_secret_counts_never_secrets(store: Store):
    a_source(store, store.workspace().id)
    taskhook(store, "source", "rotate-secret", "acme-github")

    table = taskhook(store, "source", "list")
    listed = as_json(taskhook(store, "source", "list", "--json"))["sources"]

    assert table.stdout.splitlines()[0].split() == [
        "NAME",
        "PROVIDER",
        "WORKSPACE",
        "ENABLED",
        "LANE",
        "SECRETS",
        "EVENTS",
        "URL",
    ]
    assert table.stdout.splitlines()[1].split()[:6] == [
        "acme-github",
        "github",
        "acme",
        "yes",
        "auto",
        "2",
    ]
    assert SECRET not in table.output + json.dumps(listed)
    assert [(s["slug"], s["active_secrets"], s["url"]) for s in listed] == [
        ("acme-github", 2, f"{PUBLIC_URL}/webhooks/github/acme-github")
    ]


def test_a_source_disables_and_enables(store: Store):
    a_source(store, store.workspace().id)

    assert taskhook(store, "source", "disable", "acme-github").exit_code == 0
    with store.sessions() as session:
        assert verifying_source(session=session, provider="github", slug="acme-github") is None
    assert taskhook(store, "source", "enable", "acme-github").exit_code == 0
    with store.sessions() as session:
        assert verifying_source(session=session, provider="github", slug="acme-github")
    line = refused(taskhook(store, "source", "disable", "nope"))
    assert line == "Error: no webhook source named 'nope'"


def test_rotating_a_secret_keeps_the_old_one_until_finish(store: Store):
    a_source(store, store.workspace().id)

    started = taskhook(store, "source", "rotate-secret", "acme-github", "--secret", "new-one")
    with store.sessions() as session:
        during = verifying_source(session=session, provider="github", slug="acme-github")
    finished = as_json(
        taskhook(store, "source", "rotate-secret", "acme-github", "--finish", "--json")
    )
    with store.sessions() as session:
        after = verifying_source(session=session, provider="github", slug="acme-github")

    assert started.exit_code == 0
    assert "new-one" not in started.output
    assert sorted(during.secrets) == sorted([SECRET, "new-one"])
    assert finished == {"source": "acme-github", "retired": 1, "replayed": False}
    assert after.secrets == ("new-one",)


def test_a_generated_rotation_secret_is_printed_once_and_verifies(store: Store):
    a_source(store, store.workspace().id)
    document = as_json(taskhook(store, "source", "rotate-secret", "acme-github", "--json"))
    with store.sessions() as session:
        source = verifying_source(session=session, provider="github", slug="acme-github")
    assert document["secret"] in source.secrets


def test_rotate_secret_mistakes(store: Store):
    a_source(store, store.workspace().id)
    both = taskhook(store, "source", "rotate-secret", "acme-github", "--finish", "--secret", "x")
    assert both.exit_code == 2
    assert refused(taskhook(store, "source", "rotate-secret", "nope")).endswith("'nope'")


# --- a storm: pause, resume, lane ---------------------------------------------------------


def test_pausing_holds_a_source_and_resuming_sends_what_waited_on_the_background_lane(
    store: Store, celery
):
    source_id = a_source(store, store.workspace().id)
    waiting = [a_delivery(store, source_id, f"storm-{n}") for n in range(3)]

    paused = taskhook(store, "source", "pause", "acme-github")
    assert paused.exit_code == 0, paused.output
    assert paused.stdout.startswith("Source acme-github paused: its deliveries are stored")
    with store.sessions() as session:
        assert verifying_source(session=session, provider="github", slug="acme-github").paused
    # Twice is once: the pause keeps its first time.
    assert as_json(taskhook(store, "source", "pause", "acme-github", "--json")) == {
        "source": "acme-github",
        "paused": True,
    }

    assert taskhook(store, "source", "list").stdout.splitlines()[1].split()[4] == "paused"

    resumed = taskhook(store, "source", "resume", "acme-github")
    assert resumed.exit_code == 0, resumed.output
    assert resumed.stdout == (
        "Source acme-github resumed: 3 waiting deliveries sent on the background lane.\n"
    )
    assert celery.sent == [(PROCESS_DELIVERY, [pk], BACKGROUND_QUEUE) for pk in waiting]
    with store.sessions() as session:
        assert not verifying_source(session=session, provider="github", slug="acme-github").paused
    assert refused(taskhook(store, "source", "resume", "nope")) == (
        "Error: no webhook source named 'nope'"
    )


def test_resuming_while_the_broker_is_down_leaves_the_backlog_to_the_sweeper(store: Store, celery):
    source_id = a_source(store, store.workspace().id)
    a_delivery(store, source_id, "storm-1")
    a_delivery(store, source_id, "storm-2")
    taskhook(store, "source", "pause", "acme-github")
    celery.broker_down = True

    resumed = taskhook(store, "source", "resume", "acme-github")

    assert resumed.exit_code == 0
    assert "2 were not sent: the sweeper sends them" in resumed.stderr
    assert "The broker did not take a message" in resumed.stderr
    with store.sessions() as session:
        assert not verifying_source(session=session, provider="github", slug="acme-github").paused


def test_a_source_is_sent_to_the_background_lane_and_back(store: Store):
    a_source(store, store.workspace().id)

    background = taskhook(store, "source", "lane", "acme-github", "background")
    assert background.exit_code == 0
    assert "now takes the background lane" in background.stdout
    with store.sessions() as session:
        found = verifying_source(session=session, provider="github", slug="acme-github")
    assert found.lane is SourceLane.BACKGROUND
    assert as_json(taskhook(store, "source", "lane", "acme-github", "auto", "--json")) == {
        "source": "acme-github",
        "lane": "auto",
    }
    wrong = taskhook(store, "source", "lane", "acme-github", "fast")
    assert wrong.exit_code == 2
    assert "'fast' is not one of 'auto', 'background'" in wrong.output
