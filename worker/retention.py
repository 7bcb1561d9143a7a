"""PRUNE, which beat sends every ``retention_interval_seconds``: the inbox's
retention policy (``models.retention``), on the operator queue, and the
Idempotency-Keys past their window (``models.idempotency``).

One run prunes for at most half the task time limit, batch by batch, and
sends PRUNE again when rows are left (a first run over a large inbox), so it
never holds the operator worker long: a release waiting on that queue goes
in between.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from models.broker.messages import PRUNE
from models.broker.versions import notice_unknown
from models.db import session_scope
from models.idempotency import prune_expired
from models.retention import Policy, prune
from worker import runtime

log = logging.getLogger(__name__)

#: The share of the task time limit one run may take.
BUDGET_SHARE = 0.5


@shared_task(name=PRUNE, bind=True)
def prune_inbox(self, **unknown: Any) -> dict[str, Any]:
    """PRUNE(): delete old finished rows and drop old bodies, in small batches."""
    notice_unknown(PRUNE, unknown, self.request.headers)
    settings = runtime.settings()
    with session_scope(runtime.sessions()) as session:
        pruned = prune(
            session=session,
            policy=Policy.of(settings),
            budget_seconds=settings.task_time_limit_seconds * BUDGET_SHARE,
        )
    with session_scope(runtime.sessions()) as session:
        # A lookup already ignores an expired key; this keeps the table small.
        keys = prune_expired(session=session, limit=settings.retention_batch)
    if not pruned.finished or keys == settings.retention_batch:
        self.app.send_task(PRUNE)
    if pruned.batches:
        log.info(
            "retention: deleted %s, dropped the bodies of %s (%s bytes) in %s batches, "
            "%.1f s (%.1f s of it in transactions)%s",
            sum(pruned.deleted.values()),
            sum(pruned.dropped.values()),
            pruned.body_bytes,
            pruned.batches,
            pruned.seconds,
            pruned.busy_seconds,
            "" if pruned.finished else "; more left, sent again",
        )
    return {
        "deleted": pruned.deleted,
        "dropped": pruned.dropped,
        "body_bytes": pruned.body_bytes,
        "batches": pruned.batches,
        "seconds": pruned.seconds,
        "busy_seconds": pruned.busy_seconds,
        "finished": pruned.finished,
        "idempotency_keys": keys,
    }
