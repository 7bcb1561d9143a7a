-- The bare create, as a hand-written service would run it on taskhook's own
-- schema: look the external id up, take the workspace's next identifier,
-- insert the task and commit; then settle it and commit. No inbox row, no
-- source link, no event. bench/pgcreate.py runs it with pgbench against the
-- benchmark's database, with -D workspace=<id> -D run=<n> -D n=0; the
-- external id is distinct per run, client and transaction.
\set n :n + 1
BEGIN;
SELECT id FROM tasks
  WHERE workspace_id = :workspace AND external_id = 'pgbench-' || :run || '-' || :client_id || '-' || :n;
UPDATE workspaces SET task_sequence = task_sequence + 1 WHERE id = :workspace
  RETURNING task_prefix || '-' || task_sequence AS identifier \gset
INSERT INTO tasks (workspace_id, identifier, title, step_id, external_id, created_at, updated_at)
  VALUES (:workspace, :identifier, 'pgbench task',
          (SELECT id FROM workflow_steps WHERE workspace_id = :workspace ORDER BY position LIMIT 1),
          'pgbench-' || :run || '-' || :client_id || '-' || :n, now(), now())
  RETURNING id AS task \gset
COMMIT;
UPDATE tasks SET external_id_settled_at = now()
  WHERE id = :task AND external_id = 'pgbench-' || :run || '-' || :client_id || '-' || :n
    AND external_id_settled_at IS NULL;
