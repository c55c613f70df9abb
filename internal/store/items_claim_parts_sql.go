package store

import (
	"fmt"
	"strings"
	"sync/atomic"
)

// MaxPartBranches bounds the owned parts one per-part claim statement
// reads (partClaimStatements.Claim and Pick take 1 to MaxPartBranches
// parts). A session that owns more parts claims in one transaction with
// Pick per group of MaxPartBranches parts and ClaimPicked (claim.Queue does).
const MaxPartBranches = 16

// partClaimStatements are the per-part claim statements, rendered for one
// set of table names and a number of parts: one limited, locked index scan
// per owned part, combined by UNION ALL.
//
// The shape is chosen so that no decorrelation rule can turn it into a
// scan: nothing in it is correlated. The part numbers are parameters, one
// per branch, and each branch is a plain SELECT ... WHERE queue = $2 AND
// part = $k ... ORDER BY priority, turn_at LIMIT $3 FOR UPDATE SKIP LOCKED
// over crdbwork_items_part_turn (queue, part, priority, turn_at) WHERE claim
// IS NULL: a seek into one part that stops after $3 unlocked, claimable
// entries. The former shape, a LATERAL subquery over unnest of an array of
// parts, is a correlated ORDER BY ... LIMIT n, which CockroachDB's optimizer
// may decorrelate (since 21.2, cockroachdb/cockroach#68299: a row_number
// window partitioned by the outer row, filtered to the first n) into a
// scan of every unclaimed row of the listed parts, all of them locked under
// FOR UPDATE (cockroachdb/cockroach#165983, open, shows that rule applied to
// a LATERAL over unnest). Each branch is a derived table with its own
// locking clause, the form both engines document: a locking clause applies
// to the tables in its own SELECT's FROM (PostgreSQL refuses one on a UNION
// as a whole; CockroachDB docs checked: "SELECT FOR UPDATE", SKIP LOCKED
// since 22.2; "Selection Queries": UNION ALL of parenthesized selects).
//
// The statement then keeps the best $3 of the branches' rows in (priority,
// turn_at) order, as the former one did, and claims them: it may lock up to
// $3 rows per owned part and hand out only $3 in all, which is harmless (a
// part is owned by one session, and the locks end with the claim's
// transaction). Rendered texts are cached per number of parts, so at most
// MaxPartBranches texts per dialect exist.
type partClaimStatements struct {
	t Tables
	// claims[d][k] is the claim for k parts in dialect d, shares[d][k] the
	// same with a limit per part (ClaimShares); picks[k] the pick.
	claims [2][MaxPartBranches + 1]atomic.Pointer[string]
	shares [2][MaxPartBranches + 1]atomic.Pointer[string]
	picks  [MaxPartBranches + 1]atomic.Pointer[string]
	// ClaimPicked claims the items Pick returned (chosen by the caller
	// across several Picks), in the transaction that picked them:
	// $1 session, $2 lease (µs), $3 ids → item columns. Its PostgreSQL twin
	// is PostgresClaimPicked (see ClaimPickedFor).
	ClaimPicked, PostgresClaimPicked string
}

// newPartClaimStatements returns the per-part claim statements for t.
func newPartClaimStatements(t Tables) *partClaimStatements {
	p := &partClaimStatements{t: t}
	p.ClaimPicked = rewrite(t, claimPickedSQL)
	p.PostgresClaimPicked = rewrite(t, postgresClaimPickedSQL)
	return p
}

// claimPickedSQL is the text of partClaimStatements.ClaimPicked
// (rendered by newPartClaimStatements).
var claimPickedSQL = fmt.Sprintf(claimPickedTemplate, `FROM (SELECT unnest($3::UUID[]) AS id) AS picked
WHERE i.id = picked.id AND i.claim IS NULL`)

// postgresClaimPickedSQL is the text of partClaimStatements.PostgresClaimPicked
// (rendered by newPartClaimStatements).
var postgresClaimPickedSQL = fmt.Sprintf(claimPickedTemplate, `FROM unnest($3::UUID[]) AS k (key_id)
WHERE i.id = ANY(ARRAY[k.key_id]) AND (i.claim IS NULL OR k.key_id IS NULL)`)

// ClaimPickedFor returns ClaimPicked, or its PostgreSQL twin on PostgreSQL.
func (p *partClaimStatements) ClaimPickedFor(d Dialect) string {
	if d == Postgres {
		return p.PostgresClaimPicked
	}
	return p.ClaimPicked
}

// Claim returns the per-part claim for k owned parts (1 to
// MaxPartBranches; it panics otherwise) in dialect d. Parameters: $1
// session, $2 queue, $3 limit, $4 lease (µs), $5 tenants to skip (TEXT[]),
// $6 to $(5+k) the parts → item columns, at most $3 rows, the best in
// (priority, turn_at) order across the parts. Run it as the any-part claim
// is run (see claimTemplate): in an explicit SERIALIZABLE transaction on
// CockroachDB. On PostgreSQL the UPDATE finds the picked rows by
// id = ANY(ARRAY(SELECT id FROM picked)), as the other PostgreSQL twins do.
func (p *partClaimStatements) Claim(d Dialect, k int) string {
	checkParts(k)
	return p.claim(&p.claims[d][k], d, k, "$3")
}

// ClaimShares returns Claim for k owned parts in dialect d with each
// part's branch limited to its own parameter, $(6+k) (its share, at most
// $3), instead of $3: the claim locks at most k·$(6+k) rows rather than
// k·$3, and still hands out the best $3 of them in (priority, turn_at)
// order. It serves claims over parts that each hold an even share of the
// queue's turns (a fair queue's spread tenants, claim's fairspread.go), where
// the best $3 across the parts are about $3/k of each. The parameters are
// Claim's, then the share; the text is the same but for each branch's LIMIT.
func (p *partClaimStatements) ClaimShares(d Dialect, k int) string {
	checkParts(k)
	return p.claim(&p.shares[d][k], d, k, fmt.Sprintf("$%d", 6+k))
}

// claim returns the claim for k parts in dialect d whose branches are
// limited to limit (a parameter), rendered once into slot.
func (p *partClaimStatements) claim(slot *atomic.Pointer[string], d Dialect, k int, limit string) string {
	if s := slot.Load(); s != nil {
		return *s
	}
	how := joinPicked
	if d == Postgres {
		how = anyPicked
	}
	s := rewrite(p.t, fmt.Sprintf(partUnionClaimTemplate, partBranches(k, "$2", limit, "$5", 6), how))
	slot.Store(&s)
	return s
}

// Pick returns the locking read of the per-part claim for k parts (1 to
// MaxPartBranches; it panics otherwise), for sessions owning more parts
// than one Claim reads: $1 queue, $2 limit, $3 tenants to skip (TEXT[]), $4
// to $(3+k) the parts → id, priority, turn_at of at most $2 rows, the best
// in (priority, turn_at) order, locked (FOR UPDATE SKIP LOCKED) until the
// transaction ends. The same text on both engines.
func (p *partClaimStatements) Pick(k int) string {
	checkParts(k)
	slot := &p.picks[k]
	if s := slot.Load(); s != nil {
		return *s
	}
	s := rewrite(p.t, fmt.Sprintf(partPickTemplate, partBranches(k, "$1", "$2", "$3", 4)))
	slot.Store(&s)
	return s
}

func checkParts(k int) {
	if k < 1 || k > MaxPartBranches {
		panic(fmt.Sprintf("sql: a per-part claim of %d parts (1 to %d)", k, MaxPartBranches))
	}
}

// partBranches renders the UNION ALL of k per-part scans: queue, limit and
// skip (the tenants to skip) are parameters such as "$2", and the parts are
// parameters $first to $(first+k-1).
func partBranches(k int, queue, limit, skip string, first int) string {
	var b strings.Builder
	for j := range k {
		if j > 0 {
			b.WriteString("\n        UNION ALL\n")
		}
		fmt.Fprintf(&b, partBranch, queue, first+j, skip, limit, j)
	}
	return b.String()
}

// partBranch is one part's scan: the queue's parameter, the part's
// parameter's number, the tenants' parameter, the limit's parameter and the
// alias's number.
const partBranch = `        SELECT id, priority, turn_at FROM (
            SELECT id, priority, turn_at FROM crdbwork_items
            WHERE queue = %s AND part = $%d AND claim IS NULL AND vesting_at <= now() AND attempts < max_attempts
              AND (expires_at IS NULL OR expires_at > now()) AND (tenant IS NULL OR NOT (tenant = ANY(%s::TEXT[])))
            ORDER BY priority, turn_at
            LIMIT %s
            FOR UPDATE SKIP LOCKED) AS p%d`

// partUnionClaimTemplate is the claim over the branches (first %s) with
// the UPDATE finding the picked rows (second %s), as in partClaimTemplate.
const partUnionClaimTemplate = `WITH picked AS MATERIALIZED (
    SELECT c.id FROM (
%s) AS c
    WHERE NOT EXISTS (SELECT 1 FROM crdbwork_queues WHERE name = $2 AND paused)
    ORDER BY c.priority, c.turn_at
    LIMIT $3)
UPDATE crdbwork_items AS i
SET claim = $1, claim_queue = i.queue, claim_part = i.part, claimed_at = now(),
    attempts = i.attempts + 1, claim_token = i.claim_token + 1,
    lease_until = now() + $4::BIGINT * INTERVAL '1 microsecond'
%s AND i.claim IS NULL
RETURNING ` + itemColumns

// partPickTemplate is Pick over the branches (%s; queue $1, limit $2).
const partPickTemplate = `SELECT c.id, c.priority, c.turn_at FROM (
%s) AS c
WHERE NOT EXISTS (SELECT 1 FROM crdbwork_queues WHERE name = $1 AND paused)
ORDER BY c.priority, c.turn_at
LIMIT $2`

// claimPickedTemplate claims picked rows by id (%s: how the UPDATE finds
// them and rechecks claim IS NULL; on CockroachDB a join with the unnested
// ids, which it plans as primary-key lookups, on PostgreSQL a nested loop of
// primary-key lookups shaped as the fenced twins are (see fenced in
// statements.go), with the recheck in a condition that names k too (k.key_id
// is never NULL where i.id matched it): a join condition, which neither
// proves the predicate of the partial indexes of unclaimed items nor makes
// a scan of the table look cheap. With id = ANY(ARRAY(...)) and a plain
// claim IS NULL, PostgreSQL read an empty table's rows through
// crdbwork_items_part_turn, whole; with the recheck alone in IS TRUE, it
// scanned the table.) The rows are locked by the Picks of the same
// transaction; the recheck of claim IS NULL is for READ COMMITTED.
const claimPickedTemplate = `UPDATE crdbwork_items AS i
SET claim = $1, claim_queue = i.queue, claim_part = i.part, claimed_at = now(),
    attempts = i.attempts + 1, claim_token = i.claim_token + 1,
    lease_until = now() + $2::BIGINT * INTERVAL '1 microsecond'
%s
RETURNING ` + itemColumns
