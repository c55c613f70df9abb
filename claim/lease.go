package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// CrashLoopError is the last error of an item that Reap moved to the dead
// items because its attempts were used up without an ack or a nack.
const CrashLoopError = "attempts used up without an ack or nack: the handler or the process died on every attempt"

// reapBatch bounds the rows one statement of Reap releases or moves.
const reapBatch = 1000

// Extend moves the leases of items that are still claimed (same session,
// same token) to now()+d by the database clock, in one statement, and
// returns those items with their new LeaseUntil. Items missing from the
// result lost their claims (acked, released, reaped, or their session is
// gone): stop working on them. A long-running handler's worker calls it
// well before LeaseUntil.
func (q *Queue) Extend(ctx context.Context, items []Item, d time.Duration) ([]Item, error) {
	if d < time.Millisecond || d > maxLease {
		return nil, fmt.Errorf("claim: extending leases in %q: duration %v must be between 1ms and %v", q.opts.Queue, d, maxLease)
	}
	if len(items) == 0 {
		return nil, nil
	}
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: extending leases in %q: %w", q.opts.Queue, err)
	}
	ids, sessions, tokens := claimArrays(items)
	var until map[uuid.UUID]time.Time
	err := retry.Do(ctx, q.stats.retried("extend"), func(ctx context.Context) error {
		rows, err := q.db.Query(ctx, q.engine.Load().st.Extend, ids, sessions, tokens, d.Microseconds())
		if err != nil {
			return crsql.Classify(err)
		}
		defer rows.Close()
		until = make(map[uuid.UUID]time.Time, len(items))
		for rows.Next() {
			var id uuid.UUID
			var t time.Time
			if err := rows.Scan(&id, &t); err != nil {
				return err
			}
			until[id] = t
		}
		return crsql.Classify(rows.Err())
	})
	if err != nil {
		return nil, fmt.Errorf("claim: extending the leases of %d items in %q: %w", len(items), q.opts.Queue, err)
	}
	var out []Item
	for _, it := range items {
		if t, ok := until[it.ID]; ok {
			it.LeaseUntil = t
			out = append(out, it)
			delete(until, it.ID)
		}
	}
	q.stats.lost.Add(int64(len(items) - len(out)))
	return out, nil
}

// ReapStats says what one Reap did.
type ReapStats struct {
	// Released counts items whose lease had expired, released with their
	// attempt counted: they are claimable again.
	Released int
	// Dead counts unclaimed items whose attempts were used up, moved to the
	// dead items with CrashLoopError as their last error (reason "crash
	// loop").
	Dead int
	// Expired counts unclaimed items past their deadline (NewItem.TTL),
	// moved to the dead items with reason "expired".
	Expired int
}

// Reap releases the queue's items whose lease expired, whoever claimed them
// (a hung handler, a claim whose answer was lost, a process that forgot an
// item), and moves its unclaimed items whose attempts are used up to the
// dead items with CrashLoopError as their last error, and its unclaimed
// items past their deadline with reason "expired". It works in bounded
// batches until nothing is left. Any session may run it at any time; it is
// idempotent, and acks of reaped claims are refused (ErrClaimLost: the token
// fences them).
func (q *Queue) Reap(ctx context.Context) (ReapStats, error) {
	var st ReapStats
	if err := q.ready(ctx); err != nil {
		return st, fmt.Errorf("claim: reaping %q: %w", q.opts.Queue, err)
	}
	for {
		n, err := q.reapStep(ctx, q.engine.Load().st.ReapLeases, q.opts.Queue, reapBatch)
		st.Released += n
		if err != nil {
			return st, fmt.Errorf("claim: releasing expired leases in %q: %w", q.opts.Queue, err)
		}
		if n < reapBatch {
			break
		}
	}
	for {
		n, err := q.reapStep(ctx, q.st.ReapExhausted, q.opts.Queue, reapBatch, CrashLoopError)
		st.Dead += n
		if err != nil {
			return st, fmt.Errorf("claim: dead-lettering exhausted items of %q: %w", q.opts.Queue, err)
		}
		if n < reapBatch {
			break
		}
	}
	for {
		n, err := q.reapStep(ctx, q.st.ReapExpired, q.opts.Queue, reapBatch)
		st.Expired += n
		if err != nil {
			return st, fmt.Errorf("claim: dead-lettering expired items of %q: %w", q.opts.Queue, err)
		}
		if n < reapBatch {
			break
		}
	}
	q.stats.reaped.Add(int64(st.Released))
	q.stats.dead.Add(int64(st.Dead + st.Expired))
	return st, nil
}

// reapStep runs one batch of Reap in a SERIALIZABLE transaction (its
// statements lock with SKIP LOCKED; see sql.Statements) and returns its rows.
func (q *Queue) reapStep(ctx context.Context, stmt string, args ...any) (int, error) {
	var n int
	err := retry.Tx(ctx, q.db, q.stats.retried("reap"), func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, stmt, args...)
		n = int(tag.RowsAffected())
		return crsql.Classify(err)
	})
	return n, err
}

// ReleaseForgotten releases the items of this queue claimed by session that
// are not in keep, giving their attempts back, and returns how many it
// released. A worker calls it after a claim whose outcome was unknown
// (ErrOutcomeUnknown), with the ids of the items it is working on: the items
// that claim may have taken are released at once instead of at the end of
// their leases.
func (q *Queue) ReleaseForgotten(ctx context.Context, session uuid.UUID, keep []uuid.UUID) (int, error) {
	if keep == nil {
		keep = []uuid.UUID{}
	}
	if err := q.ready(ctx); err != nil {
		return 0, fmt.Errorf("claim: releasing forgotten claims in %q: %w", q.opts.Queue, err)
	}
	var n int
	err := retry.Do(ctx, q.stats.retried("release"), func(ctx context.Context) error {
		tag, err := q.db.Exec(ctx, q.st.ReleaseForgot, q.opts.Queue, session, keep)
		n = int(tag.RowsAffected())
		return crsql.Classify(err)
	})
	if err != nil {
		return 0, fmt.Errorf("claim: releasing forgotten claims of session %s in %q: %w", session, q.opts.Queue, err)
	}
	q.stats.released.Add(int64(n))
	return n, nil
}

// claimArrays returns the ids, sessions and tokens of items, the arrays of
// the set-based statements. The UUIDs go as [16]byte, which pgx encodes
// directly (uuid.UUID goes through its text form, a fifth of a worker's
// client CPU in the bench).
func claimArrays(items []Item) (ids, sessions [][16]byte, tokens []int64) {
	ids = make([][16]byte, len(items))
	sessions = make([][16]byte, len(items))
	tokens = make([]int64, len(items))
	for i, it := range items {
		ids[i], sessions[i], tokens[i] = it.ID, it.Session, it.Token
	}
	return ids, sessions, tokens
}
