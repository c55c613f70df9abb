-- crdbwork migration 2: claim tokens, leases, paused queues, session counters.
--
-- Upgrades a version-1 database in place. Plain SQL accepted unchanged by
-- PostgreSQL 15+ and CockroachDB 23.1+:
--   psql -v ON_ERROR_STOP=1 -f sql/migrations/0002_leases_tokens_pause.sql "$DATABASE_URL"
--   cockroach sql --url "$DATABASE_URL" --file sql/migrations/0002_leases_tokens_pause.sql
-- Every statement is idempotent (a migration interrupted half-way may be run
-- again), and the file ends by raising the version row, never lowering it.
--
-- Safe while version-1 workers run: it only adds columns with constant
-- defaults (no table rewrite on either engine) and indexes, and replaces the
-- queue-wide index over unclaimed items (crdbwork_items_claim_order) by one
-- with the part in its key; the per-part index stays.
-- Version-1 statements never name the new columns, so old workers keep
-- claiming, acking and nacking as before; they ignore pauses and take no
-- leases (their claims have no lease_until, so the lease reaper leaves them
-- alone, and their sessions' expiry still releases them). New code refuses to
-- run until the version row says 2 (crsql.Check), so apply this first, then
-- roll out the new workers. On PostgreSQL, CREATE INDEX holds a lock that
-- blocks writes to the items table while it builds (seconds for millions of
-- rows) and DROP INDEX waits for running transactions; on CockroachDB both
-- are online schema changes.

-- The fencing token: incremented by every claim, never decremented, so that
-- a stale copy of an item can never ack, nack or release a newer claim.
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS claim_token BIGINT NOT NULL DEFAULT 0;

-- The claim's lease, by the database clock: past it, any session's reaper
-- releases the item (fenced by the token).
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS lease_until TIMESTAMPTZ;

-- A dead item keeps its last token, so that a requeued item's tokens keep
-- growing instead of starting again at 1.
ALTER TABLE crdbwork_dead_items ADD COLUMN IF NOT EXISTS claim_token BIGINT NOT NULL DEFAULT 0;

-- Claims of a paused queue return nothing.
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS paused BOOL NOT NULL DEFAULT false;

-- Counters each session reports with its heartbeats (totals since it started).
ALTER TABLE crdbwork_sessions ADD COLUMN IF NOT EXISTS claimed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE crdbwork_sessions ADD COLUMN IF NOT EXISTS acked BIGINT NOT NULL DEFAULT 0;
ALTER TABLE crdbwork_sessions ADD COLUMN IF NOT EXISTS failed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE crdbwork_sessions ADD COLUMN IF NOT EXISTS in_flight BIGINT NOT NULL DEFAULT 0;

-- Unclaimed items of a queue in claim order (the part last): the any-part
-- claim reads (and locks) through it, in order, stopping at its limit. The
-- per-part claim reads crdbwork_items_unclaimed (queue, part, priority,
-- vesting_at), kept from migration 1: each owned part in order with its own
-- limit, so that its cost does not grow with other parts' backlog.
CREATE INDEX IF NOT EXISTS crdbwork_items_claim_next
    ON crdbwork_items (queue, priority, vesting_at, part) WHERE claim IS NULL;

-- Superseded by crdbwork_items_claim_next. (CockroachDB accepts an index
-- name without its table here: its grammar's standalone_index_name.)
DROP INDEX IF EXISTS crdbwork_items_claim_order;

-- Claimed items by lease end: the lease reaper reads only expired leases.
CREATE INDEX IF NOT EXISTS crdbwork_items_lease
    ON crdbwork_items (queue, lease_until) WHERE claim IS NOT NULL;

-- Unclaimed items whose attempts are used up (a crash loop): claims skip
-- them and the reaper moves them to the dead items. Normally empty.
CREATE INDEX IF NOT EXISTS crdbwork_items_exhausted
    ON crdbwork_items (queue) WHERE claim IS NULL AND attempts >= max_attempts;

INSERT INTO crdbwork_schema_version AS v (singleton, version) VALUES (true, 2)
    ON CONFLICT (singleton) DO UPDATE
    SET version = GREATEST(v.version, excluded.version), applied_at = now();
