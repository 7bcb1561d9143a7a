"""The common case of a delivery on PostgreSQL, in three statements (at most four).

Almost every delivery a worker takes is the plain case: a create event for an
identity nobody holds yet, in a workspace whose intake step has no WIP limit.
Through the general path (``models.tasks.create_task`` and ``models.inbox``
on an ORM session) that case costs about twenty round trips and four commits;
here it is at most four statements, usually three, each its own transaction
on one connection in autocommit mode:

1. **claim** -- take the lease and read the delivery with its source
   (``models.inbox.claim`` and the worker's load, in one ``UPDATE ... FROM``),
   committed without waiting for the WAL flush (see ``_CLAIM``);
2. **lookup** -- step 3 of seed 000's create sequence, before any write to
   the task store. The claim does it too, for the identity the ingress read
   from the body (``deliveries.external_id``); when the worker's own reading
   of the body names that identity, the claim's answer is the lookup and this
   statement is not sent;
3. **insert** -- step 5: identifier allocation, WIP admission and the task
   row in one statement, so the workspace's sequence row is locked only for
   the length of that statement;
4. **settle and finish** -- steps 6 and 7 (the source link, then the
   conditional settlement UPDATE with ``external_id`` in its predicate), the
   ``task.created`` event, and the delivery's ``done`` record fenced by the
   lease's attempt, all committing together or not at all.

The order and meaning of the steps are the general path's; only the number
of round trips differs. Whatever is not the plain case goes back to the
general path, at a point where that path's answer is the right one:

- before the insert (a task holds the identity, the intake step has a WIP
  limit or is missing, the workspace is gone, the title is invalid, another
  create won the unique index): nothing was written, so ``create_task`` runs
  the whole sequence from its lookup and gives the outcome;
- after the insert, when the settlement did not happen (the task was deleted
  or its identity released meanwhile): the task is this delivery's own, so
  ``complete_creation`` finishes it and re-reads, as for a crashed attempt.

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
from models.inbox import DeliveryStatus, Lease
from models.tables import EXTERNAL_ID_INDEX, Task, utcnow
from models.tasks import SourceLink

# The claim alone commits without waiting for its WAL flush (the setting is
# local to its transaction). A claim a server crash loses is a lease nobody
# holds: the row is claimable again and the sweeper sends it. It cannot be
# lost while anything it fences survives, because the next statement's commit
# (the insert, the settlement) flushes the WAL up to and including it.
_CLAIM = """
WITH no_flush_wait AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE deliveries AS d
   SET status = 'processing',
       attempts = d.attempts + 1,
       lease_expires_at = %(now)s + make_interval(secs => %(lease_seconds)s),
       updated_at = %(now)s
  FROM webhook_sources AS s, no_flush_wait
 WHERE d.id = %(delivery)s
   AND s.id = d.source_id
   AND (d.status = 'queued' OR (d.status = 'processing' AND d.lease_expires_at <= %(now)s))
RETURNING d.attempts, d.event, d.body, d.content_type,
          s.slug, s.provider, s.workspace_id, s.create_events, s.site_url,
          d.external_id,
          CASE WHEN d.external_id IS NOT NULL THEN EXISTS (
              SELECT FROM tasks AS t
               WHERE t.workspace_id = s.workspace_id AND t.external_id = d.external_id
          ) END
"""

_LOOKUP = "SELECT 1 FROM tasks WHERE workspace_id = %(workspace)s AND external_id = %(external_id)s"

# The sequence UPDATE matches only when the intake step exists and has no WIP
# limit: counting a step's tasks needs the workspace lock held *before* the
# count's snapshot, which one statement cannot give, so a limited step goes
# to the general path and no sequence number is spent here. A unique
# violation rolls the whole statement back, sequence number included.
_INSERT = """
WITH intake AS (
    SELECT id, wip_limit FROM workflow_steps
     WHERE workspace_id = %(workspace)s
     ORDER BY position LIMIT 1
), number AS (
    UPDATE workspaces SET task_sequence = task_sequence + 1
     WHERE id = %(workspace)s AND EXISTS (SELECT FROM intake WHERE wip_limit IS NULL)
    RETURNING task_prefix || '-' || task_sequence AS identifier
)
INSERT INTO tasks (workspace_id, identifier, title, description, step_id, external_id,
                   created_by_delivery, created_at, updated_at)
SELECT %(workspace)s, number.identifier, %(title)s, %(description)s, intake.id, %(external_id)s,
       %(delivery)s, %(now)s, %(now)s
  FROM number, intake
RETURNING id, identifier
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


@dataclass(frozen=True)
class Work:
    """A claimed delivery and its source, as plain values: the task store rolls
    its session back on some paths, which would expire ORM instances."""

    delivery_pk: int
    event: str
    body: bytes
    content_type: str | None
    source_slug: str
    provider: str
    workspace_id: int
    create_events: frozenset[str]
    site_url: str | None
    #: The identity the ingress read from the body, and whether a task in the
    #: workspace held it when the claim committed (None: not looked up).
    named_identity: str | None = None
    held_at_claim: bool | None = None

    def held(self, external_id: str) -> bool | None:
        """The claim's lookup of ``external_id``, if it looked that identity up."""
        return self.held_at_claim if external_id == self.named_identity else None


class Settlement(enum.Enum):
    #: Settled, event appended, delivery done: the create is complete.
    FINISHED = "finished"
    #: Settled, but the lease was taken over: the newer attempt records the delivery.
    TAKEN_OVER = "taken_over"
    #: Nothing settled (the task was deleted or its identity released meanwhile).
    NOT_SETTLED = "not_settled"


class FastPath:
    """The four statements on one psycopg connection in autocommit mode."""

    def __init__(self, connection: psycopg.Connection) -> None:
        self.connection = connection

    def claim(self, delivery_pk: int, *, lease_seconds: float) -> tuple[Lease, Work] | None:
        """Take the lease (a new attempt), or None when finished or held by another."""
        # Binary results: the body arrives as its bytes, not as hex text twice its size.
        row = self.connection.execute(
            _CLAIM,
            {"delivery": delivery_pk, "now": utcnow(), "lease_seconds": lease_seconds},
            binary=True,
        ).fetchone()
        if row is None:
            return None
        attempt, event, body, content_type, slug, provider, workspace, events, site = row[:9]
        named_identity, held = row[9:]
        work = Work(
            delivery_pk=delivery_pk,
            event=event,
            body=bytes(body),
            content_type=content_type,
            source_slug=slug,
            provider=provider,
            workspace_id=workspace,
            create_events=frozenset(events),
            site_url=site,
            named_identity=named_identity,
            held_at_claim=held,
        )
        return Lease(delivery_pk, attempt), work

    def is_held(self, workspace_id: int, external_id: str) -> bool:
        """Step 3: does a task in the workspace hold the identity (settled or not)?"""
        params = {"workspace": workspace_id, "external_id": external_id}
        return self.connection.execute(_LOOKUP, params).fetchone() is not None

    def insert(
        self,
        *,
        workspace_id: int,
        external_id: str,
        title: str,
        description: str | None,
        delivery_pk: int,
    ) -> Task | None:
        """Step 5: the committed task row, unsettled and named as this delivery's
        creation (not in any session); None when the general path must decide
        (nothing was written)."""
        params = {
            "workspace": workspace_id,
            "title": title,
            "description": description,
            "external_id": external_id,
            "delivery": delivery_pk,
            "now": utcnow(),
        }
        try:
            row = self.connection.execute(_INSERT, params).fetchone()
        except errors.UniqueViolation as error:
            if error.diag.constraint_name != EXTERNAL_ID_INDEX:
                raise
            return None  # another create won the race: the general path finds it
        if row is None:
            return None  # no workspace, no intake step, or a WIP limit to admit against
        task_id, identifier = row
        return Task(
            id=task_id,
            workspace_id=workspace_id,
            identifier=identifier,
            external_id=external_id,
            created_by_delivery=delivery_pk,
        )

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
