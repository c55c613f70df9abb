package store

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The dashboard's item list across queues and its search (package
// dashboard, the Items page). Each statement reads one window of at most
// its limit of index entries, in the order of an index that holds only the
// rows of the state listed (unclaimed, claimed, dead), from a cursor, and
// says of each row whether it matches the search text: its id, key,
// tenant or kind starts with the text, or its payload holds the text's bytes. The
// match is computed in the statement, so that the payloads stay in the
// database; a window where nothing matches costs its limit of index
// entries and as many row reads (on 100,000 items: a window of 2,000
// entries, the dashboard's default ScanWindow, in tens of milliseconds on
// PostgreSQL; see docs/dashboard.md), and the caller reads window after
// window ("search on") rather than the whole table.
//
// Across queues, the order is the per-queue order behind the queue's name:
// (queue, priority, turn_at, part, id) through crdbwork_items_turn_next for
// unclaimed items, (queue, lease_until, id) through crdbwork_items_lease for
// claimed ones, and (queue, died_at, id, death), all descending, through
// crdbwork_dead_items_by_queue for dead ones (newest first within a queue,
// queues in reverse name order: one backward scan of the index). Both
// engines: row-value comparisons for the cursors as in dashboardStatements,
// position(bytes IN bytes), substr and ::TEXT of a UUID, which both accept.
//
// Parameters: $1 the search text ('' matches every row), $2 its bytes, then
// the statement's own.

// searchMatch is the match column of the search statements: $1 TEXT, $2
// BYTEA.
const searchMatch = `COALESCE($1::TEXT = '' OR substr(id::TEXT, 1, length($1::TEXT)) = $1::TEXT
  OR substr(item_key, 1, length($1::TEXT)) = $1::TEXT OR substr(tenant, 1, length($1::TEXT)) = $1::TEXT
  OR substr(kind, 1, length($1::TEXT)) = $1::TEXT OR position($2::BYTEA IN payload) > 0, false)`

// searchItemColumns are the columns of an item of a search window: those of
// a page, its queue and whether it matches.
const searchItemColumns = dashItemColumns + `, queue, ` + searchMatch

// searchDeadColumns are the columns of a death of a search window.
const searchDeadColumns = deadPageColumns + `, queue, ` + searchMatch

// searchStatements are the statements of the search windows (see above).
type searchStatements struct {
	// unclaimed, unclaimedAfter: $3 queue, [$4 priority, $5 turn_at, $6
	// part, $7 id,] then the limit → item columns, queue, match; in claim
	// order through crdbwork_items_turn_next.
	unclaimed, unclaimedAfter string
	// unclaimedAll, unclaimedAllAfter: as unclaimed, of every queue: [$3
	// queue, $4 priority, $5 turn_at, $6 part, $7 id,] then the limit.
	unclaimedAll, unclaimedAllAfter string
	// claimed, claimedAfter: $3 queue, [$4 lease_until, $5 id,] then the
	// limit; in lease order through crdbwork_items_lease.
	claimed, claimedAfter string
	// claimedAll, claimedAllAfter: as claimed, of every queue: [$3 queue,
	// $4 lease_until, $5 id,] then the limit.
	claimedAll, claimedAllAfter string
	// dead, deadAfter: $3 queue, [$4 died_at, $5 id, $6 death,] then the
	// limit → dead item columns, queue, match; newest first through
	// crdbwork_dead_items_by_queue.
	dead, deadAfter string
	// deadAll, deadAllAfter: as dead, of every queue (queues in reverse name
	// order): [$3 queue, $4 died_at, $5 id, $6 death,] then the limit.
	deadAll, deadAllAfter string
}

func newSearchStatements(t Tables) searchStatements {
	r := func(text string) string { return rewrite(t, text) }
	return searchStatements{
		unclaimed: r(searchUnclaimedSQL), unclaimedAfter: r(searchUnclaimedAfterSQL),
		unclaimedAll: r(searchUnclaimedAllSQL), unclaimedAllAfter: r(searchUnclaimedAllAfterSQL),
		claimed: r(searchClaimedSQL), claimedAfter: r(searchClaimedAfterSQL),
		claimedAll: r(searchClaimedAllSQL), claimedAllAfter: r(searchClaimedAllAfterSQL),
		dead: r(searchDeadSQL), deadAfter: r(searchDeadAfterSQL),
		deadAll: r(searchDeadAllSQL), deadAllAfter: r(searchDeadAllAfterSQL),
	}
}

// searchUnclaimedSQL is the text of searchStatements.unclaimed.
const searchUnclaimedSQL = `SELECT ` + searchItemColumns + ` FROM crdbwork_items
WHERE queue = $3 AND claim IS NULL
ORDER BY priority, turn_at, part, id LIMIT $4`

// searchUnclaimedAfterSQL is the text of searchStatements.unclaimedAfter.
const searchUnclaimedAfterSQL = `SELECT ` + searchItemColumns + ` FROM crdbwork_items
WHERE queue = $3 AND claim IS NULL AND (priority, turn_at, part) >= ($4, $5, $6)
  AND NOT (priority = $4 AND turn_at = $5 AND part = $6 AND id <= $7)
ORDER BY priority, turn_at, part, id LIMIT $8`

// searchUnclaimedAllSQL is the text of searchStatements.unclaimedAll.
const searchUnclaimedAllSQL = `SELECT ` + searchItemColumns + ` FROM crdbwork_items
WHERE claim IS NULL
ORDER BY queue, priority, turn_at, part, id LIMIT $3`

// searchUnclaimedAllAfterSQL is the text of searchStatements.unclaimedAllAfter.
const searchUnclaimedAllAfterSQL = `SELECT ` + searchItemColumns + ` FROM crdbwork_items
WHERE claim IS NULL AND (queue, priority, turn_at, part) >= ($3, $4, $5, $6)
  AND NOT (queue = $3 AND priority = $4 AND turn_at = $5 AND part = $6 AND id <= $7)
ORDER BY queue, priority, turn_at, part, id LIMIT $8`

// searchClaimedSQL is the text of searchStatements.claimed.
const searchClaimedSQL = `SELECT ` + searchItemColumns + ` FROM crdbwork_items
WHERE queue = $3 AND claim IS NOT NULL
ORDER BY lease_until, id LIMIT $4`

// searchClaimedAfterSQL is the text of searchStatements.claimedAfter.
const searchClaimedAfterSQL = `SELECT ` + searchItemColumns + ` FROM crdbwork_items
WHERE queue = $3 AND claim IS NOT NULL AND lease_until >= $4 AND (lease_until, id) > ($4, $5)
ORDER BY lease_until, id LIMIT $6`

// searchClaimedAllSQL is the text of searchStatements.claimedAll.
const searchClaimedAllSQL = `SELECT ` + searchItemColumns + ` FROM crdbwork_items
WHERE claim IS NOT NULL
ORDER BY queue, lease_until, id LIMIT $3`

// searchClaimedAllAfterSQL is the text of searchStatements.claimedAllAfter.
const searchClaimedAllAfterSQL = `SELECT ` + searchItemColumns + ` FROM crdbwork_items
WHERE claim IS NOT NULL AND (queue, lease_until) >= ($3, $4) AND (queue, lease_until, id) > ($3, $4, $5)
ORDER BY queue, lease_until, id LIMIT $6`

// ItemsSearch is one window of ItemsSearchWindow.
type ItemsSearch struct {
	// Queue is the queue listed; "" lists every queue.
	Queue string
	// Claimed lists the claimed items (lease order), otherwise the
	// unclaimed ones (claim order).
	Claimed bool
	// Text is the search text: a row matches when its id, key, tenant or
	// kind starts with it or its payload holds it; "" matches every row.
	Text string
	// After is the position of the last row of the previous window (nil:
	// from the first); its Queue counts when Queue is "".
	After *ItemPosition
	// Limit bounds the rows (index entries) the window reads.
	Limit int
}

// ItemsSearchWindow reads one window of items (ItemsSearch), each with its
// queue and whether it matches the search text (ItemRow.Queue, Match): at
// most q.Limit entries of crdbwork_items_turn_next or crdbwork_items_lease
// (searchStatements).
func (s *Store) ItemsSearchWindow(ctx context.Context, db DB, q ItemsSearch) ([]ItemRow, error) {
	st := &s.dash().search
	a := q.After
	args := []any{q.Text, []byte(q.Text)}
	var stmt string
	switch {
	case q.Claimed && q.Queue == "" && a == nil:
		stmt = st.claimedAll
	case q.Claimed && q.Queue == "":
		stmt, args = st.claimedAllAfter, append(args, a.Queue, a.LeaseUntil, a.ID)
	case q.Claimed && a == nil:
		stmt, args = st.claimed, append(args, q.Queue)
	case q.Claimed:
		stmt, args = st.claimedAfter, append(args, q.Queue, a.LeaseUntil, a.ID)
	case q.Queue == "" && a == nil:
		stmt = st.unclaimedAll
	case q.Queue == "":
		stmt, args = st.unclaimedAllAfter, append(args, a.Queue, a.Priority, a.TurnAt, a.Part, a.ID)
	case a == nil:
		stmt, args = st.unclaimed, append(args, q.Queue)
	default:
		stmt, args = st.unclaimedAfter, append(args, q.Queue, a.Priority, a.TurnAt, a.Part, a.ID)
	}
	rows, err := db.Query(ctx, stmt, append(args, q.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("crdbwork: searching items: %w", err)
	}
	out, err := scanItemRows(rows, func(r *ItemRow) []any { return []any{&r.Queue, &r.Match} })
	if err != nil {
		return nil, fmt.Errorf("crdbwork: searching items: %w", err)
	}
	return out, nil
}

// searchDeadSQL is the text of searchStatements.dead.
const searchDeadSQL = `SELECT ` + searchDeadColumns + ` FROM crdbwork_dead_items
WHERE queue = $3
ORDER BY died_at DESC, id DESC, death DESC LIMIT $4`

// searchDeadAfterSQL is the text of searchStatements.deadAfter.
const searchDeadAfterSQL = `SELECT ` + searchDeadColumns + ` FROM crdbwork_dead_items
WHERE queue = $3 AND died_at <= $4 AND (died_at, id, death) < ($4, $5, $6)
ORDER BY died_at DESC, id DESC, death DESC LIMIT $7`

// searchDeadAllSQL is the text of searchStatements.deadAll.
const searchDeadAllSQL = `SELECT ` + searchDeadColumns + ` FROM crdbwork_dead_items
ORDER BY queue DESC, died_at DESC, id DESC, death DESC LIMIT $3`

// searchDeadAllAfterSQL is the text of searchStatements.deadAllAfter.
const searchDeadAllAfterSQL = `SELECT ` + searchDeadColumns + ` FROM crdbwork_dead_items
WHERE queue <= $3 AND (queue, died_at, id, death) < ($3, $4, $5, $6)
ORDER BY queue DESC, died_at DESC, id DESC, death DESC LIMIT $7`

// DeadSearchPosition is a place in the order of DeadSearchWindow: the last
// row of a window.
type DeadSearchPosition struct {
	Queue     string
	DiedAt    time.Time
	ID, Death uuid.UUID
}

// DeadSearchWindow reads one window of deaths of queue ("": every queue),
// newest first, after the position after (nil: from the first), each with
// its queue and whether it matches text (as ItemsSearch.Text): at most
// limit entries of crdbwork_dead_items_by_queue (searchStatements).
func (s *Store) DeadSearchWindow(ctx context.Context, db DB, queue, text string, after *DeadSearchPosition, limit int) ([]DeadPageRow, error) {
	st := &s.dash().search
	args := []any{text, []byte(text)}
	var stmt string
	switch {
	case queue == "" && after == nil:
		stmt = st.deadAll
	case queue == "":
		stmt, args = st.deadAllAfter, append(args, after.Queue, after.DiedAt, after.ID, after.Death)
	case after == nil:
		stmt, args = st.dead, append(args, queue)
	default:
		stmt, args = st.deadAfter, append(args, queue, after.DiedAt, after.ID, after.Death)
	}
	rows, err := db.Query(ctx, stmt, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("crdbwork: searching dead items: %w", err)
	}
	var out []DeadPageRow
	var r DeadPageRow
	var part int64
	var key, lastErr, ten, kind *string
	if _, err := pgx.ForEachRow(rows, []any{&r.ID, &r.Death, &part, &key, &r.Priority, &r.Attempts, &r.MaxAttempts,
		&lastErr, &r.EnqueuedAt, &r.DiedAt, &ten, &r.Reason, &r.PayloadSize, &kind, &r.Queue, &r.Match}, func() error {
		r.Part, r.Key, r.LastError, r.Tenant, r.Kind = int(part), deref(key), deref(lastErr), deref(ten), deref(kind)
		out = append(out, r)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("crdbwork: searching dead items: %w", err)
	}
	return out, nil
}
