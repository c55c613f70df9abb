-- crdbwork schema version 5: running items cancelled from outside, snooze,
-- checkpoints and progress, retention, sequences, dependencies, trace
-- context, enqueue from SQL, and the operators' audit list. Every statement
-- is idempotent; the last one raises the version row. Version-3 and -4 code
-- keeps working on this schema (it serves version 3 and newer).

-- == cancel and snooze ==
-- A cancel asked of a claimed item (when, by whom, why), and how often the
-- item was snoozed; for cancelled items, who cancelled them, why, when, and
-- whether a handler was running them. Version-3 and -4 code ignores these
-- columns: a cancel request bumps the item's claim token, which fences their
-- acks, extensions and nacks (docs/cancel-and-snooze.md).
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS cancel_requested_at TIMESTAMPTZ;
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS cancel_by TEXT;
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS cancel_reason TEXT;
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS snoozes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE crdbwork_ended ADD COLUMN IF NOT EXISTS cancel_by TEXT;
ALTER TABLE crdbwork_ended ADD COLUMN IF NOT EXISTS cancel_reason TEXT;
ALTER TABLE crdbwork_ended ADD COLUMN IF NOT EXISTS cancel_requested_at TIMESTAMPTZ;
ALTER TABLE crdbwork_ended ADD COLUMN IF NOT EXISTS was_running BOOL;
CREATE INDEX IF NOT EXISTS crdbwork_items_cancel_requested
    ON crdbwork_items (queue, cancel_requested_at) WHERE cancel_requested_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS crdbwork_items_snoozed
    ON crdbwork_items (queue) WHERE snoozes > 0 AND claim IS NULL;
CREATE INDEX IF NOT EXISTS crdbwork_ended_cancelled
    ON crdbwork_ended (queue, ended_at) WHERE outcome = 'cancelled';

-- == checkpoints and progress ==

-- A claimed item's checkpoint (at most 64 KiB; claim.MaxCheckpointSize) and
-- progress (done of total; total 0: unknown), saved by its handler with a
-- statement fenced on its claim, kept across attempts and returned by the
-- claims (claim.Item.Checkpoint, Progress). NULL until first saved: items
-- that never checkpoint cost nothing more. Progress saves are listed per
-- queue by time (crdbwork status) through crdbwork_items_progress.
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS checkpoint BYTEA;
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS checkpoint_at TIMESTAMPTZ;
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS progress_done BIGINT;
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS progress_total BIGINT;
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS progress_at TIMESTAMPTZ;
CREATE INDEX IF NOT EXISTS crdbwork_items_progress
    ON crdbwork_items (queue, progress_at) WHERE progress_at IS NOT NULL;

-- == retention ==

-- How long and how many dead items each queue keeps (claim.SetRetention):
-- every session's reaper prunes the older ones and those beyond the count,
-- oldest first, in bounded batches, through crdbwork_dead_items_by_queue.
-- 0 keeps them without that bound. A queue without a row keeps 30 days and
-- 100,000 (the columns' defaults).
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS dead_max_age INTERVAL NOT NULL DEFAULT INTERVAL '720 hours';
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS dead_max_count BIGINT NOT NULL DEFAULT 100000;

-- == sequences ==
-- Sequenced queues (docs/sequences.md): an item of a sequenced queue with a
-- key is claimed only when it is the first of its key's items (in the
-- order of seq_order) and no item of its key is claimed. seq_order is the
-- item's place among its key's items, stamped at enqueue in a sequenced
-- queue (NULL: the item is not sequenced).
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS sequenced BOOL NOT NULL DEFAULT false;
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS seq_order BIGINT;
-- The key's items in order: the sequenced claim's test that an item is its
-- key's first.
CREATE INDEX IF NOT EXISTS crdbwork_items_sequence_order
    ON crdbwork_items (queue, item_key, enqueued_at, seq_order, id) WHERE seq_order IS NOT NULL;
-- At most one claimed item per key of sequenced items: the database, not
-- Go code, guarantees one item in flight per key; the sequenced claim's
-- test that a key has no claimed item reads it.
CREATE UNIQUE INDEX IF NOT EXISTS crdbwork_items_sequence_claimed
    ON crdbwork_items (queue, item_key) WHERE claim IS NOT NULL AND seq_order IS NOT NULL;

-- == dependencies ==

-- Dependencies (version 5). An item enqueued with prerequisites
-- (claim.NewItem.After) that are not all acked waits here, outside the items
-- table, so that no claim, old or new, can hand it out; the ack of its last
-- prerequisite moves it into crdbwork_items in the ack's own transaction.
-- remaining counts its edges in crdbwork_waits_for not yet satisfied. The
-- columns are what the move needs to compute the item's row: hash is the
-- key hash (the part is hash modulo the queue's parts at the move), delay
-- and ttl count from enqueued_at, in microseconds.
CREATE TABLE IF NOT EXISTS crdbwork_waiting (
    id           UUID        NOT NULL PRIMARY KEY,
    queue        TEXT        NOT NULL,
    hash         BIGINT      NOT NULL,
    item_key     TEXT,
    priority     BIGINT      NOT NULL DEFAULT 0,
    delay_us     BIGINT      NOT NULL DEFAULT 0,
    max_attempts BIGINT      NOT NULL DEFAULT 25,
    payload      BYTEA       NOT NULL,
    metadata     BYTEA,
    tenant       TEXT,
    ttl_us       BIGINT      NOT NULL DEFAULT 0,
    at_most_once BOOL        NOT NULL DEFAULT false,
    enqueued_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    remaining    BIGINT      NOT NULL
);
-- Waiting items by queue: status counts.
CREATE INDEX IF NOT EXISTS crdbwork_waiting_by_queue
    ON crdbwork_waiting (queue, enqueued_at);
-- One edge per (prerequisite, dependent), both of one queue: the dependent
-- waits until the prerequisite is acked. Deleted when the prerequisite is
-- acked (remaining goes down) or ends otherwise (the dependent dies).
CREATE TABLE IF NOT EXISTS crdbwork_waits_for (
    queue     TEXT NOT NULL,
    prereq    UUID NOT NULL,
    dependent UUID NOT NULL,
    PRIMARY KEY (queue, prereq, dependent)
);
-- A dependent's prerequisites: crdbwork deps, and ending a dependent.
CREATE INDEX IF NOT EXISTS crdbwork_waits_for_by_dependent
    ON crdbwork_waits_for (queue, dependent);

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

-- Operators' actions (the dashboard's, and destructive crdbwork commands'):
-- who did what to which queue, and when. Read newest first, a page at a time.
CREATE TABLE IF NOT EXISTS crdbwork_audit (
    id      UUID        NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
    at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor   TEXT        NOT NULL,
    source  TEXT        NOT NULL,
    action  TEXT        NOT NULL,
    queue   TEXT        NOT NULL DEFAULT '',
    detail  TEXT        NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS crdbwork_audit_by_time ON crdbwork_audit (at, id);

INSERT INTO crdbwork_schema_version AS v (singleton, version, installed) VALUES (true, 3, 5)
    ON CONFLICT (singleton) DO UPDATE
    SET version = GREATEST(v.version, excluded.version),
        installed = GREATEST(v.installed, excluded.installed), applied_at = now();
