package store

import (
	"fmt"
	"strings"
)

// urgentStatements are the urgent lane's claim, rendered for one set of
// table names: the any-part claim restricted to items with priority at most
// a threshold, which any live session may run in parts mode, whoever owns
// the item's part. It bounds how far out of order urgent items are claimed
// (their popped element index; see bench/internal/order and docs/parts-and-order.md,
// "How relaxed the order is").
type urgentStatements struct {
	// ClaimUrgent claims for session $1 up to $3 vested, unexpired,
	// unclaimed items of queue $2 with priority <= $6, leaving out the
	// tenants of $5 (TEXT[]), lowest priority first, then earliest turn,
	// with a lease of $4 microseconds → the item columns. The
	// claims name no part (claim_queue and claim_part NULL, as Claim's):
	// giving up a part does not release them, deleting the session does.
	//
	// Items of limited tenants are taken only from the parts in $9
	// (BIGINT[]: the parts the session owns): every tenant's if $7 (BOOL:
	// a default tenant limit applies to all), otherwise those of the
	// tenants in $8 (TEXT[]). In parts mode a tenant's limit is enforced
	// by the owner of the tenant's part, which sees all of the tenant's
	// items there; a lane claim from any part would let every session run
	// up to the whole limit. Items without a tenant, and of tenants not
	// limited, come from any part. Empty $8 and $9 with $7 false restrict
	// nothing.
	//
	// It is the any-part claim with one more condition, priority <= $6, a
	// range on the second column of crdbwork_items_turn_next (queue,
	// priority, turn_at, part) WHERE claim IS NULL: the scan reads the
	// urgent items in claim order and stops after $3 unlocked ones, and
	// reads nothing past the threshold (internal/store/explain_test.go checks the plan;
	// CockroachDB docs "Indexes: selection" — a range on a column after
	// equality-constrained ones constrains the index span).
	//
	// Part claims scan crdbwork_items_part_turn instead. On PostgreSQL SKIP
	// LOCKED skips rows (heap tuples) locked by either claim, so the two
	// never pick the same row. On CockroachDB SKIP LOCKED sees only the locks
	// of the index it scans (cockroachdb/cockroach#57031): a lane claim and
	// the part owner's claim may pick the same urgent row, and the UPDATE's
	// recheck (i.claim IS NULL) gives it to one of them; the other waits for
	// the row's lock or retries (counted in claim.Stats.Retries["claim"]).
	// No item is ever claimed twice.
	ClaimUrgent string
	// PostgresClaimUrgent is its PostgreSQL twin: the UPDATE finds the
	// picked rows by id = ANY(ARRAY(SELECT id FROM picked)), and the scan
	// compares the queue with (SELECT $2::TEXT), as the other PostgreSQL
	// claims do (see dialectStatements and pgClaimOrder).
	PostgresClaimUrgent string
}

// urgentCondition is the lane's condition, added to the any-part claim's
// WHERE clause after claim IS NULL: the priority bound, and the parts the
// items of limited tenants may come from. (Residual filters on the rows
// the scan of crdbwork_items_turn_next reads: the scan is still bounded by
// the priority range, as TestStatementPlansUseIndexes checks.)
const (
	urgentAnchor    = "WHERE queue = $2 AND claim IS NULL AND "
	urgentCondition = "priority <= $6 AND (tenant IS NULL OR part = ANY($9::BIGINT[]) OR (NOT $7::BOOL AND NOT (tenant = ANY($8::TEXT[])))) AND "
)

// urgentTemplate returns the any-part claim template with the lane's
// condition. It panics if the template no longer has the anchor it is
// added after (a change to claimTemplate that this file must follow;
// TestUrgentClaimStatement would fail first).
func urgentTemplate() string {
	if strings.Count(claimTemplate, urgentAnchor) != 1 {
		panic("sql: the any-part claim template changed: the urgent lane's condition has no place")
	}
	return strings.Replace(claimTemplate, urgentAnchor, urgentAnchor+urgentCondition, 1)
}

// newUrgentStatements renders the urgent lane's statements for t.
func newUrgentStatements(t Tables) *urgentStatements {
	tmpl := urgentTemplate()
	return &urgentStatements{
		ClaimUrgent:         rewrite(t, fmt.Sprintf(tmpl, joinPicked)),
		PostgresClaimUrgent: rewrite(t, fmt.Sprintf(pgClaimOrder(tmpl), anyPicked)),
	}
}

// ForDialect returns the lane's claim for d.
func (u *urgentStatements) ForDialect(d Dialect) string {
	if d == Postgres {
		return u.PostgresClaimUrgent
	}
	return u.ClaimUrgent
}
