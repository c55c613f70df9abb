package store

import (
	"context"
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

// FairFront returns the (skip+1)-th earliest turn of the queue's unclaimed
// items of priority and that item's part; ok is false if there are not
// that many. Nothing is locked: the answer only paces claims. d picks the
// statement's twin. Its errors are the driver's.
func (s *Store) FairFront(ctx context.Context, db DB, d Dialect, queue string, priority int64, skip int) (turn time.Time, part int, ok bool, err error) {
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
