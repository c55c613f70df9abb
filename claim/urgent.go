package claim

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/crdbwork/crdbwork/internal/retry"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// ClaimUrgent is the urgent lane: it claims up to n vested, unclaimed items
// of the queue whose priority is at most maxPriority, from any part, for
// session, lowest priority value first, then earliest vesting time.
//
// In parts mode each session claims the best items of its own parts only,
// so an urgent item waits for its part's owner, behind whatever that owner
// is busy with, while other sessions take less urgent items of their own
// parts: the order is relaxed (see the README's "How relaxed is the
// order"). A session that runs ClaimUrgent before ClaimParts takes the
// queue's most urgent items wherever they are, so an urgent item waits for
// the first session with a free slot rather than for its part's owner.
//
// The claims name no part, like Claim's: giving up the part does not
// release them; the lease, the session's end, Ack, Nack and Release do, as
// for any claim. An urgent item may thus run while its part's owner works
// on other items of the same key. Otherwise it is Claim: leases, tokens,
// pausing, the commit and an unknown outcome (see Claim) are the same.
//
// Concurrent claimers never get the same item. On CockroachDB a lane claim
// and a part claim may pick the same row and then wait for each other or
// retry (Stats.Retries["claim"]); on PostgreSQL they skip each other's
// rows (see sql.UrgentStatements).
func (q *Queue) ClaimUrgent(ctx context.Context, session uuid.UUID, maxPriority, n int) ([]Item, error) {
	if n <= 0 {
		return nil, nil
	}
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: claiming urgent items in %q: %w", q.opts.Queue, err)
	}
	e := q.engine.Load()
	stmt := q.urgentStatement(e)
	args := []any{session, q.opts.Queue, n, q.opts.Lease.Microseconds(), int64(maxPriority)}
	var items []Item
	run := func(ctx context.Context, db crsql.DB) error {
		rows, err := db.Query(ctx, stmt, args...)
		if err != nil {
			return err
		}
		items, err = scanItems(rows, session)
		return err
	}
	var err error
	if e.claimInTx {
		err = retry.Tx(ctx, q.db, q.stats.retried("claim"), func(ctx context.Context, tx pgx.Tx) error { return run(ctx, tx) })
	} else {
		err = retry.Do(ctx, q.stats.retried("claim"), func(ctx context.Context) error { return run(ctx, q.db) })
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" {
			return nil, fmt.Errorf("claim: claiming urgent items in %q for session %s: %w (%v)", q.opts.Queue, session, ErrNotOwner, pgErr.Message)
		}
		return nil, fmt.Errorf("claim: claiming urgent items in %q for session %s: %w", q.opts.Queue, session, crsql.Classify(err))
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].Priority != items[j].Priority {
			return items[i].Priority < items[j].Priority
		}
		return items[i].VestingAt.Before(items[j].VestingAt)
	})
	q.stats.claimed.Add(int64(len(items)))
	return items, nil
}

// urgentStatement returns the lane's claim for the engine e, rendering it
// on first use.
func (q *Queue) urgentStatement(e *engine) string {
	if s := q.urgent.Load(); s != nil {
		return *s
	}
	d := crsql.Postgres
	if e.claimInTx {
		d = crsql.Cockroach
	}
	s := crsql.NewUrgentStatements(q.opts.Tables).ForDialect(d)
	q.urgent.Store(&s)
	return s
}
