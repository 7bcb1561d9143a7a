"""Scenario 7: an operator release, then a redelivery -> a new task; the old one
survives without the identity; the audit row names the operator.

The runbook's one case for a release (docs/runbook.md, "Releasing an
identity"): a REST caller created the task for ``jira:OPS-311`` and died
before settling it, so nothing will ever finish that create. Jira's delivery
for the issue finds the task unsettled, retries, and is parked
``needs_operator``. The operator releases the identity with the real CLI
through the real operator worker (``celery -Q operator``), then sends the
parked delivery through again (``taskhook deliveries replay``): it creates a
new task. Jira retrying the delivery (same id) is a duplicate and creates
nothing; a later delivery for the issue finds the new task.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from sqlalchemy import select

from models.access import Caller
from models.db import session_scope
from models.tables import Delivery as DeliveryRow
from models.tables import IdentityRelease, Task
from models.tasks import CreateHooks, NewTask, create_task
from tests.support.invariants import assert_invariants
from tests.support.processes import finished, wait_until
from tests.support.stack import add_tenant, database_view, taskhook
from tests.support.traffic import post_all

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

SCENARIO = "7. operator release, then a redelivery"
EXTERNAL_ID = "jira:OPS-311"
REASON = "created by the import job that crashed on 2026-11-28; owner (dana) agrees"


class CallerDied(Exception):
    pass


def test_a_release_then_a_replay_makes_a_new_task_and_keeps_the_old_one(
    private_redis, shared_database, stack_on, secret_book, module_logs, figures
):
    engine, sessions = database_view(shared_database.url)
    stack = stack_on(shared_database.url, private_redis.url, TASKHOOK_UNSETTLED_MAX_RETRIES="2")
    tenant = add_tenant(sessions, secret_book, "ops", "OPS")
    ingress = stack.ingress()
    stack.worker("deliveries")
    stack.worker("operator", queues="operator")
    cli_log = module_logs / "taskhook-cli.log"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return taskhook(shared_database.url, private_redis.url, cli_log, *args)

    # A REST caller's create: inserted, then the caller died before settling.
    def died(_task: Task) -> None:
        raise CallerDied

    with sessions() as session, pytest.raises(CallerDied):
        create_task(
            session=session,
            caller=Caller.trusted("import job"),
            workspace_id=tenant.workspace_id,
            new=NewTask(title="Imported OPS-311", external_id=EXTERNAL_ID),
            hooks=CreateHooks(after_insert=died),
        )
    with sessions() as session:
        old = session.scalars(select(Task).where(Task.external_id == EXTERNAL_ID)).one()
    assert old.external_id_settled_at is None and old.created_by_delivery is None

    # Jira's delivery finds it unsettled, retries, and is parked for a person.
    delivery = tenant.jira("OPS-311")
    first = post_all(ingress.url, [delivery]).answers[0]
    assert (first.status, first.body["status"]) == (202, "queued")
    parked = first.body["delivery"]
    wait_until(finished(sessions, parked), timeout=60, what="the parking", logs=stack.processes)
    with sessions() as session:
        row = session.get(DeliveryRow, parked)
        assert (row.status, row.outcome, row.task_id) == (
            "needs_operator",
            "found_unsettled",
            old.id,
        )

    # The operator looks, then releases through the operator worker.
    lookup = cli("task", "lookup", "--workspace", tenant.slug, EXTERNAL_ID)
    assert lookup.returncode == 0, lookup.stderr
    assert "created outside the webhooks (REST API)" in " ".join(lookup.stdout.split())
    released = cli(
        "release",
        "--workspace",
        tenant.slug,
        EXTERNAL_ID,
        "--operator",
        "dana",
        "--reason",
        REASON,
        "--yes",
        "--json",
    )
    assert released.returncode == 0, released.stderr
    answer = json.loads(released.stdout)
    assert answer["released"] is True and answer["operator"] == "dana"
    assert answer["task_id"] == old.id and answer["needs_operator_deliveries"] == [parked]

    # The redelivery through the inbox: the parked delivery goes through again.
    replayed = cli("deliveries", "replay", str(parked))
    assert replayed.returncode == 0, replayed.stderr
    wait_until(finished(sessions, parked), timeout=60, what="the replay", logs=stack.processes)

    # Jira retries the same delivery: a duplicate, nothing new.
    retried = post_all(ingress.url, [delivery]).answers[0]
    assert (retried.status, retried.body["status"]) == (202, "duplicate")
    # A later delivery for the issue finds the new task.
    later = post_all(ingress.url, [tenant.jira("OPS-311")]).answers[0]
    wait_until(finished(sessions, later.body["delivery"]), timeout=60, what="the later delivery")

    with session_scope(sessions) as session:
        tasks = {t.id: t for t in session.scalars(select(Task))}
        new = session.scalars(select(Task).where(Task.external_id == EXTERNAL_ID)).one()
        replay_row = session.get(DeliveryRow, parked)
        later_row = session.get(DeliveryRow, later.body["delivery"])
        (audit,) = session.scalars(select(IdentityRelease)).all()
    survivor = tasks[old.id]
    assert new.id != old.id and len(tasks) == 2
    assert (survivor.external_id, survivor.external_id_settled_at) == (None, None)
    assert survivor.title == "Imported OPS-311"
    assert new.external_id_settled_at is not None and new.created_by_delivery == parked
    assert (replay_row.status, replay_row.outcome, replay_row.task_id) == (
        "done",
        "created",
        new.id,
    )
    assert (later_row.outcome, later_row.task_id) == ("found_settled", new.id)
    assert (audit.operator, audit.reason, audit.task_id, audit.external_id) == (
        "dana",
        REASON,
        old.id,
        EXTERNAL_ID,
    )
    assert_invariants(engine)
    engine.dispose()
    figures.record(
        SCENARIO,
        parked_delivery="needs_operator, found_unsettled (REST caller died before settling)",
        release="taskhook release -> operator worker: released, exit 0",
        replay="created a new task",
        old_task="kept, external_id and settlement null, title unchanged",
        same_id_redelivery="202 duplicate, no task",
        later_delivery="found_settled (the new task)",
        audit_row=f"operator {audit.operator!r}, reason kept, task {audit.task_id}",
        tasks=2,
    )
