package claim_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// deadlockTracer counts the statements (and COMMITs) of its pool that the
// server failed with a deadlock (SQLSTATE 40P01), whether or not a retry
// then hid it from the caller.
type deadlockTracer struct {
	n    atomic.Int64
	mu   sync.Mutex
	last string
}

func (d *deadlockTracer) count(err error, sql string) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
		d.n.Add(1)
		d.mu.Lock()
		d.last = pgErr.Detail + "\n" + sql
		d.mu.Unlock()
	}
}

type traceSQL struct{}

func (d *deadlockTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceSQL{}, data.SQL)
}

func (d *deadlockTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(traceSQL{}).(string)
	d.count(data.Err, sql)
}

func (d *deadlockTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (d *deadlockTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	d.count(data.Err, data.SQL)
}

func (d *deadlockTracer) TraceBatchEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	d.count(data.Err, "")
}

// tracedPool opens another pool on pool's database whose connections
// report deadlocks to the tracer it returns.
func tracedPool(t *testing.T, pool *pgxpool.Pool) (*pgxpool.Pool, *deadlockTracer) {
	t.Helper()
	tr := &deadlockTracer{}
	cfg := pool.Config().Copy()
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = 24
	traced, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(traced.Close)
	return traced, tr
}

// is40P01 reports whether err carries a PostgreSQL deadlock.
func is40P01(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

// Releases after acks, the reapers' sweeps (releases of prerequisites acked
// by a version-4 worker, which runs no release, and ends of the dependents
// of cancelled ones), acks and cancels of waiting items, all at once over
// dependents that wait for many of the same prerequisites: no statement
// may deadlock (issue 29: nine "deadlock detected" with a release as a
// party, its edges locked before the dependents, a cancel's and a kill's
// dependents before the edges), no caller may get an error but a lost
// claim, and every item ends: the prerequisites acked (or cancelled), each
// dependent acked if all its prerequisites were, cancelled if it was,
// dead ("dependency died") otherwise. Three rounds, a queue each: on the
// code before the fix, about four runs in five of one round deadlocked.
func TestDependsConcurrentSettleNoDeadlock(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	traced, tracer := tracedPool(t, pool)
	for round := range 3 {
		settleAtOnce(t, pool, traced, fmt.Sprint("shared-", round), uint64(round))
	}
	if n := tracer.n.Load(); n > 0 && testdb.Kind(t) == "postgres" {
		t.Errorf("%d statements deadlocked (40P01); the last:\n%s", n, tracer.last)
	}
}

// settleAtOnce is a round of TestDependsConcurrentSettleNoDeadlock, in
// queue, through traced (pool's database).
func settleAtOnce(t *testing.T, pool, traced *pgxpool.Pool, queue string, seed uint64) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q := newQueue(t, traced, claim.Options{Queue: queue})
	s := startSession(t, ctx, pool)
	d, err := store.DetectDialect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	stmts := store.New(crsql.Tables{})

	// 80 prerequisites; 60 joins, each after a random 10 to 40 of them,
	// every fourth also after the join before it (a waiting prerequisite).
	rng := rand.New(rand.NewPCG(29, seed))
	const nPre, nJoin = 80, 60
	pre := make([]uuid.UUID, nPre)
	var items []claim.NewItem
	for i := range pre {
		pre[i] = uuid.New()
		items = append(items, claim.NewItem{ID: pre[i], Payload: []byte(fmt.Sprint("p", i))})
	}
	joins := make([]uuid.UUID, nJoin)
	after := map[uuid.UUID][]uuid.UUID{}
	for j := range joins {
		joins[j] = uuid.New()
		perm := rng.Perm(nPre)[:10+rng.IntN(31)]
		var a []uuid.UUID
		for _, i := range perm {
			a = append(a, pre[i])
		}
		if j%4 == 3 {
			a = append(a, joins[j-1])
		}
		after[joins[j]] = a
		items = append(items, claim.NewItem{ID: joins[j], Payload: []byte(fmt.Sprint("j", j)), After: a})
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	// Three prerequisites are cancelled (their dependents die at a reap,
	// while releases of the others run) and twelve joins are cancelled while
	// their prerequisites are being acked.
	cancelledPre := map[uuid.UUID]bool{pre[7]: true, pre[31]: true, pre[52]: true}
	for p := range cancelledPre {
		if ok, err := cancelFound(q.CancelItem(ctx, p, claim.CancelOptions{})); err != nil || !ok {
			t.Fatalf("Cancel(%s): %v, %v", p, ok, err)
		}
	}
	var cancelJoins []uuid.UUID
	for j := 2; j < nJoin; j += 5 {
		cancelJoins = append(cancelJoins, joins[j])
	}

	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		errs     []error
		acked    atomic.Int64
		finished = make(chan struct{})
	)
	fail := func(err error) {
		errMu.Lock()
		errs = append(errs, err)
		errMu.Unlock()
	}
	// Ackers: claim a random batch, then ack it in one transaction (with
	// the release after it) or, one batch in three, as a version-4 worker
	// does (the ack statement alone: its dependents are the reapers').
	for a := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(a), seed))
			for {
				select {
				case <-finished:
					return
				default:
				}
				got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1 + rng.IntN(16)})
				if err != nil {
					fail(fmt.Errorf("claim: %w", err))
					return
				}
				if len(got) == 0 {
					select {
					case <-finished:
						return
					case <-time.After(5 * time.Millisecond): // an idle acker's pause, not a wait
					}
					continue
				}
				if rng.IntN(3) == 0 {
					keys := make([]store.ClaimKey, len(got))
					for i, it := range got {
						keys[i] = store.ClaimKey{ID: it.ID, Session: it.Session, Token: it.Token}
					}
					var gone []uuid.UUID
					err := retry.Tx(ctx, traced, nil, func(ctx context.Context, tx pgx.Tx) error {
						var err error
						gone, err = stmts.ItemsAck(ctx, tx, d, keys)
						return err
					})
					if err != nil {
						fail(fmt.Errorf("version-4 ack: %w", err))
						continue
					}
					for _, it := range got {
						if !slices.Contains(gone, it.ID) {
							// Cancelled while claimed: it ends as cancelled.
							if err := q.EndCancelled(ctx, it); err != nil && !errors.Is(err, claim.ErrClaimLost) {
								fail(fmt.Errorf("end cancelled: %w", err))
							}
						}
					}
					acked.Add(int64(len(gone)))
					continue
				}
				reqs := make([]claim.AckRequest, len(got))
				for i, it := range got {
					reqs[i] = claim.AckRequest{Item: it}
				}
				for i, err := range q.AckMany(ctx, reqs, claim.AckOptions{}) {
					switch {
					case err == nil:
						acked.Add(1)
					case errors.Is(err, claim.ErrClaimLost):
						// Cancelled while claimed: it ends as cancelled.
						if err := q.EndCancelled(ctx, got[i]); err != nil && !errors.Is(err, claim.ErrClaimLost) {
							fail(fmt.Errorf("end cancelled: %w", err))
						}
					default:
						fail(fmt.Errorf("ack: %w", err))
					}
				}
			}
		}()
	}
	// Reapers: sweeps of two sessions at once (two Queues, as two
	// processes have).
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rq := newQueue(t, traced, claim.Options{Queue: queue})
			for {
				if _, err := queuemaint.For(rq).Reap(ctx); err != nil {
					fail(fmt.Errorf("reap %d: %w", r, err))
				}
				select {
				case <-finished:
					return
				case <-time.After(time.Duration(5+10*r) * time.Millisecond): // the reaper's period
				}
			}
		}()
	}
	// The canceller: one join after every few acks.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i, id := range cancelJoins {
			for acked.Load() < int64(4*(i+1)) {
				select {
				case <-finished:
					return
				case <-time.After(2 * time.Millisecond): // polling the acks' count, bounded by finished
				}
			}
			if _, err := cancelFound(q.CancelItem(ctx, id, claim.CancelOptions{})); err != nil {
				fail(fmt.Errorf("cancel: %w", err))
			}
		}
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			close(finished)
			wg.Wait()
		}
	}
	t.Cleanup(stop) // a failed wait leaves them running
	// Done when nothing of the queue is left: no item, waiting item or edge.
	await.Until(t, "every item, waiting item and edge of the queue to end", func() (bool, string) {
		n := countRows(t, pool, `SELECT (SELECT count(*) FROM crdbwork_items WHERE queue = $1)
			+ (SELECT count(*) FROM crdbwork_waiting WHERE queue = $1) + (SELECT count(*) FROM crdbwork_waits_for WHERE queue = $1)`, queue)
		errMu.Lock()
		defer errMu.Unlock()
		return n == 0, fmt.Sprintf("%d rows of the queue left; errors: %v", n, errs)
	}, await.Within(2*time.Minute))
	stop()
	for _, err := range errs {
		t.Errorf("a caller got an error: %v (deadlock: %v)", err, is40P01(err))
	}

	// Every item ended, once, as its prerequisites say.
	outcome := map[uuid.UUID]string{}
	rows, err := pool.Query(ctx, `SELECT id, outcome FROM crdbwork_ended WHERE queue = $1`, queue)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		var o string
		if err := rows.Scan(&id, &o); err != nil {
			t.Fatal(err)
		}
		outcome[id] = o
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, p := range pre {
		want := store.OutcomeAcked
		if cancelledPre[p] {
			want = store.OutcomeCancelled
		}
		if outcome[p] != want {
			t.Errorf("prerequisite %s ended %q, want %q", p, outcome[p], want)
		}
	}
	for _, j := range joins {
		ok := true // all its prerequisites acked
		for _, p := range after[j] {
			if outcome[p] != store.OutcomeAcked {
				ok = false
			}
		}
		switch o := outcome[j]; {
		case o == store.OutcomeCancelled && slices.Contains(cancelJoins, j):
		case o == store.OutcomeAcked && ok:
		case o == store.OutcomeDead && !ok:
		default:
			t.Errorf("join %s ended %q; its prerequisites all acked: %v", j, o, ok)
		}
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1 AND reason NOT LIKE 'dependency died: %'`, queue); n != 0 {
		t.Errorf("%d items died of something else than a dependency", n)
	}
}
