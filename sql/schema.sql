-- crdbwork schema, version 6: the complete current schema.
--
-- Plain SQL accepted unchanged by PostgreSQL 15+ and CockroachDB 23.1+:
--   psql -v ON_ERROR_STOP=1 -f sql/schema.sql "$DATABASE_URL"
--   cockroach sql --url "$DATABASE_URL" --file sql/schema.sql
-- It creates the schema on a database that has none, and may be applied
-- again to a database at this version (every statement is idempotent). It
-- creates each table complete, so a fresh install prints no "already exists"
-- notices. A database created by an older version is upgraded by the
-- numbered migrations in sql/migrations/ instead (or by package sql's Apply,
-- which runs them); this file refuses it before changing anything (the check
-- after the version table below). CockroachDB-only settings live beside it in
-- sql/cockroach.sql.
--
-- The Go API (package sql, Apply) applies this same file with the names
-- rewritten for a configured prefix or schema.

-- The schema version. `installed` is the schema's version; `version` is the
-- oldest code version the schema still serves (code of versions 1 to 3
-- checks that it equals their own, so an upgrade that keeps serving them
-- leaves it at 3). The table comes first so that the check below can read
-- it; its row is written last, so that the row's presence means the schema
-- is complete. Applying an older file never lowers it.
CREATE TABLE IF NOT EXISTS crdbwork_schema_version (
    singleton  BOOL        NOT NULL DEFAULT true PRIMARY KEY,
    version    BIGINT      NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    installed  BIGINT      NOT NULL DEFAULT 0,
    CONSTRAINT crdbwork_schema_version_one_row CHECK (singleton)
);

-- A database with an older crdbwork schema (versions 1 to 3, whose version
-- table has no column `installed`) STOPS HERE, with an error that the column
-- "installed" does not exist, before anything was changed: upgrade it with
-- the files in sql/migrations/ (those above its version, in order) or with
-- package sql's Apply. On a fresh or current database this changes nothing.
UPDATE crdbwork_schema_version SET installed = installed WHERE false;

-- A database at version 4 or 5 (or with an interrupted migration) STOPS HERE
-- too, before anything was changed, with an error that quotes this message
-- (as text that is not a number): upgrade it as above.
SELECT CAST('crdbwork: the database has an older crdbwork schema, version ' || installed::TEXT ||
            ': upgrade it with `crdbwork migrate`, package sql''s Apply or the files in sql/migrations/' AS BIGINT)
FROM crdbwork_schema_version WHERE installed < 6;

-- One row per live worker process. A session proves it is alive by moving
-- heartbeat_at forward (with the database clock); any peer deletes the rows
-- whose heartbeat_at + expiry lies in the past.
CREATE TABLE IF NOT EXISTS crdbwork_sessions (
    id           UUID        NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expiry       INTERVAL    NOT NULL,
    host         TEXT        NOT NULL DEFAULT '',
    pid          BIGINT      NOT NULL DEFAULT 0,
    name         TEXT        NOT NULL DEFAULT '',
    -- Totals the session reports with its heartbeats.
    claimed      BIGINT      NOT NULL DEFAULT 0,
    acked        BIGINT      NOT NULL DEFAULT 0,
    failed       BIGINT      NOT NULL DEFAULT 0,
    in_flight    BIGINT      NOT NULL DEFAULT 0
);

-- Queues that are divided into parts. A queue without a row has one part.
-- num_parts is fixed per queue; changing it is an explicit operation
-- (partition.SetParts) because it moves keys between parts.
CREATE TABLE IF NOT EXISTS crdbwork_queues (
    name       TEXT        NOT NULL PRIMARY KEY,
    num_parts  BIGINT      NOT NULL DEFAULT 1,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Claims of a paused queue return nothing.
    paused     BOOL        NOT NULL DEFAULT false,
    -- Settings (sql/migrations/0003): fair claim order across tenants,
    -- at-most-once delivery, and fleet-wide limits (0: none) of the queue
    -- and of each of its tenants.
    fair                 BOOL   NOT NULL DEFAULT false,
    at_most_once         BOOL   NOT NULL DEFAULT false,
    max_in_flight        BIGINT NOT NULL DEFAULT 0,
    rate_limit           FLOAT8 NOT NULL DEFAULT 0,
    tenant_max_in_flight BIGINT NOT NULL DEFAULT 0,
    tenant_rate_limit    FLOAT8 NOT NULL DEFAULT 0,
    -- How long ended ids are remembered for deduplication (0: not at all);
    -- a queue without a row has the default.
    dedup_window         INTERVAL NOT NULL DEFAULT INTERVAL '24 hours',
    -- History (version 6): how long ended records are kept for the items'
    -- history; they stay for the longer of it and dedup_window.
    history_window       INTERVAL NOT NULL DEFAULT INTERVAL '24 hours',
    -- Retention (version 5): how long and how many dead items the queue
    -- keeps (0: no such bound); a queue without a row keeps 30 days and
    -- 100,000.
    dead_max_age         INTERVAL NOT NULL DEFAULT INTERVAL '720 hours',
    dead_max_count       BIGINT   NOT NULL DEFAULT 100000,

    -- Sequences (version 5): one item in flight per key, claimed in
    -- enqueue order (docs/sequences.md); and (version 6) whether a death of
    -- a sequenced item holds its key (true) or lets it advance (false).
    sequenced            BOOL   NOT NULL DEFAULT false,
    sequence_hold        BOOL   NOT NULL DEFAULT false,
    -- The queue's change counter (version 6): raised in the statement that
    -- changes its members or part owners (a join or leave, a session's
    -- deletion, a part acquired or released) or its number of parts. Each
    -- session reads it with its heartbeat; a rebalancer reads members and
    -- owners only when it moved (package partition).
    changes              BIGINT NOT NULL DEFAULT 0,
    CONSTRAINT crdbwork_queues_num_parts_range CHECK (num_parts BETWEEN 1 AND 4096)
);

-- Which sessions work which queue (schema version 4). A queue's parts and
-- its fleet-wide limit shares are divided among the live sessions that work
-- it, and only those. A session may work several queues.
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

-- Which session owns which part of which queue. Deleting a session deletes
-- its parts (CASCADE); the unique constraint makes the database, not Go code,
-- guarantee one owner per part.
CREATE TABLE IF NOT EXISTS crdbwork_session_parts (
    session_id  UUID        NOT NULL,
    queue       TEXT        NOT NULL,
    part        BIGINT      NOT NULL,
    acquired_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, queue, part),
    CONSTRAINT crdbwork_session_parts_one_owner UNIQUE (queue, part),
    CONSTRAINT crdbwork_session_parts_session FOREIGN KEY (session_id)
        REFERENCES crdbwork_sessions (id) ON DELETE CASCADE
);

-- The work items. An item is claimed by writing a session id into claim (and,
-- in parts mode, the part into claim_queue/claim_part; every claim writes all
-- three). Both foreign keys release the claim when the session or its part
-- row goes away. claim_token is incremented by every claim and never
-- decremented: acks, nacks and releases fence on (claim, claim_token).
-- lease_until is the claim's lease by the database clock; past it, any
-- session's reaper releases the item.
CREATE TABLE IF NOT EXISTS crdbwork_items (
    id           UUID        NOT NULL PRIMARY KEY,
    queue        TEXT        NOT NULL,
    part         BIGINT      NOT NULL DEFAULT 0,
    item_key     TEXT,
    priority     BIGINT      NOT NULL DEFAULT 0,
    vesting_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    enqueued_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempts     BIGINT      NOT NULL DEFAULT 0,
    max_attempts BIGINT      NOT NULL DEFAULT 25,
    payload      BYTEA       NOT NULL,
    metadata     BYTEA,
    last_error   TEXT,
    claim        UUID,
    claim_queue  TEXT,
    claim_part   BIGINT,
    claimed_at   TIMESTAMPTZ,
    claim_token  BIGINT      NOT NULL DEFAULT 0,
    lease_until  TIMESTAMPTZ,
    -- The tenant (NULL: none); the item's turn, its place in claim order
    -- within its priority (the vesting time, except in fair queues, where
    -- enqueue stamps it); its deadline (NULL: none); and whether its claim
    -- deletes it (at-most-once delivery).
    tenant       TEXT,
    turn_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ,
    at_most_once BOOL        NOT NULL DEFAULT false,
    -- Cancel and snooze (schema version 5): a cancel asked of the item while
    -- it was claimed (when, by whom, why; NULL: none asked), and how often
    -- its handlers snoozed it.
    cancel_requested_at TIMESTAMPTZ,
    cancel_by           TEXT,
    cancel_reason       TEXT,
    snoozes             BIGINT      NOT NULL DEFAULT 0,

    -- Checkpoints and progress (version 5): the handler's checkpoint (at
    -- most 64 KiB) and progress (done of total; total 0: unknown), kept
    -- across attempts; NULL until first saved.
    checkpoint     BYTEA,
    checkpoint_at  TIMESTAMPTZ,
    progress_done  BIGINT,
    progress_total BIGINT,
    progress_at    TIMESTAMPTZ,

    -- Sequences (version 5): the item's place among its key's items in a
    -- sequenced queue (NULL: not sequenced).
    seq_order    BIGINT,

    -- Trace context and other headers (version 5): a JSON object of string
    -- values that travels from the producer to the handler; NULL: none.
    headers      JSONB,

    -- The item's own handler timeout in microseconds (version 6; NULL:
    -- none, the worker's ItemTimeout).
    timeout_us   BIGINT,

    -- The item's kind (version 6; NULL: none): which of a worker's typed
    -- handlers runs it (docs/kinds.md).
    kind         TEXT,
    CONSTRAINT crdbwork_items_claim_session FOREIGN KEY (claim)
        REFERENCES crdbwork_sessions (id) ON DELETE SET NULL,
    CONSTRAINT crdbwork_items_claim_part FOREIGN KEY (claim, claim_queue, claim_part)
        REFERENCES crdbwork_session_parts (session_id, queue, part) ON DELETE SET NULL,
    CONSTRAINT crdbwork_items_claim_in_own_part
        CHECK (claim_part IS NULL OR (claim_queue = queue AND claim_part = part)),
    CONSTRAINT crdbwork_items_attempts_range CHECK (attempts >= 0 AND max_attempts >= 1)
);

-- (The claim indexes follow the upgrade section below: they name columns
-- that an older version's tables gain there.)

-- Claimed items by claimant: serves the foreign keys' SET NULL when a session
-- or part row is deleted, and status queries.
CREATE INDEX IF NOT EXISTS crdbwork_items_claimed
    ON crdbwork_items (claim, claim_queue, claim_part) WHERE claim IS NOT NULL;

-- Items that ran out of attempts or failed permanently, with their last
-- error: one row per death (an id enqueued again after it died may die
-- again; each death has its own key).
CREATE TABLE IF NOT EXISTS crdbwork_dead_items (
    id           UUID        NOT NULL,
    death        UUID        NOT NULL DEFAULT gen_random_uuid(),
    queue        TEXT        NOT NULL,
    part         BIGINT      NOT NULL,
    item_key     TEXT,
    priority     BIGINT      NOT NULL,
    attempts     BIGINT      NOT NULL,
    max_attempts BIGINT      NOT NULL,
    payload      BYTEA       NOT NULL,
    metadata     BYTEA,
    last_error   TEXT,
    enqueued_at  TIMESTAMPTZ NOT NULL,
    died_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The item's last claim token, carried over when it is requeued.
    claim_token  BIGINT      NOT NULL DEFAULT 0,
    tenant       TEXT,
    -- Why it died: 'failed' (attempts used up), 'permanent', 'crash loop',
    -- 'expired'.
    reason       TEXT        NOT NULL DEFAULT '',
    -- Sequences (version 6): the item's place in its key's sequence (NULL:
    -- not sequenced), given back by a requeue, and whether it holds its key
    -- (it died in a queue whose sequence_hold was on).
    seq_order    BIGINT,
    seq_hold     BOOL        NOT NULL DEFAULT false,
    -- Its kind (version 6; NULL: none), given back by a requeue.
    kind         TEXT,
    CONSTRAINT crdbwork_dead_items_pkey PRIMARY KEY (id, death)
);

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
    -- A stored schedule's definition (version 6; package schedule's JSON),
    -- NULL for one defined in code; paused: no version-6 runner enqueues
    -- its periods. A stored schedule not yet fired has last_period
    -- 1970-01-01.
    spec        JSONB,
    paused      BOOL        NOT NULL DEFAULT false,
    PRIMARY KEY (queue, name)
);

-- Items that ended (acked, dead, cancelled, taken at most once), kept for their
-- queue's dedup window: an enqueue of an id found here within the window is
-- a duplicate although the item has left the items table, so a producer's
-- retry after an unknown outcome never runs work twice. Pruned in bounded
-- batches by every session's reaper.
CREATE TABLE IF NOT EXISTS crdbwork_ended (
    queue    TEXT        NOT NULL,
    id       UUID        NOT NULL,
    ended_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- 'acked', 'dead', 'cancelled' or 'taken' (an at-most-once item handed out by a claim).
    outcome  TEXT        NOT NULL,
    -- Cancel and snooze (schema version 5), for outcome 'cancelled': who
    -- cancelled it and why, when the cancel was asked for, and whether a
    -- handler was running it then.
    cancel_by           TEXT,
    cancel_reason       TEXT,
    cancel_requested_at TIMESTAMPTZ,
    was_running         BOOL,
    -- History (version 6): the item's attempts, enqueue time, its last
    -- attempt's start (claim time) and session; its failed attempts are in
    -- crdbwork_attempt_errors. NULL attempts: written by code older than
    -- version 6, no history recorded.
    attempts            BIGINT,
    enqueued_at         TIMESTAMPTZ,
    started_at          TIMESTAMPTZ,
    session             UUID,
    -- The item's kind (version 6; NULL: none, or written by code older
    -- than version 6, which records none).
    kind                TEXT,
    PRIMARY KEY (queue, id)
);
CREATE INDEX IF NOT EXISTS crdbwork_ended_by_age
    ON crdbwork_ended (queue, ended_at);

CREATE INDEX IF NOT EXISTS crdbwork_dead_items_by_queue
    ON crdbwork_dead_items (queue, died_at);

-- Unclaimed items in claim order (priority, turn), two ways. By queue (the
-- part last): the any-part claim reads (and locks) through it, in order,
-- stopping at its limit however long the backlog. By part: the per-part
-- claim reads each owned part in order with its own limit, so that its cost
-- does not grow with the backlog of other parts; also per-part backlog counts.
CREATE INDEX IF NOT EXISTS crdbwork_items_turn_next
    ON crdbwork_items (queue, priority, turn_at, part) WHERE claim IS NULL;
CREATE INDEX IF NOT EXISTS crdbwork_items_part_turn
    ON crdbwork_items (queue, part, priority, turn_at) WHERE claim IS NULL;

-- A tenant's unclaimed items in turn order: a fair queue's enqueue reads the
-- tenant's last turn through it.
CREATE INDEX IF NOT EXISTS crdbwork_items_tenant_turn
    ON crdbwork_items (queue, tenant, priority, turn_at) WHERE claim IS NULL AND tenant IS NOT NULL;

-- Items with a deadline, by deadline: the reaper reads only expired ones.
CREATE INDEX IF NOT EXISTS crdbwork_items_expiry
    ON crdbwork_items (queue, expires_at) WHERE expires_at IS NOT NULL;

-- Claimed items by lease end: the lease reaper reads only expired leases.
CREATE INDEX IF NOT EXISTS crdbwork_items_lease
    ON crdbwork_items (queue, lease_until) WHERE claim IS NOT NULL;

-- Unclaimed items whose attempts are used up (a crash loop): claims skip
-- them and the reaper moves them to the dead items. Normally empty.
CREATE INDEX IF NOT EXISTS crdbwork_items_exhausted
    ON crdbwork_items (queue) WHERE claim IS NULL AND attempts >= max_attempts;

-- checkpoints and progress (version 5)
-- Items with a saved progress, by queue and time: crdbwork status lists
-- them without reading the queue's other items.
CREATE INDEX IF NOT EXISTS crdbwork_items_progress
    ON crdbwork_items (queue, progress_at) WHERE progress_at IS NOT NULL;

-- audit (version 5)
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

-- sequences (version 5): a sequenced queue's keys run one item at a time,
-- in order (docs/sequences.md). The key's items in order, and at most one
-- claimed item per key of sequenced items (the database enforces it).
CREATE INDEX IF NOT EXISTS crdbwork_items_sequence_order
    ON crdbwork_items (queue, item_key, enqueued_at, seq_order, id) WHERE seq_order IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS crdbwork_items_sequence_claimed
    ON crdbwork_items (queue, item_key) WHERE claim IS NOT NULL AND seq_order IS NOT NULL;
-- (version 6) The dead items that hold their keys, in their keys' order: the
-- sequenced claims' test that no earlier dead item holds a candidate's key,
-- and the list of blocked keys. Normally empty.
CREATE INDEX IF NOT EXISTS crdbwork_dead_items_sequence_held
    ON crdbwork_dead_items (queue, item_key, enqueued_at, seq_order, id) WHERE seq_hold;

-- cancel and snooze (version 5)
-- Items a cancel was asked of while they were claimed: each session looks
-- for its own at every heartbeat, and the reaper ends those whose handler
-- is gone. Normally empty.
CREATE INDEX IF NOT EXISTS crdbwork_items_cancel_requested
    ON crdbwork_items (queue, cancel_requested_at) WHERE cancel_requested_at IS NOT NULL;
-- Unclaimed items that were snoozed (counted by Inspect and status).
CREATE INDEX IF NOT EXISTS crdbwork_items_snoozed
    ON crdbwork_items (queue) WHERE snoozes > 0 AND claim IS NULL;
-- Cancelled items, newest last, for the operators' list (crdbwork cancelled).
CREATE INDEX IF NOT EXISTS crdbwork_ended_cancelled
    ON crdbwork_ended (queue, ended_at) WHERE outcome = 'cancelled';

-- Cancelled items kept for a requeue (version 6; Queue.Requeue with
-- RequeueOptions.Cancelled, crdbwork cancelled --requeue): what a requeue
-- needs, written by the cancel in the statement that records the item as
-- ended (cancelled), for the queue's dedup window, pruned with the ended
-- ids. A requeue moves the row back into the items table and deletes the
-- ended record.
CREATE TABLE IF NOT EXISTS crdbwork_cancelled_items (
    queue        TEXT        NOT NULL,
    id           UUID        NOT NULL,
    part         BIGINT      NOT NULL,
    item_key     TEXT,
    priority     BIGINT      NOT NULL,
    max_attempts BIGINT      NOT NULL,
    payload      BYTEA       NOT NULL,
    metadata     BYTEA,
    tenant       TEXT,
    headers      JSONB,
    enqueued_at  TIMESTAMPTZ NOT NULL,
    claim_token  BIGINT      NOT NULL DEFAULT 0,
    seq_order    BIGINT,
    cancelled_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Its kind (NULL: none), given back by a requeue.
    kind         TEXT,
    -- By id first: a requeue's lookup of one id cannot be mistaken for a
    -- read of the queue's rows through the index by age.
    PRIMARY KEY (id, queue)
);
-- Kept cancelled items by age: the reaper's prune and the requeue of all.
CREATE INDEX IF NOT EXISTS crdbwork_cancelled_items_by_age
    ON crdbwork_cancelled_items (queue, cancelled_at);

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
    remaining    BIGINT      NOT NULL,
    -- What the item keeps through its wait (version 6): its headers (the
    -- producer's trace context) and its sequence order (with a key in a
    -- sequenced queue), carried into the items table by the move.
    headers      JSONB,
    seq_order    BIGINT,
    -- (version 6) The prerequisite outcomes that satisfy an edge as an ack
    -- would (bit 1: dead, bit 2: cancelled; 0: none: such a prerequisite
    -- ends the item dead).
    run_after    BIGINT      NOT NULL DEFAULT 0,
    -- Its own handler timeout (version 6, µs; NULL: none), carried over too.
    timeout_us   BIGINT,
    -- Its kind (version 6; NULL: none), carried over too.
    kind         TEXT
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
-- A dependent's edges: crdbwork deps, ending a dependent, and (with the
-- prerequisite, version 6) an exact seek of one edge, as in the primary
-- key, whichever of the two the planner takes.
CREATE INDEX IF NOT EXISTS crdbwork_waits_for_by_dependent_prereq
    ON crdbwork_waits_for (queue, dependent, prereq);
-- (version 6) Edges from items of other queues (claim.NewItem.AfterIn):
-- keyed by the prerequisite's queue and id, with the dependent's queue;
-- counted in the dependent's remaining. Each has a hint (the same
-- prerequisite's queue, prerequisite and dependent) in crdbwork_waits_for,
-- which the prerequisite's ack finds; version-5 acks delete the hint and
-- count nothing, and a version-6 reap settles the edge from here.
CREATE TABLE IF NOT EXISTS crdbwork_waits_across (
    prereq_queue    TEXT NOT NULL,
    prereq          UUID NOT NULL,
    dependent_queue TEXT NOT NULL,
    dependent       UUID NOT NULL,
    PRIMARY KEY (prereq_queue, prereq, dependent)
);
CREATE INDEX IF NOT EXISTS crdbwork_waits_across_by_dependent
    ON crdbwork_waits_across (dependent_queue, dependent, prereq_queue, prereq);

-- History (version 6, issue 33): an item's ended attempts that did not
-- succeed, one row per item (its id is kept when it moves: dead, cancelled,
-- requeued). errors is a JSON array, oldest first, at most 20, each error
-- at most 4,096 characters (docs/history.md). Written only by the failure
-- paths (nack, permanent failure, death, lease reaper; a requeue appends a
-- marker), never by an ack; read by the item lookup. The reapers delete a
-- row once its item is nowhere but (perhaps) in an ended record older than
-- the history window, oldest first through crdbwork_attempt_errors_by_age.
CREATE TABLE IF NOT EXISTS crdbwork_attempt_errors (
    queue      TEXT        NOT NULL,
    id         UUID        NOT NULL,
    errors     JSONB       NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, id)
);
CREATE INDEX IF NOT EXISTS crdbwork_attempt_errors_by_age
    ON crdbwork_attempt_errors (queue, updated_at);

-- Reap turns (version 6).
-- When each reap last ran: the queue's reap (name: the queue) and the reap
-- of expired sessions (name: the empty string, never a queue's name).
-- Version-6 sessions take a turn before they reap, by an upsert that
-- succeeds only when the last reap is older than half its interval, so
-- that a fleet reaps each queue (and the sessions) about once per interval
-- rather than once per session; any session takes the turn when it is due,
-- so a reaper's death costs at most one interval. Version-3 to -5 code
-- neither reads nor writes it: it reaps on its own timers, as before.
CREATE TABLE IF NOT EXISTS crdbwork_reaps (
    name      TEXT        NOT NULL PRIMARY KEY,
    reaped_at TIMESTAMPTZ NOT NULL,
    -- A queue's last whole reap with its prunes (ended ids past the dedup
    -- window, kept cancelled items, dead items beyond the retention),
    -- which runs about once a minute while the queue has nothing else to
    -- reap. NULL for the turn of expired sessions.
    pruned_at TIMESTAMPTZ
);

INSERT INTO crdbwork_schema_version AS v (singleton, version, installed) VALUES (true, 3, 6)
    ON CONFLICT (singleton) DO UPDATE
    SET version = GREATEST(v.version, excluded.version),
        installed = GREATEST(v.installed, excluded.installed), applied_at = now();
