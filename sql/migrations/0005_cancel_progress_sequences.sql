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

-- == audit ==

INSERT INTO crdbwork_schema_version AS v (singleton, version, installed) VALUES (true, 3, 5)
    ON CONFLICT (singleton) DO UPDATE
    SET version = GREATEST(v.version, excluded.version),
        installed = GREATEST(v.installed, excluded.installed), applied_at = now();
