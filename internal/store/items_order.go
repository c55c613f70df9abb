package store

import (
	"context"
	"fmt"
	"time"
)

// orderCountBefore counts, for each claimed item ($2 priorities, $3 turns,
// in order), the claimable items of queue $1 strictly before it in the
// claim order (priority, then turn): the popped element index that package
// bench/internal/order measures. The claim's own items are claimed by the time it
// runs, so they do not count. On PostgreSQL each count is a range scan of
// the unclaimed-items index crdbwork_items_turn_next (queue, priority,
// turn_at, part) WHERE claim IS NULL over the items before the claimed one:
// the row comparison is an index condition (TestOrderCountPlan).
// CockroachDB turns a tuple inequality against constants into index spans
// (its optimizer's idxconstraint, makeSpansForTupleInequality); against the
// correlated values here it plans a join, whose plan was not checked (no
// CockroachDB binary here). unnest of several arrays WITH ORDINALITY is
// documented by both engines (CockroachDB docs checked: "Functions and
// Operators", unnest(anyelement[], anyelement[], ...) "Returns the input
// arrays as a set of rows"; "Table Expressions", WITH ORDINALITY). The
// statement only measures: it is not on the claim path.
const orderCountBefore = `SELECT c.ord, (
    SELECT count(*) FROM crdbwork_items AS o
    WHERE o.queue = $1 AND o.claim IS NULL AND o.vesting_at <= now() AND o.attempts < o.max_attempts
      AND (o.expires_at IS NULL OR o.expires_at > now())
      AND (o.priority, o.turn_at) < (c.priority, c.turn_at))
FROM unnest($2::BIGINT[], $3::TIMESTAMPTZ[]) WITH ORDINALITY AS c (priority, turn_at, ord)
ORDER BY c.ord`

// OrderPosition is a claimed item's place in its queue's claim order.
type OrderPosition struct {
	Priority int
	TurnAt   time.Time
}

// ItemsOrderCountsBefore returns, for each of the items one claim of queue has
// just returned (their priorities and turns, in any order), the number of
// claimable items of queue strictly before it in the claim order, in the
// order of items: the popped element index of package bench/internal/order. It
// is one statement with its own snapshot. Its errors are the driver's
// (see sessions.go), or an error for a result that does not answer
// every item once.
func (s *Store) ItemsOrderCountsBefore(ctx context.Context, db DB, queue string, items []OrderPosition) ([]int64, error) {
	if len(items) == 0 {
		return nil, nil
	}
	prios := make([]int64, len(items))
	turns := make([]time.Time, len(items))
	for i, it := range items {
		prios[i], turns[i] = int64(it.Priority), it.TurnAt
	}
	rows, err := db.Query(ctx, s.order, queue, prios, turns)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	counts := make([]int64, len(items))
	seen := make([]bool, len(items))
	n := 0
	for rows.Next() {
		var ord, count int64
		if err := rows.Scan(&ord, &count); err != nil {
			return nil, err
		}
		if ord < 1 || ord > int64(len(items)) || seen[ord-1] {
			return nil, fmt.Errorf("crdbwork: a count for item %d of %d", ord, len(items))
		}
		counts[ord-1], seen[ord-1] = count, true
		n++
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if n != len(items) {
		return nil, fmt.Errorf("crdbwork: %d counts for %d claimed items", n, len(items))
	}
	return counts, nil
}
