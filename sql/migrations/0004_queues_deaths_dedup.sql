-- crdbwork migration 4: many queues in one database, every death kept,
-- idempotency that outlives the item, and rolling upgrades.
--
-- Upgrades a version-3 database in place. Plain SQL accepted unchanged by
-- PostgreSQL 15+ and CockroachDB 23.1+:
--   psql -v ON_ERROR_STOP=1 -f sql/migrations/0004_queues_deaths_dedup.sql "$DATABASE_URL"
--   cockroach sql --url "$DATABASE_URL" --file sql/migrations/0004_queues_deaths_dedup.sql
-- Every statement is idempotent (a migration interrupted half-way may be run
-- again), and the file ends by raising the version row, never lowering it.
--
-- Version-3 workers and producers keep working on the upgraded schema,
-- through session losses and restarts: the version row's `version` stays 3
-- (the oldest code this schema serves, which is what version-3 code checks),
-- and `installed` says 4. Nothing version-3 code writes or reads changes
-- meaning: version-3 sessions simply do not say which queues they work (their
-- rebalancers still count every live session, as before), their acks record
-- no ended ids (their items are deduplicated only while in the table, as
-- before), and their dead-item moves take the new key's default.

-- Which sessions work which queue. A queue's parts and its fleet-wide limit
-- shares are divided among the live sessions that work it, and only those:
-- sessions of other queues in the same database never count. A session may
-- work several queues. Deleting a session deletes its rows (CASCADE).
CREATE TABLE IF NOT EXISTS crdbwork_session_queues (
    queue      TEXT        NOT NULL,
    session_id UUID        NOT NULL,
    joined_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, session_id),
    CONSTRAINT crdbwork_session_queues_session FOREIGN KEY (session_id)
        REFERENCES crdbwork_sessions (id) ON DELETE CASCADE
);
-- Serves the foreign key's cascade when a session row is deleted.
CREATE INDEX IF NOT EXISTS crdbwork_session_queues_by_session
    ON crdbwork_session_queues (session_id);

-- Every death of an item is kept: an id enqueued again after it died (ids
-- are the caller's) may die again. Each death gets its own key. The primary
-- key is swapped in one ALTER TABLE, which both engines accept (on
-- CockroachDB, DROP CONSTRAINT and ADD CONSTRAINT ... PRIMARY KEY in one
-- statement changes the key without keeping a unique index on the old one).
-- Running it again rebuilds the key, which changes nothing.
ALTER TABLE crdbwork_dead_items ADD COLUMN IF NOT EXISTS death UUID NOT NULL DEFAULT gen_random_uuid();
ALTER TABLE crdbwork_dead_items DROP CONSTRAINT crdbwork_dead_items_pkey,
    ADD CONSTRAINT crdbwork_dead_items_pkey PRIMARY KEY (id, death);

-- Items that ended (acked, dead, cancelled, taken at most once), by queue and id, kept
-- for the queue's dedup window: an enqueue of an id found here within the
-- window is a duplicate, even though the item has left the items table. So
-- a producer that retries after an unknown outcome never runs work twice.
-- Pruned in bounded batches by every session's reaper.
CREATE TABLE IF NOT EXISTS crdbwork_ended (
    queue    TEXT        NOT NULL,
    id       UUID        NOT NULL,
    ended_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- 'acked', 'dead', 'cancelled' or 'taken' (an at-most-once item handed out by a claim).
    outcome  TEXT        NOT NULL,
    PRIMARY KEY (queue, id)
);
CREATE INDEX IF NOT EXISTS crdbwork_ended_by_age
    ON crdbwork_ended (queue, ended_at);

-- How long a queue remembers ended ids (0: not at all). A queue without a
-- row has the default, one day.
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS dedup_window INTERVAL NOT NULL DEFAULT INTERVAL '24 hours';

-- The schema's own version (`version` is now the oldest code version the
-- schema still serves: version-3 code checks that it equals 3).
ALTER TABLE crdbwork_schema_version ADD COLUMN IF NOT EXISTS installed BIGINT NOT NULL DEFAULT 0;

INSERT INTO crdbwork_schema_version AS v (singleton, version, installed) VALUES (true, 3, 4)
    ON CONFLICT (singleton) DO UPDATE
    SET version = GREATEST(v.version, excluded.version),
        installed = GREATEST(v.installed, excluded.installed), applied_at = now();
