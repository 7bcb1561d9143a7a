"""The Celery side: the app's at-least-once configuration, and the task bodies run
eagerly against the ``store`` fixture (SQLite and PostgreSQL)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from celery import Celery
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import select, update

# Importing the task modules registers their shared tasks with every app.
import worker.catchup.tasks
import worker.operator
import worker.tasks  # noqa: F401
from bench.fakes.github_api import FakeGitHub
from bench.fakes.gitlab_api import FakeGitLab
from bench.fakes.jira_api import FakeJira
from models.broker.messages import (
    BACKGROUND_QUEUE,
    CATCH_UP,
    DELIVERIES_QUEUE,
    IDEMPOTENCY_KEY_HEADER,
    OPERATOR_QUEUE,
    PROCESS_DELIVERIES,
    PROCESS_DELIVERY,
    PRUNE,
    RELEASE_IDENTITY,
    SWEEP,
)
from models.catchup import set_app_access, set_gitlab_access, set_jira_access, set_log_access
from models.db import session_scope
from models.settings import Settings
from models.sources import add_source
from models.tables import CatchUpRun, CatchUpSource
from models.tasks import delete_task
from tests.support.feeds import delivery, make_feed, store_fixture, tasks_of
from tests.support.stores import TRUSTED, Store
from worker import runtime
from worker.celery_app import make_celery_app
from worker.operator import NO_EXPECTED_HOLDER

SETTINGS = Settings(
    broker_url="memory://",
    result_backend_url="cache+memory://",
    task_time_limit_seconds=10,
    lease_seconds=30,
)


@pytest.fixture
def eager(store: Store) -> Iterator[Celery]:
    app = make_celery_app(SETTINGS)
    app.conf.task_always_eager = True
    runtime.use(sessions=store.sessions, settings=store.worker_settings(SETTINGS))
    try:
        yield app
    finally:
        runtime.reset()


def test_the_app_is_configured_for_at_least_once_delivery():
    settings = Settings(
        broker_url="redis://127.0.0.1:6379/9",
        task_time_limit_seconds=60,
        lease_seconds=90,
        sweep_interval_seconds=15,
    )
    conf = make_celery_app(settings).conf

    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_time_limit == 60 and 0 < conf.task_soft_time_limit < 60
    assert conf.task_serializer == "json" and conf.accept_content == ["json"]
    assert conf.broker_transport_options["visibility_timeout"] > conf.task_time_limit
    assert conf.broker_connection_retry_on_startup is True
    assert (conf.worker_pool, conf.worker_concurrency) == ("threads", settings.worker_concurrency)
    assert conf.broker_url == settings.broker_url
    assert conf.result_backend == settings.broker_url
    assert conf.task_routes[PROCESS_DELIVERY] == {"queue": DELIVERIES_QUEUE}
    assert conf.task_routes[PROCESS_DELIVERIES] == {"queue": DELIVERIES_QUEUE}
    assert conf.task_routes[SWEEP] == {"queue": DELIVERIES_QUEUE}
    assert conf.task_routes[RELEASE_IDENTITY] == {"queue": OPERATOR_QUEUE}
    assert conf.task_routes[CATCH_UP] == {"queue": OPERATOR_QUEUE}
    schedule = {entry["task"]: entry["schedule"] for entry in conf.beat_schedule.values()}
    assert schedule == {SWEEP: 15, CATCH_UP: 3600, PRUNE: 3600}


def test_catch_up_is_off_the_beat_schedule_at_interval_zero():
    conf = make_celery_app(Settings(broker_url="memory://", catchup_interval_seconds=0)).conf
    assert [entry["task"] for entry in conf.beat_schedule.values()] == [SWEEP, PRUNE]


def test_the_worker_registers_its_tasks_by_their_message_names():
    app = make_celery_app(SETTINGS)
    app.loader.import_default_modules()
    assert {PROCESS_DELIVERY, PROCESS_DELIVERIES, SWEEP, RELEASE_IDENTITY, CATCH_UP} <= set(
        app.tasks
    )
    assert app.tasks[RELEASE_IDENTITY].ignore_result is False
    assert app.conf.task_ignore_result is True


def test_the_delivery_task_turns_a_delivery_into_its_task(eager: Celery, store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")

    answer = eager.tasks[PROCESS_DELIVERY].apply(args=[pk]).get()

    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert answer == {
        "delivery": pk,
        "status": "done",
        "outcome": "created",
        "task_id": task.id,
        "reason": None,
        "retry_in": None,
    }
    assert eager.tasks[PROCESS_DELIVERY].apply(args=[pk]).get()["status"] is None


def test_the_batch_task_turns_each_delivery_into_its_task(eager: Celery, store: Store):
    feed = make_feed(store.sessions)
    pks = [
        store_fixture(store.sessions, feed, "github", "issues__opened"),
        store_fixture(store.sessions, feed, "github", "pull_request__opened"),
        store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud"),
    ]

    answer = eager.tasks[PROCESS_DELIVERIES].apply(args=[pks]).get()

    assert answer == {"done": 3}
    tasks = tasks_of(store.sessions, feed.workspace_id)
    assert [t.created_by_delivery for t in tasks] == pks
    assert [delivery(store.sessions, pk).outcome for pk in pks] == ["created"] * 3
    # Sent again (the sweeper, a redelivery), the keys find their rows finished.
    assert eager.tasks[PROCESS_DELIVERIES].apply(args=[pks]).get() == {"not_recorded": 3}


@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")
def test_a_delivery_of_a_batch_that_must_wait_is_sent_again_on_its_own(eager: Celery, store: Store):
    feed = make_feed(store.sessions, intake_wip_limit=1)
    admitted = store_fixture(store.sessions, feed, "github", "issues__opened")
    waiting = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")

    answer = eager.tasks[PROCESS_DELIVERIES].apply(args=[[admitted, waiting]]).get()

    assert answer == {"done": 1, "processing": 1}
    with eager.connection_for_read() as connection:
        message = connection.SimpleQueue(DELIVERIES_QUEUE).get(timeout=5)
        message.ack()
    assert (message.headers["task"], message.payload[0]) == (PROCESS_DELIVERY, [waiting])
    assert message.headers["retries"] == 1 and message.headers["eta"] is not None
    assert delivery(store.sessions, waiting).status == "processing"  # its lease held till then


@pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")
def test_the_sweep_task_sends_what_it_finds(eager: Celery, store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "github", "issues__opened")
    runtime.use(
        sessions=store.sessions,
        settings=SETTINGS.model_copy(update={"queued_grace_seconds": 0.000001}),
    )

    assert eager.tasks[SWEEP].apply().get() == {"sent": 1}

    with eager.connection_for_read() as connection:
        message = connection.SimpleQueue(BACKGROUND_QUEUE).get(timeout=5)
        message.ack()
    assert message.headers["task"] == PROCESS_DELIVERY
    assert message.payload[0] == [pk]


def test_the_catch_up_task_catches_up_each_source_and_a_failing_one_holds_up_no_other(
    eager: Celery, store: Store
):
    workspace = store.workspace()
    with FakeGitHub(token="ghp_beat") as github, FakeJira(api_token="jira-beat") as jira:
        for number in (1, 2):
            github.log_delivery(
                hook="repos/acme/widgets/hooks/9",
                event="issues",
                action="opened",
                payload={
                    "action": "opened",
                    "issue": {
                        "number": number,
                        "title": f"Missed {number}",
                        "html_url": f"https://github.com/acme/widgets/issues/{number}",
                    },
                    "repository": {"full_name": "acme/widgets"},
                },
                status_code=0,
            )
        jira.create_issue(summary="Missed on Jira")
        with session_scope(store.sessions) as session:
            for provider, slug, site in (
                ("jira", "a-jira", jira.base_url),  # first: its failure must not stop the other
                ("github", "b-github", None),
            ):
                add_source(
                    session=session,
                    provider=provider,
                    workspace_id=workspace.id,
                    slug=slug,
                    secret="s",
                    create_events=["jira:issue_created" if site else "issues.opened"],
                    site_url=site,
                )
            set_jira_access(
                session=session, slug="a-jira", token="jira-wrong-token", email="ops@example.com"
            )
            set_log_access(
                session=session,
                slug="b-github",
                target="repos/acme/widgets",
                hook_id="9",
                token="ghp_beat",
                api_base_url=github.base_url,
            )

        done = eager.tasks[CATCH_UP].apply().get()

    assert done["b-github"] == {"missed": 2, "recovered": 2}
    assert (
        "Jira rejected" in done["a-jira"]["error"]
        and "jira-wrong-token" not in done["a-jira"]["error"]
    )
    # Sent, for a worker to make the tasks: the two, stored together, in one message.
    with eager.connection_for_read() as connection:
        message = connection.SimpleQueue(BACKGROUND_QUEUE).get(timeout=5)
        message.ack()
    assert message.headers["task"] == PROCESS_DELIVERIES
    assert len(message.payload[0][0]) == 2
    assert tasks_of(store.sessions, workspace.id) == []


def test_a_source_whose_catch_up_raises_anything_stops_no_later_source(eager: Celery, store: Store):
    workspace = store.workspace()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()
    with FakeGitHub(token="ghp_beat") as github:
        github.log_delivery(
            hook="repos/acme/widgets/hooks/9",
            event="issues",
            payload={
                "action": "opened",
                "issue": {
                    "number": 1,
                    "title": "Missed",
                    "html_url": "https://github.com/acme/widgets/issues/1",
                },
                "repository": {"full_name": "acme/widgets"},
            },
            status_code=0,
        )
        with session_scope(store.sessions) as session:
            for slug in ("a-github", "b-github"):
                add_source(
                    session=session,
                    provider="github",
                    workspace_id=workspace.id,
                    slug=slug,
                    secret="s",
                    create_events=["issues.opened"],
                )
            set_app_access(
                session=session,
                slug="a-github",
                app_id="7",
                private_key=pem,
                api_base_url=github.base_url,
            )
            set_log_access(
                session=session,
                slug="b-github",
                target="repos/acme/widgets",
                hook_id="9",
                token="ghp_beat",
                api_base_url=github.base_url,
            )
            # A row no command writes: its run raises what no catch-up expects.
            session.execute(
                update(CatchUpSource).where(CatchUpSource.app_id == "7").values(app_id="x")
            )

        done = eager.tasks[CATCH_UP].apply().get()

    assert done["a-github"]["error"].startswith("ValueError")
    assert done["b-github"] == {"missed": 1, "recovered": 1}
    with session_scope(store.sessions) as session:
        failed = session.scalars(select(CatchUpRun).where(CatchUpRun.error.is_not(None))).one()
        assert failed.covered_until is None and "ValueError" in failed.error
    with eager.connection_for_read() as connection:
        connection.SimpleQueue(BACKGROUND_QUEUE).get(timeout=5).ack()


def test_the_catch_up_task_catches_up_a_gitlab_source_with_gitlabs_own_catch_up(
    eager: Celery, store: Store
):
    workspace = store.workspace()
    with FakeGitLab(token="glpat-beat") as gitlab:
        gitlab.add_project("acme/widgets")
        gitlab.create_issue("acme/widgets")
        with session_scope(store.sessions) as session:
            add_source(
                session=session,
                provider="gitlab",
                workspace_id=workspace.id,
                slug="c-gitlab",
                secret="s",
                create_events=["Issue Hook.open"],
            )
            set_gitlab_access(
                session=session,
                slug="c-gitlab",
                owner="projects/acme/widgets",
                token="glpat-beat",
                site_url=gitlab.base_url,
            )

        done = eager.tasks[CATCH_UP].apply().get()

    assert done["c-gitlab"] == {"missed": 1, "recovered": 1}
    with eager.connection_for_read() as connection:
        connection.SimpleQueue(BACKGROUND_QUEUE).get(timeout=5).ack()


def test_release_frees_the_identity_and_writes_the_audit_row(eager: Celery, store: Store):
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    eager.tasks[PROCESS_DELIVERY].apply(args=[pk]).get()
    (task,) = tasks_of(store.sessions, feed.workspace_id)

    answer = (
        eager.tasks[RELEASE_IDENTITY]
        .apply(args=[feed.workspace_id, "jira:TES-41", "alice", "abandoned import", task.id])
        .get()
    )

    assert answer["released"] is True
    assert (answer["task_id"], answer["identifier"], answer["external_id"]) == (
        task.id,
        "ACME-1",
        "jira:TES-41",
    )
    assert store.scalar(
        "SELECT operator || ':' || reason FROM identity_releases WHERE id = :id",
        id=answer["audit_id"],
    ) == ("alice:abandoned import")
    (released,) = tasks_of(store.sessions, feed.workspace_id)
    assert (released.external_id, released.external_id_settled_at) == (None, None)
    assert delivery(store.sessions, pk).status == "done"  # the inbox is left alone


def test_a_release_sent_twice_under_one_key_releases_once(eager: Celery, store: Store):
    # The key rides in a header (a 0.1.0 worker passes over it; docs/deploy.md).
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    eager.tasks[PROCESS_DELIVERY].apply(args=[pk]).get()
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    args = [feed.workspace_id, "jira:TES-41", "alice", "abandoned import", task.id]
    headers = {IDEMPOTENCY_KEY_HEADER: "k-release-1"}

    first, again = (
        eager.tasks[RELEASE_IDENTITY].apply(args=args, headers=headers).get() for _ in range(2)
    )

    assert (first["replayed"], again["replayed"]) == (False, True)
    assert first["audit_id"] == again["audit_id"]
    assert store.scalar("SELECT count(*) FROM identity_releases") == 1


def test_a_queued_release_frees_only_the_holder_the_operator_saw(eager: Celery, store: Store):
    feed = make_feed(store.sessions)
    first = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    eager.tasks[PROCESS_DELIVERY].apply(args=[first]).get()
    (shown,) = tasks_of(store.sessions, feed.workspace_id)
    # While the request waits in the operator queue: the task shown is
    # deleted, and a new delivery for the issue makes a new holder.
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=TRUSTED, task_id=shown.id)
    second = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    eager.tasks[PROCESS_DELIVERY].apply(args=[second]).get()
    (holder,) = tasks_of(store.sessions, feed.workspace_id)

    answer = (
        eager.tasks[RELEASE_IDENTITY]
        .apply(args=[feed.workspace_id, "jira:TES-41", "alice", "abandoned", shown.id])
        .get()
    )

    assert answer["released"] is False and answer["holder_changed"] is True
    assert (answer["current_task_id"], answer["current_identifier"]) == (holder.id, "ACME-2")
    assert "nothing was released" in answer["error"]
    (still,) = tasks_of(store.sessions, feed.workspace_id)
    assert (still.id, still.external_id) == (holder.id, "jira:TES-41")
    assert store.scalar("SELECT count(*) FROM identity_releases") == 0

    matching = (
        eager.tasks[RELEASE_IDENTITY]
        .apply(args=[feed.workspace_id, "jira:TES-41", "alice", "abandoned", holder.id])
        .get()
    )
    assert matching["released"] is True
    assert (matching["task_id"], matching["expected_task_id"]) == (holder.id, holder.id)
    assert store.scalar("SELECT task_id || '/' || expected_task_id FROM identity_releases") == (
        f"{holder.id}/{holder.id}"
    )


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ((1, "jira:NOPE-1", "alice", "why"), "no task in workspace 1 holds"),
        ((1, "bad\nid", "alice", "why"), "control character"),
        ((1, "   ", "alice", "why"), "external_id is required"),
        ((1, "jira:TES-41", "alice", "  "), "must give a reason"),
        ((1, "jira:TES-41", "", "why"), "must name its operator"),
        ((1, "jira:TES-41", None, None), "must name its operator"),
        (("1", "jira:TES-41", "alice", "why"), "workspace_id must be an integer"),
        ((1, "jira:TES-41", "alice", 7), "reason must be text"),
        ((1, "jira:TES-41", "alice", "r" * 1001), "at most 1000 characters"),
        ((1, "jira:TES-41", "alice", "one\ntwo"), "control characters"),
        ((1, "jira:TES-41", "alice", "why", "7"), "expected_task_id must be an integer"),
    ],
)
def test_a_release_mistake_is_answered_never_raised(eager: Celery, store: Store, arguments, error):
    feed = make_feed(store.sessions)
    assert feed.workspace_id == 1
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    eager.tasks[PROCESS_DELIVERY].apply(args=[pk]).get()
    (held,) = tasks_of(store.sessions, feed.workspace_id)
    # The holder the CLI would have shown, unless the case names another.
    arguments = arguments if len(arguments) == 5 else (*arguments, held.id)

    answer = eager.tasks[RELEASE_IDENTITY].apply(args=list(arguments)).get()

    assert answer["released"] is False
    assert error in answer["error"]
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert task.external_id == "jira:TES-41"
    assert store.scalar("SELECT count(*) FROM identity_releases") == 0


def test_a_release_message_without_an_expected_holder_is_refused_and_changes_nothing(
    eager: Celery, store: Store, caplog: pytest.LogCaptureFixture
):
    """The four arguments an older CLI queued: whatever task holds the
    identity when it runs, nothing is released."""
    feed = make_feed(store.sessions)
    pk = store_fixture(store.sessions, feed, "jira", "jira_issue_created__cloud")
    eager.tasks[PROCESS_DELIVERY].apply(args=[pk]).get()
    events_before = store.scalar("SELECT count(*) FROM task_events")

    with caplog.at_level(logging.WARNING, logger="worker.operator"):
        answer = (
            eager.tasks[RELEASE_IDENTITY]
            .apply(args=[feed.workspace_id, "jira:TES-41", "alice", "abandoned"])
            .get()
        )

    assert answer == {
        "released": False,
        "error": NO_EXPECTED_HOLDER,
        "expected_holder_missing": True,
    }
    assert "names no expected holder" in answer["error"]
    assert "nothing was released" in answer["error"]
    (refusal,) = [r for r in caplog.records if r.name == "worker.operator"]
    assert "'jira:TES-41'" in refusal.getMessage()
    assert "names no expected holder" in refusal.getMessage()
    (task,) = tasks_of(store.sessions, feed.workspace_id)
    assert (task.external_id, task.external_id_settled_at is not None) == ("jira:TES-41", True)
    assert store.scalar("SELECT count(*) FROM identity_releases") == 0
    assert store.scalar("SELECT count(*) FROM task_events") == events_before


def test_each_task_lives_in_its_module():
    app = make_celery_app(SETTINGS)
    app.loader.import_default_modules()
    assert app.tasks[RELEASE_IDENTITY].run.__module__ == "worker.operator"
    assert app.tasks[PROCESS_DELIVERY].run.__module__ == "worker.tasks"
    assert app.tasks[SWEEP].run.__module__ == "worker.tasks"
