-- The contract's writes, as a hand-written service would run them on
-- taskhook's schema: the bare create (bench/pgbench_create.sql) plus what
-- docs/contract.md asks of every create that a delivery drives -- the
-- delivery's lease, with the new task's id as its fence, in the create's
-- transaction; then the source link, the settlement, the event at the
-- workspace stream's next position and the delivery's record, in one more.
-- The same rows and indexes taskhook's fast path writes, statement by
-- statement, with none of its checks. bench/pgcreate.py runs it with
-- pgbench against queued deliveries it stored beforehand, with
-- -D workspace=<id> -D run=<n> -D n=0 -D first=<first delivery id>
-- -D per_client=<deliveries per client>.
\set n :n + 1
\set delivery :first + :client_id * :per_client + :n - 1
BEGIN;
SELECT nextval(pg_get_serial_sequence('tasks', 'id')) AS task \gset
UPDATE deliveries SET status = 'processing', attempts = attempts + 1,
    lease_expires_at = now() + interval '60 seconds', updated_at = now(), created_task_id = :task
  WHERE id = :delivery AND status = 'queued'
  RETURNING attempts AS attempt \gset
SELECT id FROM tasks
  WHERE workspace_id = :workspace AND external_id = 'contract-' || :run || '-' || :client_id || '-' || :n;
UPDATE workspaces SET task_sequence = task_sequence + 1 WHERE id = :workspace
  RETURNING task_prefix || '-' || task_sequence AS identifier \gset
INSERT INTO tasks (id, workspace_id, identifier, title, step_id, external_id, created_by_delivery,
                   created_at, updated_at)
  VALUES (:task, :workspace, :identifier, 'contract task',
          (SELECT id FROM workflow_steps WHERE workspace_id = :workspace ORDER BY position LIMIT 1),
          'contract-' || :run || '-' || :client_id || '-' || :n, :delivery, now(), now());
COMMIT;
BEGIN;
INSERT INTO task_sources (task_id, provider, url, remote_key, created_at)
  VALUES (:task, 'github', 'https://github.com/Codertocat/Hello-World/issues/' || :n, 'Codertocat/Hello-World#' || :n, now());
UPDATE tasks SET external_id_settled_at = now()
  WHERE id = :task AND external_id = 'contract-' || :run || '-' || :client_id || '-' || :n
    AND external_id_settled_at IS NULL;
INSERT INTO event_streams (workspace_id, last_position) VALUES (:workspace, 1)
  ON CONFLICT (workspace_id) DO UPDATE SET last_position = event_streams.last_position + 1
  RETURNING last_position AS position \gset
INSERT INTO task_events (workspace_id, position, type, task_id, external_id, occurred_at)
  VALUES (:workspace, :position, 'task.created', :task,
          'contract-' || :run || '-' || :client_id || '-' || :n, now());
UPDATE deliveries SET status = 'done', status_reason = NULL, outcome = 'created', task_id = :task,
    lease_expires_at = NULL, updated_at = now()
  WHERE id = :delivery AND attempts = :attempt AND status = 'processing';
COMMIT;
