-- crdbwork schema version 5: running items cancelled from outside, snooze,
-- checkpoints and progress, retention, sequences, dependencies, trace
-- context, enqueue from SQL, and the operators' audit list. Every statement
-- is idempotent; the last one raises the version row. Version-3 and -4 code
-- keeps working on this schema (it serves version 3 and newer).

-- == cancel and snooze ==

-- == checkpoints and progress ==

-- == retention ==

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

-- == trace context and enqueue from SQL ==

-- == audit ==

INSERT INTO crdbwork_schema_version AS v (singleton, version, installed) VALUES (true, 3, 5)
    ON CONFLICT (singleton) DO UPDATE
    SET version = GREATEST(v.version, excluded.version),
        installed = GREATEST(v.installed, excluded.installed), applied_at = now();
