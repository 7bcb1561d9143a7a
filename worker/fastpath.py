"""The common case of a delivery on PostgreSQL, in two statements.

Almost every delivery a worker takes is the plain case: a create event for an
identity nobody holds yet, in a workspace whose intake step has no WIP limit,
stored with the task its body describes (``deliveries.draft_*``, which the
ingress reads and validates anyway). Through the general path
(``models.tasks.create_task`` and ``models.inbox`` on an ORM session) that
case costs about twenty round trips and four commits; here it is two
statements, each its own transaction, on one connection in autocommit mode:

1. **claim and insert** -- take the lease (``models.inbox.claim``), then the
   create sequence up to its insert (docs/contract.md, "The create
   sequence"): step 3's lookup before any write to the task store, step 4's
   validation (done by the ingress when it kept the draft, with the task
   store's own ``validated_new_task``; the statement re-checks the lengths,
   for drafts an older ingress kept), step 5's identifier allocation, WIP
   admission and task row. The claim records the task's id on the delivery
   row (``created_task_id``), so the insert commits with its fence, as on
   the general path (docs/contract.md, "Fencing the create"). The
   workspace's sequence row is locked only for this statement;
2. **settle and finish** -- steps 6 and 7 (the source link, then the
   conditional settlement UPDATE with ``external_id`` in its predicate), the
   ``task.created`` event, and the delivery's ``done`` record fenced by the
   lease's attempt, all committing together or not at all.

The task row commits unsettled before the settlement, as the contract's
state machine has it, and the fail points ``after_insert`` and ``before_settle``
fall between the two statements, so the crash tests kill this path. Nothing
can run between the lookup and the insert: a test hook or the
``after_lookup`` fail point that must run there sends the create down the
general path (``worker.processing``).

The order and meaning of the steps are the general path's; only the number
of round trips differs. Whatever is not the plain case goes back to the
general path, at a point where that path's answer is the right one:

- the first statement claimed but inserted nothing (a task holds the
  identity, the intake step has a WIP limit or is missing, the workspace is
  gone, the event no longer creates tasks, the row has no draft or its draft
  names no identity or is longer than the task store keeps, an earlier
  attempt already inserted a task): only the lease was written, so the
  general path decides from its lookup, or from the earlier attempt's task;
- another create won the unique index between the lookup and the insert:
  the statement rolled back whole, claim included (:class:`LostTheRace`), so
  the general path claims and its lookup finds the winner -- the create
  sequence's step-5 backstop;
- the settlement matched no row: the task was deleted or its identity
  released meanwhile, or a concurrent completion of this same create settled
  it first. The task is this delivery's own, so ``complete_creation``
  finishes it and re-reads to tell which, as for a crashed attempt.

SQLite runs the general path only: there a commit costs no network round trip.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import errors
from sqlalchemy import Engine

from models.events import EventType
from models.external_id import UNICODE_WHITE_SPACE
from models.inbox import DeliveryStatus, Lease
from models.tables import EXTERNAL_ID_INDEX, Task, utcnow
from models.tasks import (
    MAX_DESCRIPTION_LENGTH,
    MAX_REMOTE_KEY_LENGTH,
    MAX_TITLE_LENGTH,
    SourceLink,
)

#: A PostgreSQL regular expression for a value that is Unicode White_Space
#: only: an identity no task may be created with (docs/contract.md,
#: "Validation and normalization"). The ingress never keeps one; the fast
#: path's SQL refuses one all the same, and the general path says it is dead.
_BLANK = "^[" + "".join(f"\\u{ord(c):04x}" for c in UNICODE_WHITE_SPACE) + "]*$"

# One statement, one snapshot. The claim decides whether this is the plain
# case, on the row it updates (re-checked by PostgreSQL if a concurrent
# update got there first): no earlier attempt's task, a draft naming an
# identity and within the task store's lengths, a creating event, step 3's
# lookup missing (the NOT EXISTS), and an intake step without a WIP limit.
# The ingress checked the draft with models.tasks.validated_new_task, but a
# row kept by an older ingress may hold a longer description, so the lengths
# are checked again with that module's limits (NUL and lone surrogates never
# reach PostgreSQL text at all); a draft over them goes to the general path,
# which reads the body afresh. Counting a step's tasks needs the
# workspace lock held *before* the count's snapshot, which one statement
# cannot give, so a limited step goes to the general path and no sequence
# number is spent here. In the plain case the claim also records the id the
# task is inserted with, drawn from the table's own sequence beforehand:
# the fence of docs/contract.md, "Fencing the create", in the claim itself.
# A unique violation (a rival's insert after our snapshot) rolls the whole
# statement back: claim, marker, sequence number and all.
_CLAIM_AND_INSERT = f"""
WITH new_task AS (
    SELECT nextval(pg_get_serial_sequence('tasks', 'id')) AS id
), claimed AS (
    UPDATE deliveries AS d
       SET status = '{DeliveryStatus.PROCESSING.value}',
           attempts = d.attempts + 1,
           lease_expires_at = %(now)s + make_interval(secs => %(lease_seconds)s),
           updated_at = %(now)s,
           created_task_id = CASE
               WHEN d.created_task_id IS NULL
                AND d.draft_title IS NOT NULL
                AND d.external_id IS NOT NULL AND d.external_id !~ '{_BLANK}'
                AND char_length(d.draft_title) <= %(max_title)s
                AND coalesce(char_length(d.draft_description), 0) <= %(max_description)s
                AND char_length(d.draft_remote_key) <= %(max_remote_key)s
                AND s.create_events::jsonb ? d.event
                AND NOT EXISTS (
                    SELECT FROM tasks AS t
                     WHERE t.workspace_id = s.workspace_id AND t.external_id = d.external_id
                )
                AND (SELECT step.wip_limit IS NULL FROM workflow_steps AS step
                      WHERE step.workspace_id = s.workspace_id
                      ORDER BY step.position LIMIT 1)
               THEN (SELECT id FROM new_task)
               ELSE d.created_task_id
           END
      FROM webhook_sources AS s
     WHERE d.id = %(delivery)s
       AND s.id = d.source_id
       AND (d.status = '{DeliveryStatus.QUEUED.value}'
            OR (d.status = '{DeliveryStatus.PROCESSING.value}' AND d.lease_expires_at <= %(now)s))
    RETURNING d.attempts, d.retries, d.created_task_id, d.external_id, d.draft_title,
              d.draft_description, d.draft_url, d.draft_remote_key, s.provider, s.workspace_id
), plain AS (
    SELECT claimed.* FROM claimed, new_task WHERE claimed.created_task_id = new_task.id
), intake AS (
    SELECT step.id FROM workflow_steps AS step, plain
     WHERE step.workspace_id = plain.workspace_id
     ORDER BY step.position LIMIT 1
), number AS (
    UPDATE workspaces AS w SET task_sequence = w.task_sequence + 1
      FROM plain
     WHERE w.id = plain.workspace_id
    RETURNING w.task_prefix || '-' || w.task_sequence AS identifier
), inserted AS (
    INSERT INTO tasks (id, workspace_id, identifier, title, description, step_id, external_id,
                       created_by_delivery, created_at, updated_at)
    SELECT plain.created_task_id, plain.workspace_id, number.identifier, plain.draft_title,
           plain.draft_description, intake.id, plain.external_id, %(delivery)s, %(now)s, %(now)s
      FROM plain, number, intake
    RETURNING id, identifier
)
SELECT c.attempts, c.retries, i.id, i.identifier, c.workspace_id, c.external_id,
       c.provider, c.draft_url, c.draft_remote_key,
       EXISTS (SELECT FROM plain) AS marked
  FROM claimed AS c LEFT JOIN inserted AS i ON true
"""

# Each part runs only when the settlement matched one row: the event exists
# exactly when the create settled, and the delivery is done exactly then. The
# event position comes from the workspace's stream row, locked until this
# statement commits (see models.events).
_SETTLE_AND_FINISH = f"""
WITH source AS (
    INSERT INTO task_sources (task_id, provider, url, remote_key, created_at)
    VALUES (%(task)s, %(provider)s, %(url)s, %(remote_key)s, %(now)s)
    ON CONFLICT (task_id) DO NOTHING
), settled AS (
    UPDATE tasks SET external_id_settled_at = %(now)s
     WHERE id = %(task)s AND external_id = %(external_id)s AND external_id_settled_at IS NULL
    RETURNING workspace_id
), stream AS (
    INSERT INTO event_streams (workspace_id, last_position)
    SELECT workspace_id, 1 FROM settled
    ON CONFLICT (workspace_id) DO UPDATE SET last_position = event_streams.last_position + 1
    RETURNING workspace_id, last_position
), event AS (
    INSERT INTO task_events (workspace_id, position, type, task_id, external_id, occurred_at)
    SELECT workspace_id, last_position, '{EventType.CREATED.value}', %(task)s, %(external_id)s,
           %(now)s
      FROM stream
), finished AS (
    UPDATE deliveries
       SET status = '{DeliveryStatus.DONE.value}', status_reason = NULL, outcome = 'created',
           task_id = %(task)s, lease_expires_at = NULL, updated_at = %(now)s
     WHERE id = %(delivery)s AND attempts = %(attempt)s
       AND status = '{DeliveryStatus.PROCESSING.value}'
       AND EXISTS (SELECT FROM settled)
    RETURNING id
)
SELECT EXISTS (SELECT FROM settled), EXISTS (SELECT FROM finished)
"""


class LostTheRace(Exception):
    """Another create won the unique index between the lookup and the insert.
    Nothing was written, not even the claim: the general path's lookup finds
    the winner."""


@dataclass(frozen=True)
class Inserted:
    """The plain case's committed, unsettled task row (not in any session) and
    the source link its settlement writes."""

    task: Task
    source: SourceLink


@dataclass(frozen=True)
class Claimed:
    """A committed lease and, in the plain case, the task inserted with it."""

    lease: Lease
    #: None: not the plain case, only the lease was written.
    inserted: Inserted | None = None


class Settlement(enum.Enum):
    #: Settled, event appended, delivery done: the create is complete.
    FINISHED = "finished"
    #: Settled, but the lease was taken over: the newer attempt records the delivery.
    TAKEN_OVER = "taken_over"
    #: Nothing settled: the task was deleted or its identity released meanwhile,
    #: or a concurrent completion of the same create settled it first.
    NOT_SETTLED = "not_settled"


class FastPath:
    """The two statements on one psycopg connection in autocommit mode."""

    def __init__(self, connection: psycopg.Connection) -> None:
        self.connection = connection

    def claim_and_insert(self, delivery_pk: int, *, lease_seconds: float) -> Claimed | None:
        """Take the lease (a new attempt) and, in the plain case, insert the task;
        None when the delivery is finished or another worker holds it.

        Raises :class:`LostTheRace` when a rival create won the unique index.
        """
        params = {
            "delivery": delivery_pk,
            "now": utcnow(),
            "lease_seconds": lease_seconds,
            "max_title": MAX_TITLE_LENGTH,
            "max_description": MAX_DESCRIPTION_LENGTH,
            "max_remote_key": MAX_REMOTE_KEY_LENGTH,
        }
        try:
            row = self.connection.execute(_CLAIM_AND_INSERT, params).fetchone()
        except errors.UniqueViolation as error:
            if error.diag.constraint_name != EXTERNAL_ID_INDEX:
                raise
            raise LostTheRace() from error
        if row is None:
            return None
        attempt, retries, task_id, identifier, workspace_id, external_id = row[:6]
        provider, url, remote_key, marked = row[6:]
        lease = Lease(delivery_pk, attempt, retries)
        if marked and task_id is None:
            # Cannot happen while the claim's conditions and the insert's agree;
            # were it to, the marker names a task that does not exist, and the
            # delivery parks for an operator rather than creating twice.
            raise RuntimeError(
                f"delivery {delivery_pk}: claimed for a create that inserted nothing"
            )
        if task_id is None:
            return Claimed(lease)
        task = Task(
            id=task_id,
            workspace_id=workspace_id,
            identifier=identifier,
            external_id=external_id,
            created_by_delivery=delivery_pk,
        )
        source = SourceLink(provider=provider, url=url, remote_key=remote_key)
        return Claimed(lease, Inserted(task, source))

    def settle_and_finish(self, *, task: Task, source: SourceLink, lease: Lease) -> Settlement:
        """Steps 6 and 7, the event, and the delivery's ``done``: one transaction."""
        params = {
            "task": task.id,
            "external_id": task.external_id,
            "provider": source.provider,
            "url": source.url,
            "remote_key": source.remote_key,
            "delivery": lease.delivery_pk,
            "attempt": lease.attempt,
            "now": utcnow(),
        }
        try:
            settled, finished = self.connection.execute(_SETTLE_AND_FINISH, params).fetchone()
        except errors.ForeignKeyViolation:
            return Settlement.NOT_SETTLED  # the task was deleted: its source link has no row
        if not settled:
            return Settlement.NOT_SETTLED
        return Settlement.FINISHED if finished else Settlement.TAKEN_OVER


@contextmanager
def fast_path(engine: Engine) -> Iterator[FastPath | None]:
    """A FastPath on a connection from ``engine``'s pool; None for SQLite.

    The connection is switched to autocommit for the delivery and back before
    it returns to the pool. One that broke (the server went away) is
    invalidated, so the pool does not hand it out again.
    """
    if engine.dialect.name != "postgresql":
        yield None
        return
    pooled = engine.raw_connection()
    connection: psycopg.Connection = pooled.driver_connection
    try:
        connection.autocommit = True
        yield FastPath(connection)
    finally:
        if connection.broken or connection.closed:
            pooled.invalidate()
        else:
            connection.autocommit = False
        pooled.close()
