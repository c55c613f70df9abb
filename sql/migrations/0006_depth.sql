-- crdbwork schema version 6 (issue 29, "depth"): what a long-lived shared
-- database and every combination of features need. Every statement is
-- idempotent; the last one raises the version row. Version-3, -4 and -5
-- code keeps working on this schema (it serves version 3 and newer).

-- == sequences after a death ==
-- A sequenced queue chooses what a death of one of its sequenced items does
-- to the item's key (docs/sequences.md, "After a death"): advance (false,
-- the default: the key's next item runs) or hold (true: the key's later
-- items wait until the dead item is requeued, deleted from the dead items
-- or released).
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS sequence_hold BOOL NOT NULL DEFAULT false;
-- A dead item keeps its place in its key's sequence (seq_order, NULL: it
-- was not sequenced, or died under code older than version 6), so that a
-- requeue puts it back where it was; seq_hold marks a dead item that holds
-- its key (it died in a queue whose sequence_hold was on). Code of versions
-- 3 to 5 writes neither: its deaths never hold (docs/sequences.md,
-- "Rolling upgrades").
ALTER TABLE crdbwork_dead_items ADD COLUMN IF NOT EXISTS seq_order BIGINT;
ALTER TABLE crdbwork_dead_items ADD COLUMN IF NOT EXISTS seq_hold BOOL NOT NULL DEFAULT false;
-- The dead items that hold their keys, in their keys' order: a sequenced
-- claim's test that no earlier dead item holds a candidate's key (one seek
-- per candidate), and the list of blocked keys. Normally empty.
CREATE INDEX IF NOT EXISTS crdbwork_dead_items_sequence_held
    ON crdbwork_dead_items (queue, item_key, enqueued_at, seq_order, id) WHERE seq_hold;

-- == dependencies: the edges by dependent ==
-- The edges by dependent, with the prerequisite: one edge (queue,
-- dependent, prerequisite) is an exact seek in this index as in the
-- primary key, whichever the planner takes. It replaces
-- crdbwork_waits_for_by_dependent (queue, dependent), which looked as
-- cheap to PostgreSQL when its statistics predated the queue, and read all
-- of a fan-in join's edges for each edge a release deleted. Version-5 code
-- reads a dependent's edges through the new index as through the old one.
-- (On CockroachDB the old index held the prerequisite already, as the
-- primary key's suffix; the new one is the same index under a new name.)
CREATE INDEX IF NOT EXISTS crdbwork_waits_for_by_dependent_prereq
    ON crdbwork_waits_for (queue, dependent, prereq);
DROP INDEX IF EXISTS crdbwork_waits_for_by_dependent;
-- == waiting items keep their headers and sequence order ==
-- A waiting item (NewItem.After) keeps its headers (the producer's trace
-- context) and, with a key in a sequenced queue, its sequence order; its
-- move into the items table carries both over, so that released it runs
-- with the producer's trace link and in its key's order. Version-5 code
-- neither writes nor reads them: its waiting items run without them, as
-- before.
ALTER TABLE crdbwork_waiting ADD COLUMN IF NOT EXISTS headers JSONB;
ALTER TABLE crdbwork_waiting ADD COLUMN IF NOT EXISTS seq_order BIGINT;

-- == parity: dependency options, cancelled items kept for a requeue ==
-- (issue 33) A waiting item's dependency policy (claim.NewItem.RunAfter):
-- the prerequisite outcomes that satisfy its edge as an ack would, instead
-- of ending it dead (bit 1: dead, bit 2: cancelled; 0: none, as before).
-- Version-5 code writes 0 and its reapers end such an item as they always
-- did (docs/dependencies.md, "Rolling upgrades").
ALTER TABLE crdbwork_waiting ADD COLUMN IF NOT EXISTS run_after BIGINT NOT NULL DEFAULT 0;

-- Cancelled items kept for a requeue (Queue.Requeue with
-- RequeueOptions.Cancelled): written by version-6 cancels, beside the
-- ended record, for the queue's dedup window. Version-3 to -5 code never
-- reads or writes it: its cancels keep nothing (such items cannot be
-- requeued), and its ended-id pruning leaves the rows to version-6
-- reapers, which prune them by age.
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
    -- By id first: a requeue's lookup of one id cannot be mistaken for a
    -- read of the queue's rows through the index by age.
    PRIMARY KEY (id, queue)
);
CREATE INDEX IF NOT EXISTS crdbwork_cancelled_items_by_age
    ON crdbwork_cancelled_items (queue, cancelled_at);

-- == idle sessions: the queues' change counter ==
-- Raised in the statement that changes a queue's members or part owners (a
-- join or leave, a session's deletion by itself or by a peer's reap, a part
-- acquired or released) or its number of parts (partition.SetParts). Each
-- session reads the counters of the queues it joined with its heartbeat,
-- and a rebalancer reads the members and owners only when they moved, so
-- that idle sessions run almost no statements. Version-3 to -5 code neither
-- reads nor raises it: version-6 rebalancers also read on a slow safety
-- interval, which sees what old code changed.
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS changes BIGINT NOT NULL DEFAULT 0;

-- == parity: per-item timeouts ==
-- An item's own handler timeout in microseconds (claim.NewItem.Timeout,
-- pg-boss's expireInSeconds; NULL: none, the worker's ItemTimeout). Every
-- claim of version 6 returns it; a waiting item keeps it and its release
-- carries it over. Code of versions 3 to 5 neither writes nor reads it: its
-- workers run every item with their own ItemTimeout (docs/timeouts.md,
-- "Rolling upgrades").
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS timeout_us BIGINT;
ALTER TABLE crdbwork_waiting ADD COLUMN IF NOT EXISTS timeout_us BIGINT;

-- == parity: schedules stored in the database ==
-- A periodic schedule may be stored in its row (River #242): spec holds its
-- definition (package schedule's JSON: the interval or cron expression,
-- what to do with missed periods, the item), NULL for a schedule defined in
-- code (whose row keeps only its last period, as before). Every runner of
-- version 6 runs its queue's stored schedules and picks up an added,
-- changed, paused or removed one without a restart. paused stops a
-- schedule (stored or in code) on every version-6 runner. A stored schedule
-- added before its first period has last_period 1970-01-01 (the column
-- stays NOT NULL for older code). Code of versions 3 to 5 reads and writes
-- only the rows of its own schedules' names, by last_period, and ignores
-- both columns: it never runs stored schedules, and runs its own even when
-- paused (docs/periodic.md, "Rolling upgrades").
ALTER TABLE crdbwork_schedules ADD COLUMN IF NOT EXISTS spec JSONB;
ALTER TABLE crdbwork_schedules ADD COLUMN IF NOT EXISTS paused BOOL NOT NULL DEFAULT false;

-- == kinds ==
-- (issue 33) An item's kind (claim.NewItem.Kind, River's JobArgs.Kind):
-- which of a worker's typed handlers runs it (worker.Kinds; NULL: none).
-- Enqueues of version 6 write it, every claim of version 6 returns it, and
-- it travels with the item's payload: a waiting item's release, a death, a
-- cancel and a requeue carry it over. Code of versions 3 to 5 neither
-- writes nor reads it: its workers run every item, whatever its kind, with
-- their one handler, and its moves of an item to the dead items (or back)
-- drop the kind (docs/kinds.md, "Rolling upgrades").
ALTER TABLE crdbwork_items ADD COLUMN IF NOT EXISTS kind TEXT;
ALTER TABLE crdbwork_waiting ADD COLUMN IF NOT EXISTS kind TEXT;
ALTER TABLE crdbwork_dead_items ADD COLUMN IF NOT EXISTS kind TEXT;
ALTER TABLE crdbwork_cancelled_items ADD COLUMN IF NOT EXISTS kind TEXT;
-- The ended record keeps the item's kind too, from the row its end
-- deletes, in the insert that end runs anyway (an ack, the take of an
-- at-most-once item, a death, a cancel): crdbwork item and the dashboard
-- show what an acked or taken item was. NULL: none, or the record was
-- written by code of versions 3 to 5, which does not write it ("none
-- recorded").
ALTER TABLE crdbwork_ended ADD COLUMN IF NOT EXISTS kind TEXT;
-- == history ==
-- (issue 33) What happened to an item, attempt by attempt. Its ended
-- attempts that did not succeed are kept in crdbwork_attempt_errors, one
-- row per item keyed by (queue, id) as the item's id never changes when it
-- moves (dead, cancelled, requeued): errors is a JSON array, oldest first,
-- at most 20 (the oldest dropped first), each an object with the attempt's
-- number, start (its claim), end, session and error (at most 4,096
-- characters, longer ones cut with a marker), or a requeue marker. Only
-- the failure paths write it (a nack, a permanent failure, a death, a lease
-- that ran out; a requeue appends its marker), each in a CTE of the
-- statement it runs anyway; an ack never touches it, and crdbwork_items
-- gets no column (its width is what a never-analyzed table's size is
-- estimated from: TestHotPlansInEveryState). The reapers delete a row once
-- its item is in none of the items, waiting, dead or cancelled tables and
-- its ended record is gone or older than the history window
-- (crdbwork_attempt_errors_by_age). The ended record keeps the item's
-- attempts, enqueue time, and its last attempt's start and session (NULL
-- attempts: recorded by code older than version 6, "no history
-- recorded"). history_window is how long a queue keeps its ended records
-- for history (crdbwork_ended rows stay for the longer of it and
-- dedup_window). Code of versions 3 to 5 neither writes nor reads these:
-- its nacks add no entry, its ends record no history, and its reapers
-- prune the ended records by the dedup window alone (docs/history.md,
-- "Rolling upgrades").
CREATE TABLE IF NOT EXISTS crdbwork_attempt_errors (
    queue      TEXT        NOT NULL,
    id         UUID        NOT NULL,
    errors     JSONB       NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, id)
);
CREATE INDEX IF NOT EXISTS crdbwork_attempt_errors_by_age
    ON crdbwork_attempt_errors (queue, updated_at);
ALTER TABLE crdbwork_ended ADD COLUMN IF NOT EXISTS attempts BIGINT;
ALTER TABLE crdbwork_ended ADD COLUMN IF NOT EXISTS enqueued_at TIMESTAMPTZ;
ALTER TABLE crdbwork_ended ADD COLUMN IF NOT EXISTS started_at TIMESTAMPTZ;
ALTER TABLE crdbwork_ended ADD COLUMN IF NOT EXISTS session UUID;
ALTER TABLE crdbwork_queues ADD COLUMN IF NOT EXISTS history_window INTERVAL NOT NULL DEFAULT INTERVAL '24 hours';

-- == cross-queue prerequisites ==
-- (issue 33) An item may wait for items of other queues
-- (claim.NewItem.AfterIn). Each such edge is a row here, keyed by the
-- prerequisite's queue and id, with the dependent's queue: the dependent's
-- waiting row counts it in remaining, and only version-6 code deletes it,
-- counting it. Beside it, the same (prerequisite's queue, prerequisite,
-- dependent) is written into crdbwork_waits_for as a hint: the ack of the
-- prerequisite finds it with the seek every ack makes already, and its
-- release (version 6) moves the dependent. Version-3 to -5 code never reads
-- this table: its ack of the prerequisite deletes the hint and lowers no
-- count (the dependent is no waiting item of the prerequisite's queue), so
-- nothing is lost, and a version-6 session's reap of the dependent's queue
-- (or of the prerequisite's) finds the edge here and settles it
-- (docs/dependencies.md, "Prerequisites in other queues").
CREATE TABLE IF NOT EXISTS crdbwork_waits_across (
    prereq_queue    TEXT NOT NULL,
    prereq          UUID NOT NULL,
    dependent_queue TEXT NOT NULL,
    dependent       UUID NOT NULL,
    PRIMARY KEY (prereq_queue, prereq, dependent)
);
-- The edges into a queue, by dependent: the dependent queue's sweep walks
-- them, crdbwork deps lists a dependent's, and a dependent's end deletes
-- them.
CREATE INDEX IF NOT EXISTS crdbwork_waits_across_by_dependent
    ON crdbwork_waits_across (dependent_queue, dependent, prereq_queue, prereq);

-- == idle sessions: reap turns ==
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
