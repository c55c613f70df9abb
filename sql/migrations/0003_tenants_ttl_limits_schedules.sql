-- crdbwork migration 3: tenants and fair claim order, item deadlines (TTL),
-- at-most-once items, fleet-wide limits, periodic schedules, dead-item reasons.
--
-- Upgrades a version-2 database in place. Plain SQL accepted unchanged by
-- PostgreSQL 15+ and CockroachDB 23.1+:
--   psql -v ON_ERROR_STOP=1 -f sql/migrations/0003_tenants_ttl_limits_schedules.sql "$DATABASE_URL"
--   cockroach sql --url "$DATABASE_URL" --file sql/migrations/0003_tenants_ttl_limits_schedules.sql
-- Every statement is idempotent (a migration interrupted half-way may be run
-- again), and the file ends by raising the version row, never lowering it.
--
-- Claims order items by (priority, turn_at) instead of (priority,
-- vesting_at), so the two claim indexes are replaced. Stop version-2
-- workers before applying it, or expect them to claim more slowly until
-- they are replaced: their claims no longer find an index in their order,
-- and their nacks move vesting_at without turn_at. Nothing is lost or claimed
-- twice either way. New code refuses to run until the version row says 3
-- (crsql.Check). On PostgreSQL, CREATE INDEX blocks writes to the items table
-- while it builds and the UPDATE rewrites every item row once; on
-- CockroachDB the index changes are online schema changes, and the UPDATE
-- runs as one transaction (for a backlog of millions, run it by hand in
-- batches first: UPDATE ... WHERE id IN (SELECT id ... LIMIT 10000)).

-- The tenant an item belongs to (a user, an account): NULL for none. Fair
-- queues spread claims over tenants; limits may be set per tenant.
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS tenant TEXT;

-- The item's turn: claims take items in (priority, turn_at) order. It is
-- the vesting time, except in fair queues, where enqueue stamps each
-- tenant's items one turn apart (see sql.Statements.FairTurns). Existing
-- rows get their vesting time (rows without a tenant are never stamped, so
-- running this again changes nothing).
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS turn_at TIMESTAMPTZ NOT NULL DEFAULT now();
UPDATE crdbwork_items SET turn_at = vesting_at WHERE turn_at <> vesting_at AND tenant IS NULL;

-- The item's deadline (NULL: none). Past it the item is never handed out
-- again, and the reaper moves it to the dead items with reason 'expired'.
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS expires_at TIMESTAMPTZ;

-- At-most-once items are deleted by the claim that hands them out.
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS at_most_once BOOL NOT NULL DEFAULT false;

-- Why an item died ('failed', 'permanent', 'crash loop', 'expired'), and
-- its tenant.
ALTER TABLE crdbwork_dead_items ADD COLUMN IF NOT EXISTS tenant TEXT;
ALTER TABLE crdbwork_dead_items ADD COLUMN IF NOT EXISTS reason TEXT NOT NULL DEFAULT '';

-- Per-queue settings, read by every producer and worker of the queue.
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS fair BOOL NOT NULL DEFAULT false;
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS at_most_once BOOL NOT NULL DEFAULT false;
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS max_in_flight BIGINT NOT NULL DEFAULT 0;
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS rate_limit FLOAT8 NOT NULL DEFAULT 0;
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS tenant_max_in_flight BIGINT NOT NULL DEFAULT 0;
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS tenant_rate_limit FLOAT8 NOT NULL DEFAULT 0;

-- Limits of single tenants, overriding the queue's per-tenant defaults.
CREATE TABLE IF NOT EXISTS crdbwork_tenant_limits (
    queue         TEXT   NOT NULL,
    tenant        TEXT   NOT NULL,
    max_in_flight BIGINT NOT NULL DEFAULT 0,
    rate_limit    FLOAT8 NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, tenant),
    CONSTRAINT crdbwork_tenant_limits_range CHECK (max_in_flight >= 0 AND rate_limit >= 0)
);

-- The last period each periodic schedule enqueued: a period's item is
-- enqueued in the transaction that moves last_period forward, so it is
-- enqueued once however many workers run the schedule.
CREATE TABLE IF NOT EXISTS crdbwork_schedules (
    queue       TEXT        NOT NULL,
    name        TEXT        NOT NULL,
    last_period TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, name)
);

-- The claim indexes, in turn order (replacing crdbwork_items_claim_next and
-- crdbwork_items_unclaimed, which were in vesting order).
CREATE INDEX IF NOT EXISTS crdbwork_items_turn_next
    ON crdbwork_items (queue, priority, turn_at, part) WHERE claim IS NULL;
CREATE INDEX IF NOT EXISTS crdbwork_items_part_turn
    ON crdbwork_items (queue, part, priority, turn_at) WHERE claim IS NULL;
DROP INDEX IF EXISTS crdbwork_items_claim_next;
DROP INDEX IF EXISTS crdbwork_items_unclaimed;

-- A tenant's unclaimed items in turn order: a fair queue's enqueue reads the
-- tenant's last turn through it.
CREATE INDEX IF NOT EXISTS crdbwork_items_tenant_turn
    ON crdbwork_items (queue, tenant, priority, turn_at) WHERE claim IS NULL AND tenant IS NOT NULL;

-- Items with a deadline, by deadline: the reaper reads only expired ones.
CREATE INDEX IF NOT EXISTS crdbwork_items_expiry
    ON crdbwork_items (queue, expires_at) WHERE expires_at IS NOT NULL;

INSERT INTO crdbwork_schema_version AS v (singleton, version) VALUES (true, 3)
    ON CONFLICT (singleton) DO UPDATE
    SET version = GREATEST(v.version, excluded.version), applied_at = now();
