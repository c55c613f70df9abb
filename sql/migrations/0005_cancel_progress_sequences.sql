-- crdbwork schema version 5: running items cancelled from outside, snooze,
-- checkpoints and progress, retention, sequences, dependencies, trace
-- context, enqueue from SQL, and the operators' audit list. Every statement
-- is idempotent; the last one raises the version row. Version-3 and -4 code
-- keeps working on this schema (it serves version 3 and newer).

-- == cancel and snooze ==

-- == checkpoints and progress ==

-- == retention ==

-- == sequences ==

-- == dependencies ==

-- == trace context and enqueue from SQL ==

-- Trace context and other headers that travel with an item from its
-- producer to its handler (claim.NewItem.Headers, claim.Item.Headers): a
-- JSON object of string values, NULL when there are none. Nullable and
-- without a default, so adding it rewrites nothing, and code of versions 3
-- and 4, which neither writes nor reads it, leaves it NULL.
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS headers JSONB;

-- The SQL function crdbwork_enqueue (enqueue from any language) is not in
-- this file: each engine has its form, sql/enqueue_function.sql
-- (PostgreSQL) and sql/cockroach_enqueue_function.sql (CockroachDB 24.1+).
-- Package sql's Apply installs it; with psql or the cockroach CLI, apply
-- that file after this one (docs/enqueue-from-sql.md).

-- == audit ==

INSERT INTO crdbwork_schema_version AS v (singleton, version, installed) VALUES (true, 3, 5)
    ON CONFLICT (singleton) DO UPDATE
    SET version = GREATEST(v.version, excluded.version),
        installed = GREATEST(v.installed, excluded.installed), applied_at = now();
