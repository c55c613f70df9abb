package store

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// fairFront reads, for the fair pacing of parts-mode sessions (package
// worker), the (k+1)-th earliest turn of queue $1's unclaimed items of
// priority $2, k = $3, and that item's part: a seek into
// crdbwork_items_turn_next (queue, priority, turn_at, part) WHERE claim IS
// NULL that reads k+1 entries (the index holds every column it returns:
// index-only on PostgreSQL), whatever the backlog. Skipping k entries
// keeps a few stragglers (a newcomer's item, an item just released) from
// standing for the front of the queue. The same text on both engines
// (CockroachDB docs checked: "LIMIT/OFFSET" — OFFSET skips rows of the
// ordered result; "Indexes: selection" — equality on the leading columns
// and ORDER BY on the next one read the index in order, with no sort), but
// for the test of the queue, which PostgreSQL's twin compares with (SELECT
// $1::TEXT) as the claims' twins do (pgClaimOrder).
const fairFront = `SELECT turn_at, part FROM crdbwork_items
WHERE queue = $1 AND priority = $2 AND claim IS NULL
ORDER BY turn_at LIMIT 1 OFFSET $3`

// ItemsFairFront returns the (skip+1)-th earliest turn of the queue's unclaimed
// items of priority and that item's part; ok is false if there are not
// that many. Nothing is locked: the answer only paces claims. d picks the
// statement's twin. Its errors are the driver's.
func (s *Store) ItemsFairFront(ctx context.Context, db DB, d Dialect, queue string, priority int64, skip int) (turn time.Time, part int, ok bool, err error) {
	rows, err := db.Query(ctx, byDialect(d, s.pace, s.pgPace), queue, priority, int64(skip))
	if err != nil {
		return time.Time{}, 0, false, err
	}
	defer rows.Close()
	for rows.Next() {
		var p int64
		if err := rows.Scan(&turn, &p); err != nil {
			return time.Time{}, 0, false, err
		}
		part, ok = int(p), true
	}
	return turn, part, ok, rows.Err()
}

// MaxFairPairs bounds the (tenant, priority) pairs one fairStatements.Lasts
// statement reads; a fair enqueue with more pairs sends several, in one
// pipelined batch.
const MaxFairPairs = 32

// fairStatements are the reads a fair queue's enqueue stamps its items
// from (claim.Queue.Enqueue), beside coreStatements.FairHead: the tenants'
// latest turns, rendered for a number of (tenant, priority) pairs.
//
// Each pair's read is an uncorrelated scalar subquery whose tenant and
// priority are parameters of its own: a single backward seek through
// crdbwork_items_tenant_turn, stopping at the first entry. The pairs are
// combined by UNION ALL, so no decorrelation rule applies: the former
// statement, one SELECT over unnest of the pairs with correlated ORDER BY
// ... LIMIT 1 subqueries, matches CockroachDB's rules that hoist a
// correlated limited subquery into a join (limits of one have their own
// rule; cockroachdb/cockroach#68299 added one for larger limits), which may
// read every unclaimed item of the tenants instead of one entry each.
// Rendered texts are cached per number of pairs (at most MaxFairPairs).
type fairStatements struct {
	t     Tables
	lasts [MaxFairPairs + 1]atomic.Pointer[string]
}

// newFairStatements returns the fair reads for t.
func newFairStatements(t Tables) *fairStatements { return &fairStatements{t: t} }

// Lasts returns the read of k pairs (1 to MaxFairPairs; it panics
// otherwise): $1 queue, then $(2i+2) the tenant and $(2i+3) the priority of
// pair i → one row per pair: i, the database's now(), and the latest turn
// of the tenant's unclaimed items of that priority (NULL if none); no row
// if the queue is not fair. Nothing is locked: the stamps only order
// claims, so a stale read costs some fairness, never an item. The same text
// on both engines.
func (f *fairStatements) Lasts(k int) string {
	if k < 1 || k > MaxFairPairs {
		panic(fmt.Sprintf("sql: a fair read of %d pairs (1 to %d)", k, MaxFairPairs))
	}
	slot := &f.lasts[k]
	if s := slot.Load(); s != nil {
		return *s
	}
	var b strings.Builder
	for i := range k {
		if i > 0 {
			b.WriteString("\n    UNION ALL\n")
		}
		fmt.Fprintf(&b, fairLastBranch, i, 2*i+2, 2*i+3)
	}
	s := rewrite(f.t, fmt.Sprintf(fairLastsTemplate, b.String()))
	slot.Store(&s)
	return s
}

// fairLastBranch is one pair's read: its index and its tenant's and
// priority's parameter numbers.
const fairLastBranch = `    SELECT %d AS n, (SELECT turn_at FROM crdbwork_items
        WHERE queue = $1 AND tenant = $%d AND priority = $%d AND claim IS NULL
        ORDER BY turn_at DESC LIMIT 1) AS last`

const fairLastsTemplate = `SELECT v.n, now(), v.last FROM (
%s) AS v
WHERE EXISTS (SELECT 1 FROM crdbwork_queues WHERE name = $1 AND fair)`
