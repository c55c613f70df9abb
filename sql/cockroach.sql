-- CockroachDB-only settings for the crdbwork schema. Apply after schema.sql:
--   cockroach sql --url "$DATABASE_URL" --file sql/cockroach.sql
-- PostgreSQL has no twin for these statements and needs none: its VACUUM
-- reclaims the dead rows that heartbeats, claims and acks leave behind.
--
-- The claim indexes, covering the claims' filter columns (see
-- cockroachIndexes in sql/cockroach.go for why PostgreSQL keeps the plain
-- ones). The Go API (sql.Apply) creates these in place of schema.sql's
-- crdbwork_items_turn_next and crdbwork_items_part_turn, so that applying
-- the schema again builds nothing; with the cockroach CLI, apply schema.sql
-- once and then this file (applying schema.sql again recreates the plain
-- indexes, which this file then drops). Idempotent.
CREATE INDEX IF NOT EXISTS crdbwork_items_turn_next_stored
    ON crdbwork_items (queue, priority, turn_at, part)
    STORING (vesting_at, attempts, max_attempts, expires_at, tenant) WHERE claim IS NULL;
DROP INDEX IF EXISTS crdbwork_items_turn_next;
CREATE INDEX IF NOT EXISTS crdbwork_items_part_turn_stored
    ON crdbwork_items (queue, part, priority, turn_at)
    STORING (vesting_at, attempts, max_attempts, expires_at, tenant) WHERE claim IS NULL;
DROP INDEX IF EXISTS crdbwork_items_part_turn;

-- Heartbeats rewrite session rows every second and every ack deletes an item,
-- so these tables collect MVCC garbage quickly. A short garbage-collection
-- TTL keeps scans of them fast. Idempotent.
ALTER TABLE crdbwork_sessions CONFIGURE ZONE USING gc.ttlseconds = 600;
ALTER TABLE crdbwork_session_parts CONFIGURE ZONE USING gc.ttlseconds = 600;
ALTER TABLE crdbwork_items CONFIGURE ZONE USING gc.ttlseconds = 600;
-- Every ack, cancel and death writes a row here and the reaper's pruning
-- deletes it once the queue's dedup window has passed, from the head of
-- crdbwork_ended_by_age, where the deleted entries would otherwise wait.
ALTER TABLE crdbwork_ended CONFIGURE ZONE USING gc.ttlseconds = 600;
-- A death inserts a row here; retention (the reapers' pruning, oldest
-- first through crdbwork_dead_items_by_queue), requeues and purges delete
-- them. The pruning and the dashboard's dead count read that index from the
-- oldest end, where the deleted entries lie.
ALTER TABLE crdbwork_dead_items CONFIGURE ZONE USING gc.ttlseconds = 600;
-- Dependencies: an item enqueued with prerequisites waits here and is
-- deleted when it moves to crdbwork_items (or dies); every ack of a
-- prerequisite lowers its dependents' remaining count (a new version of
-- their rows) and deletes its edges. The sweeps read both tables in order
-- from the start of each queue (crdbwork_waiting_by_queue, the edges'
-- primary key), where the moved rows and released edges lie.
ALTER TABLE crdbwork_waiting CONFIGURE ZONE USING gc.ttlseconds = 600;
ALTER TABLE crdbwork_waits_for CONFIGURE ZONE USING gc.ttlseconds = 600;
ALTER TABLE crdbwork_waits_across CONFIGURE ZONE USING gc.ttlseconds = 600;
-- Cancelled items kept for a requeue (version 6): every cancel writes a row
-- and the reapers' pruning deletes it once the dedup window has passed,
-- oldest first through crdbwork_cancelled_items_by_age.
ALTER TABLE crdbwork_cancelled_items CONFIGURE ZONE USING gc.ttlseconds = 600;
-- Attempt errors (version 6): every failed attempt rewrites its item's row
-- (a new version) and the reapers' retention deletes rows oldest first
-- through crdbwork_attempt_errors_by_age.
ALTER TABLE crdbwork_attempt_errors CONFIGURE ZONE USING gc.ttlseconds = 600;
-- Reap turns (version 6): a handful of rows, each rewritten every few
-- seconds (the turn to reap expired sessions about every two heartbeats,
-- each queue's about every five), read by primary key with every
-- heartbeat.
ALTER TABLE crdbwork_reaps CONFIGURE ZONE USING gc.ttlseconds = 600;
