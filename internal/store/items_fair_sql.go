package store

import (
	"fmt"
	"strings"
	"sync/atomic"
)

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
