package claim_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// A reap never waits for a dependent another transaction holds (a release
// after an ack, a cancel): it leaves that one, with its edge, and settles
// the rest. Issue 29 saw a SERIALIZABLE sweep wait 14 s behind a release
// and then fail. Here a transaction holds one dependent's row while Reap
// runs; two prerequisites were acked by a version-4 worker (no release),
// so only the reap can release their dependents. On PostgreSQL the test
// watches pg_locks while Reap runs: Reap may never wait for a lock (before
// the fix it waited until the holder ended). Reap returns without error,
// the held dependent still waits, the other is released; once the holder
// ends, the next reap releases it too.
func TestDependsReapSkipsHeldDependents(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	const queue = "held"
	q := newQueue(t, pool, claim.Options{Queue: queue})
	p1, p2, held, free := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	if _, err := q.Enqueue(ctx,
		claim.NewItem{ID: p1, Payload: []byte("p1")}, claim.NewItem{ID: p2, Payload: []byte("p2")},
		claim.NewItem{ID: held, Payload: []byte("held"), After: []uuid.UUID{p1}},
		claim.NewItem{ID: free, Payload: []byte("free"), After: []uuid.UUID{p2}}); err != nil {
		t.Fatal(err)
	}
	s := startSession(t, ctx, pool)
	got := claimEvery(t, q, s.ID())
	if len(got) != 2 {
		t.Fatalf("claimed %d items, want the two prerequisites", len(got))
	}
	d, err := store.DetectDialect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	keys := []store.ClaimKey{{ID: got[0].ID, Session: got[0].Session, Token: got[0].Token}, {ID: got[1].ID, Session: got[1].Session, Token: got[1].Token}}
	if err := retry.Tx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := store.New(crsql.Tables{}).ItemsAck(ctx, tx, d, keys) // a version-4 ack: no release
		return err
	}); err != nil {
		t.Fatal(err)
	}

	// A transaction holds the dependent's row, as a release does.
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	var holderPID int
	if testdb.Kind(t) == "postgres" {
		if err := holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holderPID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := holder.Exec(ctx, `SELECT id FROM crdbwork_waiting WHERE id = $1 FOR UPDATE`, held); err != nil {
		t.Fatal(err)
	}

	reaper := newQueue(t, pool, claim.Options{Queue: queue})
	type result struct {
		st  queuemaint.ReapStats
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := queuemaint.For(reaper).Reap(ctx)
		done <- result{st, err}
	}()
	// Until Reap returns, no statement may wait for the holder's lock.
	// (Other short lock waits of the database, such as a heartbeat's
	// meeting Reap's own, are not the point: counting every ungranted lock
	// failed the test on a loaded machine.)
	var res result
	await.Until(t, "Reap to return", func() bool {
		select {
		case res = <-done:
			return true
		default:
		}
		if testdb.Kind(t) == "postgres" {
			var waiting int
			var queries string
			if err := pool.QueryRow(ctx, `SELECT count(*), COALESCE(string_agg(query, '; '), '') FROM pg_stat_activity
				WHERE datname = current_database() AND $1 = ANY(pg_blocking_pids(pid))`, holderPID).Scan(&waiting, &queries); err != nil {
				t.Fatal(err)
			}
			if waiting > 0 {
				holder.Rollback(ctx) // let it go on, then fail
				<-done
				t.Fatalf("Reap waited for a dependent another transaction held: %s", queries)
			}
		}
		return false
	})
	if res.err != nil || res.st.Unblocked != 1 {
		t.Fatalf("Reap: %+v, %v; want the free dependent released and no error", res.st, res.err)
	}
	if w, err := q.Dependencies(ctx, held, 1); err != nil || !w.Waiting {
		t.Fatalf("the held dependent: waiting %v, %v; want it left to its holder", w.Waiting, err)
	}
	if got := claimEvery(t, q, s.ID()); len(got) != 1 || got[0].ID != free {
		t.Fatalf("claimed %d items after the reap, want the free dependent", len(got))
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := queuemaint.For(reaper).Reap(ctx); err != nil || st.Unblocked != 1 {
		t.Fatalf("Reap once the holder ended: %+v, %v; want the held dependent released", st, err)
	}
	if got := claimEvery(t, q, s.ID()); len(got) != 1 || got[0].ID != held {
		t.Fatalf("claimed %d items after the second reap, want the held dependent", len(got))
	}
}
