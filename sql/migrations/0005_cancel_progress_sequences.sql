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

-- == retention ==

-- == sequences ==

-- == dependencies ==

-- == trace context and enqueue from SQL ==

-- == audit ==

INSERT INTO crdbwork_schema_version AS v (singleton, version, installed) VALUES (true, 3, 5)
    ON CONFLICT (singleton) DO UPDATE
    SET version = GREATEST(v.version, excluded.version),
        installed = GREATEST(v.installed, excluded.installed), applied_at = now();
