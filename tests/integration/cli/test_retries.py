"""The CLI's changes run again (docs/contract.md §16). ``taskhook release``:
each run sends a key of its own in a header; a run that got no answer prints
it, and the same command with ``--idempotency-key`` answers what that run did
without releasing twice. The operator worker, sent one message twice under
one key, releases once. Every other change -- archive, merge and unmerge, a
replay and a bulk replay, a token's revocation, a secret's rotation -- takes
``--idempotency-key``: run again with it, it acts once and says so; a key of
another request is refused."""

from __future__ import annotations

import re

from celery.exceptions import TimeoutError as CeleryTimeout

from models.broker.messages import IDEMPOTENCY_KEY_HEADER
from models.db import session_scope
from models.inbox import DeliveryStatus
from models.tasks import NewTask, create_task
from tests.support.cli import RELEASE, as_json, held_by, operator_worker, refused, taskhook
from tests.support.scenarios import (
    EXTERNAL_ID,
    a_delivery,
    a_source,
    an_unfinished_create,
    settle_as,
)
from tests.support.stores import TRUSTED, Store
from worker.cli import EXIT_NO_ANSWER
from worker.operator import release_by_message

RELEASED = "SELECT count(*) FROM task_events WHERE type = 'task.identity_released'"


def test_each_run_sends_a_key_of_its_own(store: Store, celery):
    an_unfinished_create(store)
    celery.answer = lambda *args: {"released": False, "error": "task not found"}
    for _ in range(2):
        refused(taskhook(store, *RELEASE, "--reason", "r", "--yes"))
    keys = [headers[IDEMPOTENCY_KEY_HEADER] for headers in celery.headers]
    assert len(set(keys)) == 2 and all(re.fullmatch("[0-9a-f]{32}", key) for key in keys)


def test_a_run_whose_answer_was_lost_is_finished_by_the_same_command_and_key(store: Store, celery):
    an_unfinished_create(store)
    worker = operator_worker(store)

    def released_but_the_answer_was_lost(*args, **kwargs):
        worker(*args, **kwargs)
        raise CeleryTimeout("The operation timed out.")

    released_but_the_answer_was_lost.reads_idempotency_key = True
    celery.answer = released_but_the_answer_was_lost
    args = (*RELEASE, "--reason", "worker died", "--operator", "alice", "--yes")
    line = refused(taskhook(store, *args, "--timeout", "0.5"), EXIT_NO_ANSWER)
    key = re.search(r"--idempotency-key ([0-9a-f]{32})", line).group(1)
    assert held_by(store) is None  # the worker did release it

    again = taskhook(store, *args, "--idempotency-key", key)

    assert again.exit_code == 0, again.output
    assert "Released already under this key" in again.stdout
    assert f"{EXTERNAL_ID!r} from ACME-1" in again.stdout
    assert len(celery.sent) == 1  # nothing sent the second time
    assert store.scalar(RELEASED) == 1
    assert store.scalar("SELECT count(*) FROM identity_releases") == 1


def test_a_key_of_another_release_is_refused(store: Store, celery):
    an_unfinished_create(store)
    celery.answer = operator_worker(store)
    args = (*RELEASE, "--reason", "r", "--operator", "alice", "--yes")
    assert taskhook(store, *args, "--idempotency-key", "k-1").exit_code == 0
    # Another operator's run under that key: another request.
    line = refused(
        taskhook(
            store,
            *RELEASE,
            "--reason",
            "r",
            "--operator",
            "bob",
            "--yes",
            "--idempotency-key",
            "k-1",
        )
    )
    assert "was first sent with a different request" in line


def test_a_key_no_row_can_keep_is_a_usage_error(store: Store, celery):
    an_unfinished_create(store)
    result = taskhook(store, *RELEASE, "--reason", "r", "--yes", "--idempotency-key", "a b")
    assert result.exit_code == 2
    assert "Idempotency-Key must be visible ASCII" in result.stderr
    assert celery.sent == []


def test_the_worker_releases_once_for_one_message_sent_twice(store: Store):
    workspace_id, task_id, _, _ = an_unfinished_create(store)
    answers = []
    for _ in range(2):
        with session_scope(store.sessions) as session:
            answers.append(
                release_by_message(
                    session=session,
                    workspace_id=workspace_id,
                    external_id=EXTERNAL_ID,
                    operator="alice",
                    reason="worker died",
                    expected_task_id=task_id,
                    idempotency_key="k-2",
                )
            )
    assert [answer["replayed"] for answer in answers] == [False, True]
    assert answers[0] | {"replayed": True} == answers[1]
    assert store.scalar(RELEASED) == 1


def _tasks(store: Store, *external_ids: str) -> None:
    """A task for each external id in the workspace acme: ACME-1, ACME-2 ..."""
    acme = store.workspace()
    with session_scope(store.sessions) as session:
        for external_id in external_ids:
            create_task(
                session=session,
                caller=TRUSTED,
                workspace_id=acme.id,
                new=NewTask(title="One item", external_id=external_id),
            )


def test_an_archive_key_is_one_tasks(store: Store):
    _tasks(store, "jira:A-1", "jira:A-2")
    first = taskhook(store, "task", "archive", "ACME-1", "--idempotency-key", "k-3")
    again = taskhook(store, "task", "archive", "ACME-1", "--idempotency-key", "k-3")
    assert (first.exit_code, again.exit_code) == (0, 0), again.output
    line = refused(taskhook(store, "task", "archive", "ACME-2", "--idempotency-key", "k-3"))
    assert "was first sent with a different request" in line
    assert store.scalar("SELECT count(*) FROM tasks WHERE archived_at IS NOT NULL") == 1
    assert store.scalar("SELECT count(*) FROM task_events WHERE type = 'task.archived'") == 1


def test_a_merge_run_again_under_its_key_answers_that_merge(store: Store):
    _tasks(store, "jira:OPS-7", "jira:OPS2-7", "jira:OPS3-7")
    merge = ("identities", "merge", "--into", "ACME-1", "--operator", "ana", "--yes")
    keyed = ("--reason", "site migration", "--idempotency-key", "k-merge-1")
    first = taskhook(store, *merge, "--from", "ACME-2", *keyed)
    again = taskhook(store, *merge, "--from", "ACME-2", *keyed)
    assert first.exit_code == 0, first.output
    assert again.exit_code == 0, again.output
    assert again.stdout.strip() == "Merged already under this key: merge 1. Nothing changed."
    assert store.scalar("SELECT count(*) FROM identity_merges") == 1
    # Another reason under the key: another request.
    line = refused(
        taskhook(
            store, *merge, "--from", "ACME-2", "--reason", "other", "--idempotency-key", "k-merge-1"
        )
    )
    assert "was first sent with a different request" in line
    # The same key for another merge into another task: refused, nothing merged.
    other = ("identities", "merge", "--into", "ACME-3", "--from", "ACME-1", "--operator", "ana")
    line = refused(taskhook(store, *other, "--yes", *keyed))
    assert "was first sent with a different request" in line
    assert store.scalar("SELECT count(*) FROM identity_merges") == 1


def test_a_release_run_again_with_another_reason_under_its_key_is_refused(store: Store, celery):
    an_unfinished_create(store)
    celery.answer = operator_worker(store)
    args = (*RELEASE, "--operator", "alice", "--yes", "--idempotency-key", "k-reason")
    assert taskhook(store, *args, "--reason", "abandoned").exit_code == 0
    again = taskhook(store, *args, "--reason", "abandoned")
    line = refused(taskhook(store, *args, "--reason", "another reason"))
    assert "Released already under this key" in again.stdout
    assert "was first sent with a different request" in line
    assert len(celery.sent) == 1
    assert store.scalar(RELEASED) == 1


def _dead(store: Store, *delivery_ids: str) -> list[int]:
    source_id = a_source(store, store.workspace().id)
    keys = [a_delivery(store, source_id, delivery_id) for delivery_id in delivery_ids]
    for key in keys:
        settle_as(store, key, DeliveryStatus.DEAD, error="database went away")
    return keys


def test_a_replay_run_again_under_its_key_says_so_and_sends_nothing(store: Store, celery):
    dead, other = _dead(store, "d-1", "d-2")
    replay = ("deliveries", "replay", "--yes", "--idempotency-key", "k-replay")
    first = taskhook(store, *replay, str(dead))
    again = as_json(taskhook(store, *replay, str(dead), "--json"))
    line = refused(taskhook(store, *replay, str(other)))

    assert first.exit_code == 0, first.output
    assert again == {"dry_run": False, "delivery": dead, "replayed": True}
    assert "was first sent with a different request" in line
    assert [args for _, args, _ in celery.sent] == [[dead]]
    assert store.scalar("SELECT status FROM deliveries WHERE id = :p", p=other) == "dead"


def test_a_bulk_replay_run_again_under_its_key_answers_that_run(store: Store, celery):
    keys = _dead(store, "d-1", "d-2")
    run = ("deliveries", "replay-matching", "--status", "dead", "--name", "after the outage")
    keyed = ("--expect", "2", "--idempotency-key", "k-bulk")
    first = as_json(taskhook(store, *run, *keyed, "--json"))
    for key in keys:  # dead again: a second run would queue them again
        settle_as(store, key, DeliveryStatus.DEAD, error="again")
    again = as_json(taskhook(store, *run, *keyed, "--json"))
    said = taskhook(store, *run, *keyed)
    line = refused(taskhook(store, *run, "--expect", "1", "--idempotency-key", "k-bulk"))

    assert first["replayed"] is False and again["replayed"] is True
    assert again["operation"]["id"] == first["operation"]["id"]
    assert said.stdout.startswith(
        f"Started already under this key: operation {again['operation']['id']}"
    )
    assert "was first sent with a different request" in line
    assert store.scalar("SELECT count(*) FROM operations WHERE kind = 'bulk-replay'") == 1
    assert store.scalar("SELECT count(*) FROM deliveries WHERE status = 'dead'") == 2
    assert [args for _, args, _ in celery.sent] == [[sorted(keys)]]  # one message, the first run's


def test_an_unmerge_run_again_under_its_key_answers_that_undo(store: Store):
    _tasks(store, "jira:OPS-8", "jira:OPS2-8")
    merged = taskhook(
        store,
        "identities",
        "merge",
        "--into",
        "ACME-1",
        "--from",
        "ACME-2",
        "--reason",
        "r",
        "--operator",
        "ana",
        "--yes",
    )
    assert merged.exit_code == 0, merged.output
    undo = ("identities", "unmerge", "1", "--operator", "ana", "--idempotency-key", "k-undo")
    first = taskhook(store, *undo, "--reason", "two items")
    again = taskhook(store, *undo, "--reason", "two items")
    line = refused(taskhook(store, *undo, "--reason", "another"))
    fresh = refused(taskhook(store, "identities", "unmerge", "1", "--reason", "two items"))

    assert first.exit_code == 0, first.output
    assert again.stdout.strip() == "Undone already under this key: merge 1. Nothing changed."
    assert "was first sent with a different request" in line
    assert "was undone already" in fresh


def test_a_revocation_run_again_under_its_key_is_said_and_keys_are_one_tokens(store: Store):
    acme = store.workspace()
    for name in ("ci", "bot"):
        added = taskhook(store, "token", "add", "--workspace", acme.slug, "--name", name)
        assert added.exit_code == 0, added.output
    first = taskhook(store, "token", "revoke", "1", "--idempotency-key", "k-revoke")
    again = as_json(
        taskhook(store, "token", "revoke", "1", "--idempotency-key", "k-revoke", "--json")
    )
    line = refused(taskhook(store, "token", "revoke", "2", "--idempotency-key", "k-revoke"))

    assert first.stdout.strip() == "Token 1 (ci) is revoked."
    assert again["replayed"] is True and again["name"] == "ci"
    assert "was first sent with a different request" in line
    assert store.scalar("SELECT count(*) FROM api_tokens WHERE revoked_at IS NOT NULL") == 1


def test_a_rotation_run_again_under_its_key_adds_one_secret_and_shows_it_once(store: Store):
    acme = store.workspace()
    source = a_source(store, acme.id)
    slug = store.scalar("SELECT slug FROM webhook_sources WHERE id = :s", s=source)
    active = "SELECT count(*) FROM source_secrets WHERE retired_at IS NULL"
    before = store.scalar(active)
    rotate = ("source", "rotate-secret", slug, "--idempotency-key", "k-rotate")
    first = as_json(taskhook(store, *rotate, "--json"))
    again = taskhook(store, *rotate)
    given = refused(taskhook(store, *rotate, "--secret", "s" * 32))
    finish = ("source", "rotate-secret", slug, "--finish", "--idempotency-key", "k-finish")
    finished = as_json(taskhook(store, *finish, "--json"))
    taskhook(store, "source", "rotate-secret", slug)  # a rotation begun since
    finished_again = as_json(taskhook(store, *finish, "--json"))

    assert "secret" in first
    assert first["secret"] not in again.output
    assert "under this key already and shown then" in again.stdout
    assert "was first sent with a different request" in given
    assert store.scalar(active) == 2  # the one added since, and the newest before it
    assert finished == {"source": slug, "retired": before, "replayed": False}
    assert finished_again == {"source": slug, "retired": before, "replayed": True}
