package store

import (
	"fmt"
	"regexp"
	"strings"
)

// coreStatements holds every statement of packages session, partition and claim,
// rendered for one set of table names. The text is identical on CockroachDB
// and PostgreSQL: each statement uses only forms both engines accept
// (a MATERIALIZED CTE that selects FOR UPDATE SKIP LOCKED ... LIMIT n,
// joined by primary key, instead of CockroachDB's UPDATE ... LIMIT, for
// instance).
type coreStatements struct {
	// Sessions.
	CreateSession  string // $1 expiry (microseconds), $2 host, $3 pid, $4 name → id
	Heartbeat      string // $1 id → the queues' change marker, the age of the last reap of expired sessions (µs), whether no other session has a row (no row: the session is gone)
	ReapSessions   string // → rows affected
	DeleteSession  string // $1 id
	LiveSessions   string // → id, name, host, pid, created_at, heartbeat_at, expiry(µs), age(µs), since heartbeat(µs), claimed, acked, failed, in_flight (reported)
	LiveSessionIDs string // → id, ordered

	// Reap turns (crdbwork_reaps, reaps.go).
	TakeQueueReapTurn string // $1 queue, $2 interval (µs), $3 prune interval (µs) → taken, prune taken, whether the item steps have work
	ReapSessionsTurn  string // $1 interval (µs) → taken, sessions deleted
	QueuePrunesDue    string // $1 queue, $2 most exhausted items counted → whether the whole reap's other steps (exhausted items, prunes, cross-queue edges) may have work

	// Queues and parts.
	QueueParts       string // $1 queue → num_parts (no row: 1 part)
	UpsertQueueParts string // $1 queue, $2 num_parts
	// InsertQueueParts stores a part count for a queue that has none (a
	// stored count wins: ON CONFLICT DO NOTHING); partition.EnsureParts.
	InsertQueueParts string // $1 queue, $2 num_parts
	AcquirePart      string // $1 session, $2 queue, $3 part → acquired (0: owned by another)
	ReleasePart      string // $1 session, $2 queue, $3 part
	QueueChangesBump string // $1 queue
	OwnedParts       string // $1 session, $2 queue → part
	PartOwners       string // $1 queue → session_id, part
	DropPartsAbove   string // $1 queue, $2 num_parts: deletes part rows >= num_parts

	// Items. Every statement that writes a claim writes all three claim
	// columns (claim, claim_queue, claim_part): the foreign keys' cascades run
	// first in, first out, so deleting a session nulls claim through the
	// single-column key before the composite key's SET NULL runs and matches
	// nothing, which can leave a stale claim_queue/claim_part behind.
	// ClaimAny claims in any part; the per-part claims are
	// partClaimStatements, rendered per number of parts.
	ClaimAny string // $1 session, $2 queue, $3 limit, $4 lease(µs), $5 tenants to skip → item columns
	// The PostgreSQL twins of ClaimAny, ReapLeases, AckMany, Extend and
	// TakeAtMostOnce (same parameters, same results): see claimTemplate and
	// fenced. Use ForDialect.
	PostgresClaimAny, PostgresReapLeases, PostgresAckMany, PostgresExtend, PostgresTakeAtMostOnce string
	// TakeAtMostOnce deletes the given claimed items that are at-most-once
	// (fenced like AckMany), right after the claim that handed them out.
	TakeAtMostOnce string // $1 ids, $2 sessions, $3 tokens → deleted ids
	AckMany        string // $1 ids, $2 sessions, $3 tokens → deleted ids, each with whether items wait for it
	Nack           string // $1 id, $2 session, $3 token, $4 delay(µs), $5 error
	Release        string // $1 id, $2 session, $3 token
	DeadLetter     string // $1 id, $2 session, $3 token, $4 error, $5 reason → id
	Extend         string // $1 ids, $2 sessions, $3 tokens, $4 lease(µs) → id, lease_until
	// ReapLeases releases expired leases (their attempts counted: the
	// handler hung or the process lost track of the item), in bounded
	// batches, through crdbwork_items_lease.
	ReapLeases    string // $1 queue, $2 limit → ids released
	ReapExhausted string // $1 queue, $2 limit, $3 error → ids moved to the dead items (reason 'crash loop')
	// ReapExpired moves unclaimed items past their deadline to the dead
	// items (reason 'expired'), in bounded batches, through
	// crdbwork_items_expiry.
	ReapExpired string // $1 queue, $2 limit → ids moved to the dead items
	// FairHead is what a fair queue's enqueue reads, beside
	// fairStatements.Lasts, for each priority whose head the caller has no
	// recent copy of: the earliest turn of the queue's unclaimed items of
	// that priority (no row if none), a single seek through
	// crdbwork_items_turn_next with parameters only (no decorrelation
	// applies; see fairStatements). The seek may step over many index
	// entries of items claimed or acked moments ago (not yet vacuumed on
	// PostgreSQL, not yet garbage collected on CockroachDB) while a backlog
	// drains, so callers read it only when their copy is old.
	// PostgresFairHead is its PostgreSQL twin, which compares the queue with
	// (SELECT $1::TEXT) (pgClaimOrder says why). Use ForDialect.
	FairHead, PostgresFairHead string // $1 queue, $2 priority → head
	// QueueSettings reads a queue's settings (no row: all off).
	QueueSettings string // $1 queue → fair, at_most_once, max_in_flight, rate_limit, tenant_max_in_flight, tenant_rate_limit, dedup window (µs)
	// ConfigureQueue writes them (a queue without a row gets one, with one part).
	ConfigureQueue  string // $1 queue, $2 fair, $3 at_most_once, $4 max_in_flight, $5 rate_limit, $6 tenant_max_in_flight, $7 tenant_rate_limit, $8 dedup window (µs)
	ReleaseForgot   string // $1 queue, $2 session, $3 ids to keep → rows affected
	PauseQueue      string // $1 queue, $2 paused
	QueuePaused     string // $1 queue → paused
	HeartbeatReport string // $1 id, $2 claimed, $3 acked, $4 failed, $5 in_flight → the queues' change marker (no row: the session is gone)
	// Cancel deletes an unclaimed item (cancelStatements: a claimed one
	// is asked to stop instead).
	Cancel string // $1 id, $2 queue, $3 by, $4 reason → id
	// DeadItems lists every death of the queue's dead items (an id may have
	// died several times: each death is a row, keyed by (id, death)),
	// newest first: died_at, id, death, all descending
	// (deathStatements.DeadItemsBefore pages on from a row).
	DeadItems string // $1 queue, $2 limit → dead item columns (with tenant, reason and death), newest first
	// Requeue moves one death of a dead item back into the items table:
	// death $3, or the newest death of the id if $3 is NULL. The other
	// deaths stay as history. It moves nothing while the id is live: an
	// item with that id is in the items table, or a waiting item has it
	// (deathStatements.RequeueState tells why).
	Requeue string // $1 id, $2 queue, $3 death or NULL → id of the item put back
	// Backlog counts every item of every queue (a scan of the whole items
	// table); metrics and the demo's status read one queue at a time
	// through inspectStatements (claim.Queue.Inspect) instead.
	Backlog     string // → queue, part, unclaimed, vested, claimed
	DeadCount   string // $1 queue → count
	ItemColumns string
}

// itemColumns are the columns every claim statement returns, in order.
const itemColumns = `i.id, i.queue, i.part, i.item_key, i.priority, i.attempts, i.max_attempts, i.payload, i.metadata, i.enqueued_at, i.vesting_at, i.last_error, i.claim_part, i.claim_token, i.lease_until, i.tenant, i.expires_at, i.at_most_once, i.turn_at, i.headers, ` + checkpointColumns + `, i.timeout_us, i.kind`

// claimTemplate is the any-part claim statement (the per-part ones are
// partClaimStatements, built the same way); the %s is how the UPDATE finds
// the picked rows (joinPicked, or anyPicked on PostgreSQL).
//
// Their shape is chosen for both optimizers (CockroachDB docs checked:
// "Common Table Expressions": AS MATERIALIZED overrides the optimizer's
// choice; "UPDATE": FROM table_ref references other tables, here the CTE;
// SKIP LOCKED: supported since 22.2, and refused under READ COMMITTED on
// 23.2, cockroachdb/cockroach#115057). The MATERIALIZED CTE selects at most $3 ids
// in order, locking only the rows it returns (FOR UPDATE SKIP LOCKED: rows
// another claimer holds are skipped, not waited for); the UPDATE then joins
// those ids by primary key. The older form, id = ANY(ARRAY(subquery)), is
// turned into index spans by CockroachDB only for constant arrays, so its
// UPDATE could scan every unclaimed row. A paused queue yields no rows (the
// NOT EXISTS is uncorrelated: evaluated once). Items whose attempts are used
// up are never handed out (the reaper moves them to the dead items), nor
// are items past their deadline (expires_at; the reaper moves them too) or
// items of the tenants listed in the last parameter (tenants at their
// limit). These are residual filters on rows the index scan reads anyway:
// the claim still stops at its limit. An empty list skips nothing (x =
// ANY of an empty array is false on both engines). Items are taken in
// (priority, turn_at) order: turn_at is the vesting time, except in fair
// queues (fairStatements, FairHead). The
// UPDATE rechecks i.claim IS NULL. Run it in an explicit transaction,
// SERIALIZABLE on CockroachDB: it refuses SKIP LOCKED under READ COMMITTED
// (the default of some 23.2+ clusters).
//
// The any-part claim reads crdbwork_items_turn_next (queue, priority,
// turn_at, part) in order and stops at its limit. The per-part claims
// (partClaimStatements) read crdbwork_items_part_turn (queue, part,
// priority, turn_at) once per owned part, each part with its own limit, and
// keep the best across parts: their cost is at most the limit's entries per
// owned part, however long the backlog of the other parts
// (TestPartClaimReadsStayFlat). partClaimStatements says why they are a
// UNION ALL of per-part scans and not a LATERAL subquery (CockroachDB's
// decorrelation).
//
// The two claims scan different indexes, and CockroachDB's SKIP LOCKED sees
// only the locks of the index it scans (cockroachdb/cockroach#57031). They
// do not meet: a queue is worked either in parts mode (workers with
// Options.Parts > 0 on a queue with a stored part count, claiming only their
// own parts) or without parts, never both in a correct set-up. If they do
// meet, no item is claimed twice: the UPDATE writes claim and rechecks
// i.claim IS NULL on the row itself, so a row both claims picked is claimed
// by one of them only; the cost is contention (a lock wait or a
// serialization retry), not a double claim.
//
// PostgreSQL has a twin of each that differs in how the UPDATE finds the
// picked rows: by the row versions the CTE locked, ctid = ANY(ARRAY(SELECT
// ctid FROM picked)), a TID scan (pgByRowVersion; rendered from anyPicked,
// id = ANY(ARRAY(SELECT id FROM picked)), the form of schema version 5,
// which PostgreSQL runs as primary-key lookups). With the join, its planner
// switches to a hash join over a sequential scan of every unclaimed item
// once the limit is a few hundred rows or the plan is generic
// (TestStatementPlansUseIndexes caught it), and the claim's cost then grows
// with the backlog. Both ANY forms are ones CockroachDB cannot turn into
// index spans (and ctid is PostgreSQL's alone), hence the twins.
//
// PostgreSQL's twins also compare the queue of their scan with
// (SELECT $2::TEXT) instead of $2 (pgClaimOrder), and the other parameters
// their plans' estimates read the same way, so that they are planned once
// per connection (pgPlanOnce); pgClaimTwin applies both.
const (
	joinPicked = `FROM picked
WHERE i.id = picked.id`
	anyPicked = `WHERE i.id = ANY(ARRAY(SELECT id FROM picked))`
	// ctidPicked is how PostgreSQL's twins of the claims find the picked
	// rows: by the row versions the CTE locked (pgByRowVersion).
	ctidPicked = `WHERE i.ctid = ANY(ARRAY(SELECT ctid FROM picked))`
)

// pgClaimTwin returns the PostgreSQL twin of a claim (claimTemplate,
// partUnionClaimTemplate, the urgent lane's and the sequenced forms of
// each, rendered with anyPicked and, for the reads of a whole queue,
// pgClaimOrder): pgByRowVersion, then pgPlanOnce. TestClaimTwinsDifferOnlyAsDocumented undoes both rewrites and
// requires CockroachDB's text.
func pgClaimTwin(text string) string { return pgPlanOnce(pgByRowVersion(text)) }

// pgByRowVersion rewrites a claim so that its UPDATE finds the picked rows
// by the physical address of the row version its CTE locked (ctid) instead
// of by primary key: the CTE selects ctid where it selected id (in each
// per-part branch too), and the UPDATE reads those versions with a TID scan
// (PostgreSQL's "ctid = ANY(array)"), a direct fetch of each, where
// id = ANY(ARRAY(...)) descended crdbwork_items_pkey once per row (an
// eighth of the claim's server CPU, issue #32; docs/performance.md, "Claim
// cost per item"). A TID scan is also the one plan PostgreSQL has for it,
// whatever it believes of the table.
//
// The address is stable until the UPDATE: the CTE locked each row (FOR
// UPDATE), so no other transaction can update or delete it, and pruning
// never removes a version a lock holds. The UPDATE's TID scan returns only
// versions visible to the statement's snapshot: a row that the CTE found
// updated by a transaction that committed after the snapshot (READ
// COMMITTED locks its newest version) is left unclaimed by this statement,
// its lock ending with it, and the next claim takes it; no row is claimed
// twice or in a version the CTE did not check. The UPDATE rechecks claim IS
// NULL as before. ctid is PostgreSQL's alone: CockroachDB's claims keep
// joinPicked. It panics if text lacks the shapes it rewrites (a change to a
// claim template that this function must follow; the statement tests fail
// first).
func pgByRowVersion(text string) string {
	text = replaceCounted(text, anyPicked, ctidPicked, 1)
	if strings.Contains(text, "SELECT c.id FROM (") {
		// The per-part claim: the outer select and every branch.
		text = replaceCounted(text, "SELECT c.id FROM (", "SELECT c.ctid FROM (", 1)
		return replaceCounted(text, partBranchSelect, strings.Replace(partBranchSelect, "id", "ctid", 1), 0)
	}
	return replaceCounted(text, "WITH picked AS MATERIALIZED (\n    SELECT id FROM ", "WITH picked AS MATERIALIZED (\n    SELECT ctid FROM ", 1)
}

// partBranchSelect is the select list of a per-part branch (partBranch),
// which pgByRowVersion rewrites.
const partBranchSelect = "SELECT id, priority, turn_at FROM"

// pgPlanOnce rewrites a claim so that PostgreSQL plans it once per
// connection instead of at every run: every parameter its plan's estimates
// read (the limits, the tenants to skip, and in the per-part claim the
// queue and the parts; the plain claim's queue is hidden already,
// pgClaimOrder) is compared through (SELECT $n::type), the value of an
// InitPlan, which no plan sees when it is made.
//
// Why: pgx prepares each statement once per connection, and PostgreSQL
// then plans a prepared statement for its parameters at each of its first
// five runs and afterwards whenever the generic plan (made without the
// values) looks costlier than the average of those: a LIMIT $3 that the
// plan cannot see is estimated at a tenth of the rows, so the generic plan
// always looked costlier and every claim was planned anew, 0.3 ms of server
// CPU per call for the plain claim and 0.4 ms for four owned parts
// (pg_stat_statements.track_planning; 3–7 µs per item at the 82 rows per
// call of the demo's shape, issue #32). With the values hidden the plans
// made for the values cost what the generic plan costs, PostgreSQL settles
// on the generic plan after the first five runs, and a claim's fixed cost
// is its execution's.
//
// That generic plan is the one the plan tests have always checked besides
// the plan for the values (explainEach's "generic" mode, in every state of
// TestHotPlansInEveryState and the lived database's): the ordered scan of
// crdbwork_items_turn_next or of each part's crdbwork_items_part_turn that
// stops at the limit, whatever the statistics say. CockroachDB keeps the
// plain placeholders (pgClaimOrder says why the subquery form does not
// suit it).
func pgPlanOnce(text string) string {
	text = replaceCounted(text, "tenant = ANY($5::TEXT[])", "tenant = ANY((SELECT $5::TEXT[])::TEXT[])", 0)
	text = replaceCounted(text, "queue = $2 AND part = ", "queue = (SELECT $2::TEXT) AND part = ", -1)
	text = partParam.ReplaceAllString(text, "part = (SELECT $$$1::BIGINT)")
	if !limitParam.MatchString(text) {
		panic("sql: a claim template changed: it has no LIMIT $n")
	}
	return limitParam.ReplaceAllString(text, "LIMIT (SELECT $$$1::BIGINT)")
}

var (
	limitParam = regexp.MustCompile(`LIMIT \$(\d+)`)
	partParam  = regexp.MustCompile(`part = \$(\d+)`)
)

// replaceCounted replaces every old in s by new, and panics unless old
// occurs n times (n 0: at least once; n -1: any number of times, none
// too).
func replaceCounted(s, old, new string, n int) string {
	c := strings.Count(s, old)
	if (n > 0 && c != n) || (n == 0 && c == 0) {
		panic(fmt.Sprintf("sql: a claim template changed: %q occurs %d times", old, c))
	}
	return strings.ReplaceAll(s, old, new)
}

// claimQueueAnchor is the claims' test of their scan's queue (claimTemplate,
// and so the urgent lane's and the sequenced claims, which are built from
// it), where pgClaimOrder hides the queue.
const claimQueueAnchor = "queue = $2 AND claim IS NULL AND "

// pgClaimOrder returns a claim built from claimTemplate (the any-part
// claim, the urgent lane's, and their sequenced forms) as PostgreSQL's twin
// runs it: the scan in claim order compares the queue with (SELECT
// $2::TEXT), the value of an InitPlan, which the planner cannot see when it
// plans the statement (pgHideQueue). The idle probe, FairHead and FairFront,
// the other reads of a whole queue in claim order, do the same on
// PostgreSQL.
//
// Why: the plan for a given queue is costed with that queue's statistics.
// When ANALYZE's sample met a few of a quiet queue's rows, the queue is
// among the most common values at a frequency of a handful of rows, and a
// plan for that queue (a prepared statement's first five runs on a
// connection, and every run while the generic plan looks costlier) read
// the queue's unclaimed items through crdbwork_items_part_turn, sorted them
// and took the first: cheap for the 20 rows the statistics promised, a read
// and a sort of the whole burst for the 40k the queue held (the "tiny"
// state of TestHotPlansInALivedDatabase). Against a value it cannot see,
// PostgreSQL takes the queue's share of the table as one over the number of
// queues, as in the generic plan, and reads crdbwork_items_turn_next in
// claim order, stopping at the limit, whatever it believes of the queue
// (TestHotPlansInALivedDatabase checks that no plan of these reads compares
// the queue with a value the planner sees). The InitPlan runs once per
// statement and costs nothing measurable (docs/operations.md).
//
// CockroachDB keeps $2 (docs/cockroachdb.md, "Statement shapes chosen for
// CockroachDB"). Since 23.2 its EliminateConstValueSubquery rule
// (cockroachdb/cockroach#107133) folds a subquery of one constant into the
// constant, and a custom plan's placeholders are constants by then, so the
// form would change nothing there. But in a generic plan (plan_cache_mode
// force_generic_plan, or auto, the default since 25.2) the placeholder is
// no constant, nor is anything on 23.1, which crdbwork supports, and the
// subquery stays: evaluated before the query, it cannot constrain the scan,
// a full scan of the index filtered by queue (cockroachdb/cockroach#83392);
// hoisted into a join (optimizer_hoist_uncorrelated_equality_subqueries,
// on by default since 23.2), the scan becomes a lookup join, which may read
// every entry of the queue before the order and the limit apply ("hard
// limits cannot be pushed into lookup joins", the generic plans' RFC,
// docs/RFCS/20240103_generic_query_plans.md).
func pgClaimOrder(claim string) string { return pgHideQueue(claim, claimQueueAnchor, "$2") }

// pgHideQueue returns text with anchor, which must occur in it once and
// compare the queue with the placeholder param ("queue = $1 AND ..."),
// comparing it with (SELECT param::TEXT) instead: the form of PostgreSQL's
// reads in claim order (pgClaimOrder). It panics otherwise (a change to a
// statement's text that its twin must follow; the plan tests fail first).
func pgHideQueue(text, anchor, param string) string {
	cond := "queue = " + param + " "
	if strings.Count(text, anchor) != 1 || !strings.HasPrefix(anchor, cond) {
		panic(fmt.Sprintf("sql: a read in claim order changed: its test of the queue %q has no place", anchor))
	}
	hidden := "queue = (SELECT " + param + "::TEXT) " + strings.TrimPrefix(anchor, cond)
	return strings.Replace(text, anchor, hidden, 1)
}

// dialectStatements are the statements that have a PostgreSQL twin.
type dialectStatements struct {
	ClaimAny, ReapLeases, AckMany, Extend, TakeAtMostOnce, FairHead string
}

// ForDialect returns the statements for d that differ between the engines:
// the common text, or on PostgreSQL its twins.
func (s *coreStatements) ForDialect(d Dialect) dialectStatements {
	if d == Postgres {
		return dialectStatements{s.PostgresClaimAny, s.PostgresReapLeases, s.PostgresAckMany, s.PostgresExtend, s.PostgresTakeAtMostOnce, s.PostgresFairHead}
	}
	return dialectStatements{s.ClaimAny, s.ReapLeases, s.AckMany, s.Extend, s.TakeAtMostOnce, s.FairHead}
}

const claimTemplate = `WITH picked AS MATERIALIZED (
    SELECT id FROM crdbwork_items
    WHERE queue = $2 AND claim IS NULL AND vesting_at <= now() AND attempts < max_attempts
      AND (expires_at IS NULL OR expires_at > now()) AND (tenant IS NULL OR NOT (tenant = ANY($5::TEXT[])))
      AND NOT EXISTS (SELECT 1 FROM crdbwork_queues WHERE name = $2 AND paused)
    ORDER BY priority, turn_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
UPDATE crdbwork_items AS i
SET claim = $1, claim_queue = NULL, claim_part = NULL, claimed_at = now(),
    attempts = i.attempts + 1, claim_token = i.claim_token + 1,
    lease_until = now() + $4::BIGINT * INTERVAL '1 microsecond'
%s AND i.claim IS NULL
RETURNING ` + itemColumns

// reapLeasesTemplate releases expired leases; %s is how the UPDATE finds the
// picked rows and rechecks their leases (joinPicked and the recheck, or
// PostgreSQL's form below). The rows are locked by the CTE, so their tokens cannot change
// before the UPDATE; the recheck of the lease is for READ COMMITTED.
//
// PostgreSQL's twin finds the rows as the fenced twins do (see fenced): a
// nested loop over the picked ids with a primary-key lookup each, through
// i.id = ANY(ARRAY[picked.id]), which no hash join can use; the recheck is
// wrapped in IS TRUE (the same truth, as a WHERE clause) so that it is
// neither an index condition nor a proof of a partial index's predicate,
// and it names picked too (OR picked.id IS NULL, never true: the ids are
// the items' keys), so that it is a join condition and not a filter of the
// table alone, as pgFencedTake's flag: as a filter, a table believed small
// (the drained state of TestStatementPlansUseIndexes, 12k items, whose
// leases expire as the test runs) was scanned whole, filtered to the
// expired leases and joined to the batch in memory, once the few seconds of
// a loaded machine had made the filter's estimate small. With the form of
// the claims, id = ANY(ARRAY(SELECT id FROM picked)) and a plain recheck,
// PostgreSQL scanned the table whenever it believed it small (an empty,
// never analyzed one; TestHotPlansInEveryState).
var reapLeasesTemplate = `WITH picked AS MATERIALIZED (
    SELECT id, queue, attempts, claimed_at, claim FROM crdbwork_items
    WHERE queue = $1 AND claim IS NOT NULL AND lease_until < now() AND ` + noCancelAsked + `
    ORDER BY lease_until
    LIMIT $2
    FOR UPDATE SKIP LOCKED),
` + leaseRanOut + `
UPDATE crdbwork_items AS i
SET ` + released + `
%s
RETURNING i.id`

// fenced is the condition of every statement that acts on a batch of claimed
// items: (id, claim, token) must match one of the given triples. (claim and
// token suffice for parts-mode claims too: giving up a part deletes its row,
// and the composite foreign key's SET NULL nulls claim with claim_queue and
// claim_part; TestForeignKeysReleaseClaims checks it.) CockroachDB
// plans it as a lookup semi-join driven by the arrays, by primary key
// (CockroachDB checked: its unnest builtin is variadic, "Returns the input
// arrays as a set of rows"; tuple IN (subquery) is standard).
//
// PostgreSQL's twins join the target table, aliased i, with the triples,
// unnested as k (key_id, key_claim, key_token) — pgKeys, in the FROM of an
// UPDATE or the USING of a DELETE — on pgFenced. That condition is shaped
// so that PostgreSQL has one plan left whatever its statistics say: a
// nested loop over the triples that looks each id up by primary key
// (TestHotPlansInEveryState checks it on an empty table, on tables whose
// statistics are stale, and on a 1M-row table, with the plans for the
// given parameters and the generic plans of prepared statements):
//
//   - i.id = ANY(ARRAY[k.key_id]) is an index condition on the primary key
//     for each outer row, but not an equality a hash or merge join can use:
//     with i.id = k.key_id PostgreSQL hashes the triples and scans the
//     table whenever it believes the table small (an empty or never
//     analyzed one: its generic plan, cached by a prepared statement, then
//     stays a sequential scan as the table grows);
//   - the claim and the token are compared by IS NOT DISTINCT FROM, with
//     the given claim required to be non-NULL, which matches exactly what
//     = matches. = is strict, so from "claim = x" the planner proves
//     "claim IS NOT NULL", the predicate of the partial indexes over
//     claimed items (crdbwork_items_lease, crdbwork_items_claimed), and may
//     read the rows through one of them: with statistics taken while no
//     item was claimed those indexes look empty and win on cost, and the
//     statement reads every claimed item of the queue (issue #19: every ack
//     read all ~900 claimed rows, and under SERIALIZABLE the ackers' reads
//     made them abort each other); earlier forms gave a merge join over
//     every item the session holds, or a scan of a drained queue's table.
//     IS NOT DISTINCT FROM is not strict, proves nothing, and cannot drive
//     a hash join either.
//
// An id listed twice joins its row twice; PostgreSQL updates or deletes a
// row once per statement, and returns it once.
const (
	fenced   = `(id, claim, claim_token) IN (SELECT * FROM unnest($1::UUID[], $2::UUID[], $3::BIGINT[]))`
	pgKeys   = `unnest($1::UUID[], $2::UUID[], $3::BIGINT[]) AS k (key_id, key_claim, key_token)`
	pgFenced = `i.id = ANY(ARRAY[k.key_id]) AND k.key_claim IS NOT NULL
  AND (i.claim, i.claim_token) IS NOT DISTINCT FROM (k.key_claim, k.key_token)`
	// pgFencedTake is pgFenced for the at-most-once items only. The flag
	// is checked in a condition that names k too (k.key_id is never NULL
	// where i.id matched it, so it adds no row): a join condition, not a
	// filter on the table alone, which made a scan of an empty table look
	// cheaper than the lookups.
	pgFencedTake = pgFenced + ` AND (i.at_most_once OR k.key_id IS NULL)`
)

// heldBy is the condition of the statements that act on one claimed item
// ($1 id, $2 session, $3 token): the item's claim is still ($2, $3). The
// claim is compared by IS NOT DISTINCT FROM with a non-NULL $2, which
// matches exactly what claim = $2 matches, for the reason given at
// fenced: from claim = $2 PostgreSQL proves the predicate of the partial
// indexes over claimed items and, with statistics that make them look
// small (taken before the claims, or on an empty table), reads every item
// the session holds through crdbwork_items_claimed instead of one row by
// primary key. The same text runs on CockroachDB, whose grammar has IS
// [NOT] DISTINCT FROM (pkg/sql/parser/sql.y) and which finds the row by
// primary key either way (not run here: no CockroachDB server).
const heldBy = `id = $1 AND claim IS NOT DISTINCT FROM $2::UUID AND $2::UUID IS NOT NULL AND claim_token = $3`

// moveExhausted and moveExpired end the reaper's statements that move
// items to the dead items: given a CTE picked that selected and locked the
// items' ids, they delete those still unclaimed (and still exhausted, or
// still past their deadline), record the ids as ended, and insert the
// dead-item rows ($3 is the crash loop's error). The batch statements
// (ReapExhausted, ReapExpired) and their by-id forms (deathStatements'
// ReapExhaustedIDs, ReapExpiredIDs) differ only in how they pick.
var (
	moveExhausted = `gone AS (
    DELETE FROM crdbwork_items AS i WHERE i.id IN (SELECT id FROM picked) AND i.claim IS NULL AND i.attempts >= i.max_attempts
    RETURNING i.id, i.queue, i.part, i.item_key, i.priority, i.attempts, i.max_attempts, i.payload, i.metadata, i.enqueued_at, i.claim_token, i.tenant, i.seq_order, i.kind,
        i.claimed_at, i.claim),
` + recordEnded(OutcomeDead, endedFromGone) + `
INSERT INTO crdbwork_dead_items
    (id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, claim_token, tenant, reason, ` + deadSeqColumns + `)
SELECT id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, $3, enqueued_at, claim_token, tenant, 'crash loop', ` + deadSeqValues + ` FROM gone
RETURNING id`
	moveExpired = `gone AS (
    DELETE FROM crdbwork_items AS i WHERE i.id IN (SELECT id FROM picked) AND i.claim IS NULL AND i.expires_at <= now()
    RETURNING i.id, i.queue, i.part, i.item_key, i.priority, i.attempts, i.max_attempts, i.payload, i.metadata, i.last_error, i.enqueued_at, i.claim_token, i.tenant, i.seq_order, i.kind,
        i.claimed_at, i.claim),
` + recordEnded(OutcomeDead, endedFromGone) + `
INSERT INTO crdbwork_dead_items
    (id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, claim_token, tenant, reason, ` + deadSeqColumns + `)
SELECT id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, claim_token, tenant, 'expired', ` + deadSeqValues + ` FROM gone
RETURNING id`
)

// expiredUnclaimed is how the reaper's expiry step finds its candidates in
// queue $1: items past their deadline that no session holds, read through
// crdbwork_items_expiry (queue, expires_at). The claim is checked in IS
// TRUE, the same truth in a WHERE clause: a plain claim IS NULL proves the
// predicate of the partial indexes of unclaimed items, and with statistics
// that make them look empty (taken on an empty table) PostgreSQL read the
// candidates through crdbwork_items_part_turn, every unclaimed item of the
// queue, to sort out the few with a deadline (TestHotPlansInEveryState).
// The same text runs on CockroachDB, whose grammar has IS [NOT] TRUE
// (pkg/sql/parser/sql.y); its plan still reads crdbwork_items_expiry,
// whose predicate the other conditions imply (not run here: no server).
const expiredUnclaimed = `queue = $1 AND expires_at IS NOT NULL AND expires_at <= now() AND (claim IS NULL) IS TRUE AND ` + noCancelAsked

// noCancelAsked keeps the reaper's lease, exhaustion and expiry steps (and
// their by-id forms) away from items whose cancel was asked for: those end
// cancelled, by the cancel step (ReapCancelled) or their holder, whatever
// happens to their claim. The steps run in transactions of their own, after
// the cancel step: a lease that ran out, or a holder whose session was
// deleted, between the cancel step and these would otherwise release the
// item (counted as released, ended cancelled by the next reap), move it to
// the dead items as a crash loop when that claim had used its last
// attempt, or as expired past its deadline — a dead item, which an
// operator may requeue and run again, for an item whose cancel was asked.
const noCancelAsked = `cancel_requested_at IS NULL`

// deadSeqColumns and deadSeqValues are what every move of an item to the
// dead items writes of its sequence (docs/sequences.md, "After a death"),
// from the moved row's seq_order (in the CTE gone, beside the row's queue):
// its place in its key's sequence, and whether it holds its key, which it
// does if it was sequenced and its queue's sequence_hold is on. (Code of
// versions 3 to 5 writes neither: its deaths never hold.) They carry the
// item's kind over too (the CTE gone returns it).
const (
	deadSeqColumns = `seq_order, seq_hold, kind`
	deadSeqValues  = `seq_order, (seq_order IS NOT NULL AND item_key IS NOT NULL AND COALESCE((SELECT w.sequence_hold FROM crdbwork_queues AS w WHERE w.name = gone.queue), false)), kind`
)

// requeuedSeqOrder is the seq_order a requeue gives the item (in
// coreStatements.Requeue, from the dead row g and the queue's settings n):
// the place in its key's sequence it died with, so that with its enqueue
// time, which it keeps, it runs before the key's later items and never
// beside one (the head test and the unique index of claimed keys see it
// again). An item of a sequenced queue that died without one (under code
// older than version 6) but has a key is sequenced anew with 0: by its
// enqueue time, first among the items of its enqueue call. Other items
// stay unsequenced.
const requeuedSeqOrder = `CASE WHEN g.seq_order IS NOT NULL THEN g.seq_order
            WHEN n.sequenced AND g.item_key IS NOT NULL THEN 0 END`

// fairHead is coreStatements.FairHead; fairHeadAnchor its test of the
// queue, which PostgreSQL's twin hides (pgHideQueue).
const (
	fairHead = `SELECT turn_at FROM crdbwork_items
WHERE queue = $1 AND priority = $2 AND claim IS NULL
ORDER BY turn_at LIMIT 1`
	fairHeadAnchor = "queue = $1 AND priority = $2 AND claim IS NULL"
)

// released are the assignments that release a claim, all claim columns at once.
const released = `claim = NULL, claim_queue = NULL, claim_part = NULL, claimed_at = NULL, lease_until = NULL`

// newCoreStatements renders the statements for t.
func newCoreStatements(t Tables) *coreStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &coreStatements{
		CreateSession:  r(createSessionSQL),
		Heartbeat:      r(heartbeatSQL),
		ReapSessions:   r(reapSessionsSQL),
		DeleteSession:  r(deleteSessionSQL),
		LiveSessions:   r(coreLiveSessionsSQL),
		LiveSessionIDs: r(liveSessionIDsSQL),

		TakeQueueReapTurn: r(takeQueueReapTurnSQL),
		ReapSessionsTurn:  r(reapSessionsTurnSQL),
		QueuePrunesDue:    r(queuePrunesDueSQL),

		QueueParts:       r(queuePartsSQL),
		InsertQueueParts: r(insertQueuePartsSQL),
		UpsertQueueParts: r(upsertQueuePartsSQL),
		AcquirePart:      r(acquirePartSQL),
		ReleasePart:      r(releasePartSQL),
		QueueChangesBump: r(queueChangesBumpSQL),
		OwnedParts:       r(ownedPartsSQL),
		PartOwners:       r(partOwnersSQL),
		DropPartsAbove:   r(dropPartsAboveSQL),

		ClaimAny:               r(claimAnySQL),
		PostgresClaimAny:       r(postgresClaimAnySQL),
		ReapLeases:             r(reapLeasesSQL),
		PostgresReapLeases:     r(postgresReapLeasesSQL),
		AckMany:                r(ackManySQL),
		PostgresAckMany:        r(postgresAckManySQL),
		TakeAtMostOnce:         r(takeAtMostOnceSQL),
		PostgresTakeAtMostOnce: r(postgresTakeAtMostOnceSQL),
		Nack:                   r(nackSQL),
		Release:                r(coreReleaseSQL),
		DeadLetter:             r(deadLetterSQL),
		Extend:                 r(extendSQL),
		PostgresExtend:         r(postgresExtendSQL),
		ReapExhausted:          r(reapExhaustedSQL),
		ReapExpired:            r(reapExpiredSQL),
		FairHead:               r(fairHeadSQL),
		PostgresFairHead:       r(postgresFairHeadSQL),
		QueueSettings:          r(queueSettingsSQL),
		ConfigureQueue:         r(configureQueueSQL),
		ReleaseForgot:          r(releaseForgotSQL),
		PauseQueue:             r(pauseQueueSQL),
		QueuePaused:            r(queuePausedSQL),
		HeartbeatReport:        r(heartbeatReportSQL),
		Cancel:                 r(cancelSQL),
		DeadItems:              r(deadItemsSQL),
		Requeue:                r(requeueSQL),
		Backlog: r(`SELECT queue, part,
       count(*) FILTER (WHERE claim IS NULL),
       count(*) FILTER (WHERE claim IS NULL AND vesting_at <= now()),
       count(*) FILTER (WHERE claim IS NOT NULL)
FROM crdbwork_items GROUP BY queue, part ORDER BY queue, part`),
		DeadCount:   r(`SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1`),
		ItemColumns: itemColumns,
	}
}
