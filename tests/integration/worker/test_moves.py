"""One real item, one task, whenever it moves: transfers, Jira moves, GitLab
moves and repository renames, learned from the deliveries that announce them
and from the providers' stable keys (docs/contract.md §15, "Stable keys" and
"The identity ledger"). Bodies are the recorded fixtures, edited only so that
the two sides of one move name the same item. Each case runs on SQLite and
PostgreSQL, on the fast path and the general path.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from models.access import Caller
from models.db import session_scope
from models.identities import task_called
from models.inbox import WEBHOOK_ORIGIN, DeliveryStatus
from models.intake import NOTHING_READ, read_delivery
from models.names import Name
from models.providers import PROVIDERS
from models.sources import add_source
from models.tasks import NewTask, create_task, delete_task
from tests.support.deliveries import fixture
from tests.support.feeds import JIRA_SITE, make_feed, store_delivery, tasks_of
from tests.support.runs import SETTINGS, run
from tests.support.stores import Store
from worker.processing import process_deliveries

SCAN = "scan"
OLD_REPO, NEW_REPO = "octo-org/octo-repo", "Codertocat/Hello-World"


def payload(provider: str, name: str) -> dict[str, Any]:
    return copy.deepcopy(json.loads(fixture(provider, name)))


def deliver(
    store: Store,
    source_id: int,
    provider: str,
    event: str,
    body: dict[str, Any],
    *,
    origin: str = WEBHOOK_ORIGIN,
    site: str | None = None,
) -> int:
    """Store ``body`` as the ingress would: a create with what it reads, a
    move announcement queued with nothing read."""
    reading = NOTHING_READ
    if event not in PROVIDERS[provider].move_events:
        reading = read_delivery(PROVIDERS[provider], event, body, site)
    return store_delivery(
        store.sessions,
        source_id,
        body=json.dumps(body).encode(),
        event=event,
        reading=reading,
        origin=origin,
    )


def twice(store: Store, pk: int):
    """Run the delivery, then as the broker's redelivery of it would."""
    first = run(store, pk)
    run(store, pk)
    return first


def github_opened(repo: str, number: int, repository_id: int) -> dict[str, Any]:
    body = payload("github", "issues__opened")
    body["repository"].update(full_name=repo, id=repository_id, name=repo.split("/")[1])
    body["issue"]["number"] = number
    body["issue"]["html_url"] = f"https://github.com/{repo}/issues/{number}"
    return body


def opened_via_transfer() -> dict[str, Any]:
    return payload("github", "issues__opened_via_transfer")  # OLD_REPO#1 -> NEW_REPO#1


def transferred() -> dict[str, Any]:
    body = payload("github", "issues__transferred")
    body["repository"].update(full_name=OLD_REPO, name=OLD_REPO.split("/")[1])
    return body


def test_a_transfer_announced_at_the_source_first_is_one_task(store: Store):
    feed = make_feed(store.sessions)
    source = feed.github_source_id
    created = twice(
        store, deliver(store, source, "github", "issues.opened", github_opened(OLD_REPO, 1, 7))
    )
    assert created.outcome == "created"

    moved = twice(store, deliver(store, source, "github", "issues.transferred", transferred()))
    opened = twice(store, deliver(store, source, "github", "issues.opened", opened_via_transfer()))

    assert moved.status is DeliveryStatus.IGNORED and "alias" in moved.reason
    assert (opened.outcome, opened.task_id) == ("found_settled", created.task_id)
    assert [t.identifier for t in tasks_of(store.sessions, feed.workspace_id)] == ["ACME-1"]


def test_a_transfer_opened_at_the_destination_first_is_one_task(store: Store):
    feed = make_feed(store.sessions)
    source = feed.github_source_id
    created = run(
        store, deliver(store, source, "github", "issues.opened", github_opened(OLD_REPO, 1, 7))
    )

    opened = twice(store, deliver(store, source, "github", "issues.opened", opened_via_transfer()))
    moved = twice(store, deliver(store, source, "github", "issues.transferred", transferred()))

    assert (opened.outcome, opened.task_id) == ("found_settled", created.task_id)
    assert "already task" in moved.reason
    assert len(tasks_of(store.sessions, feed.workspace_id)) == 1
    with store.sessions() as session:
        assert task_called(session, feed.workspace_id, Name.external(f"gh-issue/{NEW_REPO}#1")) == (
            created.task_id
        )


def test_a_late_create_at_the_source_after_the_transfer_is_found(store: Store):
    feed = make_feed(store.sessions)
    source = feed.github_source_id
    opened = run(store, deliver(store, source, "github", "issues.opened", opened_via_transfer()))
    assert opened.outcome == "created"

    late = run(
        store, deliver(store, source, "github", "issues.opened", github_opened(OLD_REPO, 1, 7))
    )

    assert (late.outcome, late.task_id) == ("found_settled", opened.task_id)


def test_both_names_of_a_renamed_repository_s_issue_in_one_message_are_one_task(store: Store):
    """One issue opened under its repository's old name and its new one (the
    same repository id, so the same stable key), keys of one worker message:
    on the fast path they share one snapshot, in which the second cannot see
    the first's task, so it is not the plain case, and the general path
    finds the task by its stable key."""
    feed = make_feed(store.sessions)
    source = feed.github_source_id
    keys = [
        deliver(store, source, "github", "issues.opened", github_opened(repo, 1, 7))
        for repo in (OLD_REPO, NEW_REPO)
    ]

    with session_scope(store.sessions) as session:
        old_name, new_name = process_deliveries(
            session=session, delivery_pks=keys, settings=store.worker_settings(SETTINGS)
        )

    assert old_name.outcome == "created"
    assert (new_name.outcome, new_name.task_id) == ("found_settled", old_name.task_id)
    assert len(tasks_of(store.sessions, feed.workspace_id)) == 1
    if store.takes_fast_path and store.dialect == "postgresql":
        # The group kept: the second key was not the plain case.
        assert [old_name.path, new_name.path] == ["batch", "general"]
    elif store.takes_fast_path:
        # SQLite's group runs key by key and sees the first key's task; the
        # second key's insert meets its stable key on the unique index (the
        # plain case leaves a move to it: models.identities), and the
        # message runs key by key instead.
        assert [old_name.path, new_name.path] == ["fast", "general"]


def test_a_deleted_task_does_not_come_back_when_its_item_is_transferred(store: Store):
    feed = make_feed(store.sessions)
    source = feed.github_source_id
    created = run(
        store, deliver(store, source, "github", "issues.opened", github_opened(OLD_REPO, 1, 7))
    )
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=Caller.trusted("ops"), task_id=created.task_id)

    run(store, deliver(store, source, "github", "issues.transferred", transferred()))
    opened = run(store, deliver(store, source, "github", "issues.opened", opened_via_transfer()))

    assert opened.status is DeliveryStatus.IGNORED, opened
    assert tasks_of(store.sessions, feed.workspace_id) == []


def test_a_task_created_again_after_a_delete_moves_with_its_item(store: Store):
    """The ledger keeps the deleted task's names and the new task holds them
    on its row: the move finds the live one, not the deleted one."""
    feed = make_feed(store.sessions)
    source = feed.github_source_id
    first = run(
        store, deliver(store, source, "github", "issues.opened", github_opened(OLD_REPO, 1, 7))
    )
    with session_scope(store.sessions) as session:
        delete_task(session=session, caller=Caller.trusted("ops"), task_id=first.task_id)
    reopened = github_opened(OLD_REPO, 1, 7)
    reopened["issue"]["body"] = "opened again"  # another delivery, not a replay of the first
    again = run(store, deliver(store, source, "github", "issues.opened", reopened))
    assert again.outcome == "created" and again.task_id != first.task_id, again

    moved = twice(store, deliver(store, source, "github", "issues.transferred", transferred()))
    opened = twice(store, deliver(store, source, "github", "issues.opened", opened_via_transfer()))

    assert moved.status is DeliveryStatus.IGNORED and "alias" in moved.reason, moved
    assert (opened.outcome, opened.task_id) == ("found_settled", again.task_id)


def jira_created(key: str, issue_id: str) -> dict[str, Any]:
    body = payload("jira", "jira_issue_created__cloud")
    body["issue"].update(key=key, id=issue_id)
    return body


def test_a_jira_move_followed_by_a_search_is_one_task(store: Store):
    feed = make_feed(store.sessions)
    source = feed.jira_source_id
    created = run(
        store,
        deliver(
            store,
            source,
            "jira",
            "jira:issue_created",
            jira_created("TCP-2", "12490"),
            site=JIRA_SITE,
        ),
    )
    moved = payload("jira", "jira_issue_updated__cloud_issue_moved")  # TCP-2 -> INDEV-130
    learned = run(
        store, deliver(store, source, "jira", "jira:issue_updated", moved, site=JIRA_SITE)
    )
    assert "alias" in learned.reason

    search = run(
        store,
        deliver(
            store,
            source,
            "jira",
            "jira:issue_created",
            jira_created("INDEV-130", "12490"),
            origin=SCAN,
            site=JIRA_SITE,
        ),
    )

    assert (search.outcome, search.task_id) == ("found_settled", created.task_id)
    with store.sessions() as session:
        assert task_called(session, feed.workspace_id, Name.external("jira:INDEV-130")) == (
            created.task_id
        )


def test_a_jira_move_no_delivery_announced_is_found_by_the_issue_s_id(store: Store):
    feed = make_feed(store.sessions)
    source = feed.jira_source_id
    created = run(
        store,
        deliver(
            store,
            source,
            "jira",
            "jira:issue_created",
            jira_created("TCP-2", "12490"),
            site=JIRA_SITE,
        ),
    )

    search = run(
        store,
        deliver(
            store,
            source,
            "jira",
            "jira:issue_created",
            jira_created("INDEV-130", "12490"),
            origin=SCAN,
            site=JIRA_SITE,
        ),
    )

    assert (search.outcome, search.task_id) == ("found_settled", created.task_id)
    assert [t.identifier for t in tasks_of(store.sessions, feed.workspace_id)] == ["ACME-1"]


def test_a_gitlab_move_then_the_open_elsewhere_is_one_task(store: Store):
    feed = make_feed(store.sessions)
    with session_scope(store.sessions) as session:
        source = add_source(
            session=session,
            provider="gitlab",
            workspace_id=feed.workspace_id,
            slug="acme-gitlab",
            secret="gl-secret",
            create_events=("Issue Hook.open",),
        ).id
    created = run(
        store,
        deliver(store, source, "gitlab", "Issue Hook.open", payload("gitlab", "issue_hook__open")),
    )
    assert created.outcome == "created"

    closed = payload("gitlab", "issue_hook__close_moved")  # moved_to_id 302
    learned = run(store, deliver(store, source, "gitlab", "Issue Hook.close", closed))
    reopened = payload("gitlab", "issue_hook__open")
    reopened["object_attributes"].update(id=302, iid=1)
    reopened["project"]["path_with_namespace"] = "gitlabhq/elsewhere"
    opened = run(store, deliver(store, source, "gitlab", "Issue Hook.open", reopened))

    assert "alias" in learned.reason
    assert (opened.outcome, opened.task_id) == ("found_settled", created.task_id)


def test_a_repository_rename_then_a_scan_is_found_through_the_rename(store: Store):
    feed = make_feed(store.sessions)
    source = feed.github_source_id
    # A task from before the ledger knew stable keys: its external id alone.
    with session_scope(store.sessions) as session:
        task_id = create_task(
            session=session,
            caller=Caller.trusted("old"),
            workspace_id=feed.workspace_id,
            new=NewTask(title="old", external_id="gh-issue/Octocoders/Hello-World#5"),
        ).task.id
    renamed = payload(
        "github", "repository__renamed"
    )  # Octocoders/Hello-World, was ... Hello-World
    renamed["repository"].update(full_name="Octocoders/Renamed", name="Renamed")
    renamed["changes"] = {"repository": {"name": {"from": "Hello-World"}}}
    learned = run(store, deliver(store, source, "github", "repository.renamed", renamed))

    scanned = run(
        store,
        deliver(
            store,
            source,
            "github",
            "issues.opened",
            github_opened("Octocoders/Renamed", 5, 99),
            origin=SCAN,
        ),
    )

    assert learned.status is DeliveryStatus.IGNORED, learned
    assert (scanned.outcome, scanned.task_id) == ("found_settled", task_id)


def test_a_rename_no_delivery_announced_is_found_by_the_repository_s_id(store: Store):
    feed = make_feed(store.sessions)
    source = feed.github_source_id
    created = run(
        store,
        deliver(store, source, "github", "issues.opened", github_opened("acme/widgets", 5, 4242)),
    )

    scanned = run(
        store,
        deliver(
            store,
            source,
            "github",
            "issues.opened",
            github_opened("acme/gadgets", 5, 4242),
            origin=SCAN,
        ),
    )

    assert (scanned.outcome, scanned.task_id) == ("found_settled", created.task_id)
    assert len(tasks_of(store.sessions, feed.workspace_id)) == 1
