package claim_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// templateKey names this binary's template database (testdb.NewFromTemplate):
// crdbwork's schema with the default table names (testschema.Apply) and the
// results table.
const templateKey = "claim tests: " + testschema.Key + " and results"

// buildTemplate fills the template: the schema, and a results table that
// deliberately has no unique constraint, so duplicates would show.
func buildTemplate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := testschema.Apply(ctx, pool); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `CREATE TABLE results (item_id UUID NOT NULL, session_id UUID NOT NULL, row_id UUID NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY)`)
	return err
}

// setup returns a pool on a fresh database of the test with the schema and
// the results table (a copy of the template: a few milliseconds).
func setup(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return testdb.NewFromTemplate(t, templateKey, buildTemplate)
}

// setupURL is setup for tests that open their own pools: the URL of the
// test's database (close connections to it in cleanups registered after
// this call).
func setupURL(t testing.TB) string {
	t.Helper()
	return testdb.NewURLFromTemplate(t, templateKey, buildTemplate)
}

func newQueue(t testing.TB, pool *pgxpool.Pool, opts claim.Options) *claim.Queue {
	t.Helper()
	q, err := claim.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func startSession(t testing.TB, ctx context.Context, pool *pgxpool.Pool) *session.Session {
	t.Helper()
	// Nobody is meant to leave: an expiry of 20 heartbeats, 10 s on a quiet
	// machine, both stretched with the machine's load (await.Stretch, read
	// once), so that a loaded machine does not lose live sessions. Tests of
	// crashed sessions start their own, with short expiries.
	hb := await.Stretch(500 * time.Millisecond)
	s, err := session.Start(ctx, pool, session.Options{Tuning: session.Tuning{Heartbeat: hb, Expiry: 20 * hb}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// claimLoop claims in a goroutine of its own, one Claim after another,
// keeping what it claimed, and counts its claims in rounds (a tick after
// each Claim returned): a test shows with await.Never that a claim does
// not take something, each claim being a chance to, and waits with
// await.Until for what it must take. It stops at the test's end, or at
// stop.
type claimLoop struct {
	rounds *await.Rounds
	halt   chan struct{}
	done   chan struct{}
	once   sync.Once

	mu  sync.Mutex
	got []claim.Item
	err error
}

// startClaimLoop starts a claimLoop of c, max items per claim.
func startClaimLoop(t testing.TB, c claim.Claimer, max int) *claimLoop {
	l := &claimLoop{rounds: await.NewRounds("claims"), halt: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			got, err := c.Claim(context.Background(), claim.ClaimRequest{Max: max})
			l.mu.Lock()
			l.got = append(l.got, got...)
			l.err = err
			l.mu.Unlock()
			l.rounds.Tick()
			if err != nil {
				return
			}
			select {
			case <-l.halt:
				return
			case <-time.After(5 * time.Millisecond): // a claimer's pause between claims, not a wait
			}
		}
	}()
	t.Cleanup(l.stop)
	return l
}

// stop stops the loop and waits for its last claim to return.
func (l *claimLoop) stop() {
	l.once.Do(func() { close(l.halt) })
	<-l.done
}

// claimed returns what the loop claimed so far, failing the test if a
// claim failed.
func (l *claimLoop) claimed(t testing.TB) []claim.Item {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		t.Fatalf("claim: %v", l.err)
	}
	return append([]claim.Item(nil), l.got...)
}

func payloads(n int) []claim.NewItem {
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(fmt.Sprint(i))}
	}
	return items
}

// record writes the result row of it inside the ack transaction.
func record(it claim.Item) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO results (item_id, session_id) VALUES ($1, $2)`, it.ID, it.Session)
		return err
	}
}

func count(t testing.TB, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestConcurrentSessionsAckEachItemExactlyOnce(t *testing.T) {
	t.Parallel()
	const items, sessions, batch = 5000, 8, 16
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	if _, err := q.Enqueue(ctx, payloads(items)...); err != nil {
		t.Fatal(err)
	}
	var acked atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for range sessions {
		s := startSession(t, ctx, pool)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: batch})
				if err != nil {
					errs <- err
					return
				}
				if len(got) == 0 {
					return // the queue is drained: every item is claimed or gone
				}
				for _, it := range got {
					if err := q.Ack(ctx, it, record(it)); err != nil {
						// A lost claim is a bug unless the session itself was
						// lost (an overloaded machine missed its heartbeats).
						errs <- fmt.Errorf("%w (session: %v)", err, s.Err())
						return
					}
					acked.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != items {
		t.Errorf("%d result rows, want %d", n, items)
	}
	if n := count(t, pool, `SELECT count(*) FROM (SELECT item_id FROM results GROUP BY item_id HAVING count(*) > 1) AS d`); n != 0 {
		t.Errorf("%d items have duplicate results", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Errorf("%d items left in the queue", n)
	}
	if acked.Load() != items || q.Stats().Acked != items {
		t.Errorf("acks reported %d (stats %d), want %d", acked.Load(), q.Stats().Acked, items)
	}
	t.Logf("stats: %+v", q.Stats())
}

func TestCrashedSessionLosesClaimsToPeer(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	if _, err := q.Enqueue(ctx, payloads(10)...); err != nil {
		t.Fatal(err)
	}
	crashCtx, crash := context.WithCancel(ctx)
	// The victim must live until the crash: its heartbeat and expiry
	// (6 heartbeats) stretched with the machine's load.
	hb := await.Stretch(100 * time.Millisecond)
	victim, err := session.Start(crashCtx, pool, session.Options{Tuning: session.Tuning{Heartbeat: hb, Expiry: 6 * hb}})
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := q.Claimer(victim.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(claimed) != 10 {
		t.Fatalf("victim claimed %d items (err %v), want 10", len(claimed), err)
	}
	peer := startSession(t, ctx, pool)
	loop := startClaimLoop(t, q.Claimer(peer.ID()), 10)
	await.Never(t, "the peer claims an item the live victim holds", loop.rounds, 3, func() (bool, string) {
		got := loop.claimed(t)
		return len(got) > 0, fmt.Sprintf("%d claimed", len(got))
	})

	crash() // the victim stops heartbeating; its row stays until a peer reaps it
	var retaken []claim.Item
	await.Until(t, "the peer to claim the crashed session's 10 items", func() (bool, string) {
		retaken = loop.claimed(t)
		return len(retaken) >= 10, fmt.Sprintf("%d re-claimed", len(retaken))
	})
	loop.stop()
	if retaken = loop.claimed(t); len(retaken) != 10 {
		t.Fatalf("peer re-claimed %d of the crashed session's 10 items", len(retaken))
	}
	for _, it := range retaken {
		if it.Attempt != 2 {
			t.Errorf("re-claimed item %s has attempt %d, want 2 (the crashed claim counts)", it.ID, it.Attempt)
		}
	}
	// The crashed process wakes up and tries to ack: refused, nothing written.
	err = q.Ack(ctx, claimed[0], record(claimed[0]))
	if !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("late ack = %v, want ErrClaimLost", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 0 {
		t.Fatalf("late ack wrote %d result rows", n)
	}
	for _, it := range retaken {
		if err := q.Ack(ctx, it, record(it)); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM results WHERE session_id = $1`, peer.ID()); n != 10 {
		t.Fatalf("peer recorded %d results, want 10", n)
	}
}

func TestCloseReleasesClaimsAtOnce(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	if _, err := q.Enqueue(ctx, payloads(5)...); err != nil {
		t.Fatal(err)
	}
	a, err := session.Start(ctx, pool, session.Options{}) // 5 s expiry: only Close can free the items quickly
	if err != nil {
		t.Fatal(err)
	}
	if got, err := q.Claimer(a.ID()).Claim(ctx, claim.ClaimRequest{Max: 5}); err != nil || len(got) != 5 {
		t.Fatalf("claimed %d (err %v), want 5", len(got), err)
	}
	b := startSession(t, ctx, pool)
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(b.ID()).Claim(ctx, claim.ClaimRequest{Max: 5})
	if err != nil || len(got) != 5 {
		t.Fatalf("after Close, another session claimed %d (err %v), want all 5 at once", len(got), err)
	}
}

func TestEnqueueInRolledBackTransactionLeavesNothing(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	testdb.Quiet(t, pool) // the test's own transactions are committed once, not retried
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := q.EnqueueTx(ctx, tx, payloads(3)...)
	if err != nil || len(ids.IDs) != 3 {
		t.Fatalf("EnqueueTx = %v, %v", ids, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("uncommitted items visible outside the transaction: %d", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items after rollback, want 0", n)
	}
	// And the committed twin does enqueue.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.EnqueueTx(ctx, tx, payloads(3)...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 3 {
		t.Fatalf("%d items after commit, want 3", n)
	}
}

// TestAckCommitTimeSerializationFailure provokes, for real, a serialization
// failure at COMMIT of an ack: inside the ack's transaction, after the result
// is written, a second serializable transaction reads what the ack wrote and
// writes what the ack read, and commits first. On PostgreSQL the ack's COMMIT
// then fails with 40001. The ack must be retried (and commit once) or
// reported as failed, never reported as acked without its writes.
func TestAckCommitTimeSerializationFailure(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE tally (id UUID NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY, who TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)

	// interfere runs a conflicting serializable transaction to commit.
	interfere := func(ctx context.Context) {
		ictx, cancel := context.WithTimeout(ctx, await.Stretch(2*time.Second)) // CockroachDB may make it wait on the ack's locks
		defer cancel()
		tx, err := pool.BeginTx(ictx, pgx.TxOptions{IsoLevel: pgx.Serializable})
		if err != nil {
			return
		}
		defer tx.Rollback(context.Background())
		var n int
		if tx.QueryRow(ictx, `SELECT count(*) FROM tally`).Scan(&n) != nil {
			return
		}
		if _, err := tx.Exec(ictx, `INSERT INTO tally (who) VALUES ('interferer')`); err != nil {
			return
		}
		tx.Commit(ictx)
	}
	// recordWithConflict writes the ack's result and tally row, then lets the
	// interferer commit while the ack's transaction is still open. completed
	// counts runs that returned nil: a second completed run of one ack means
	// the first one's COMMIT failed.
	recordWithConflict := func(it claim.Item, completed *int, always bool) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM tally`).Scan(&n); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO tally (who) VALUES ('ack')`); err != nil {
				return err
			}
			if err := record(it)(ctx, tx); err != nil {
				return err
			}
			if always || *completed == 0 {
				interfere(ctx)
			}
			*completed++
			return nil
		}
	}

	// 1. The conflict happens once: the ack is retried and commits once.
	const rounds = 10
	if _, err := q.Enqueue(ctx, payloads(rounds)...); err != nil {
		t.Fatal(err)
	}
	commitFailures := 0
	for range rounds {
		got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
		if err != nil || len(got) != 1 {
			t.Fatalf("claim: %v %v", got, err)
		}
		it := got[0]
		completed := 0
		err = q.Ack(ctx, it, recordWithConflict(it, &completed, false))
		commitFailures += completed - 1
		items := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, it.ID)
		results := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, it.ID)
		switch {
		case err == nil && (items != 0 || results != 1):
			t.Fatalf("ack reported success but item rows=%d, result rows=%d (want 0 and 1)", items, results)
		case err != nil && (items != 1 || results != 0):
			t.Fatalf("ack failed (%v) but item rows=%d, result rows=%d (want 1 and 0)", err, items, results)
		case err != nil:
			t.Fatalf("ack with one conflict was not retried to success: %v", err)
		}
	}
	t.Logf("%d of %d acks failed at COMMIT and were retried; retries: %v", commitFailures, rounds, q.Stats().Retries)
	if testdb.Kind(t) == "postgres" && commitFailures == 0 {
		t.Fatal("no ack hit a commit-time serialization failure: the test did not provoke what it is about")
	}

	// 2. The conflict happens on every attempt: the ack must fail, with
	// neither its delete nor its result committed.
	if _, err := q.Enqueue(ctx, payloads(1)...); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %v %v", got, err)
	}
	it := got[0]
	completed := 0
	err = q.Ack(ctx, it, recordWithConflict(it, &completed, true))
	items := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, it.ID)
	results := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, it.ID)
	t.Logf("always-conflicting ack: err=%v after %d completed runs", err, completed)
	if err == nil && (items != 0 || results != 1) || err != nil && (items != 1 || results != 0) {
		t.Fatalf("ack returned %v with item rows=%d, result rows=%d", err, items, results)
	}
	if testdb.Kind(t) == "postgres" && err == nil {
		t.Fatal("an ack whose every COMMIT failed was reported as acked")
	}
}

func TestAckBatchChecksEachClaim(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	if _, err := q.Enqueue(ctx, payloads(6)...); err != nil {
		t.Fatal(err)
	}
	s := startSession(t, ctx, pool)
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 6})
	if err != nil || len(got) != 6 {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	// Two items lose their claims: one is cancelled, one released.
	if ok, err := cancelFound(q.CancelItem(ctx, got[0].ID, claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	if err := q.Release(ctx, got[1]); err != nil {
		t.Fatal(err)
	}
	var recorded []uuid.UUID
	acked, err := q.AckBatch(ctx, got, func(ctx context.Context, tx pgx.Tx, acked []claim.Item) error {
		recorded = recorded[:0]
		for _, it := range acked {
			if err := record(it)(ctx, tx); err != nil {
				return err
			}
			recorded = append(recorded, it.ID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(acked) != 4 || len(recorded) != 4 {
		t.Fatalf("acked %d, recorded %d, want 4 and 4", len(acked), len(recorded))
	}
	for _, it := range acked {
		if it.ID == got[0].ID || it.ID == got[1].ID {
			t.Fatalf("item %s acked although its claim was gone", it.ID)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 4 {
		t.Fatalf("%d results, want 4", n)
	}
	// The cancelled item ends when its holder ends it, as a worker does.
	if err := q.EndCancelled(ctx, got[0]); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 1 {
		t.Fatalf("%d items left, want 1 (the released one)", n)
	}
	// A batch whose result function fails commits nothing.
	if _, err := q.Enqueue(ctx, payloads(2)...); err != nil {
		t.Fatal(err)
	}
	more, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(more) != 3 {
		t.Fatalf("claimed %d, %v, want 3", len(more), err)
	}
	boom := errors.New("boom")
	if _, err := q.AckBatch(ctx, more, func(context.Context, pgx.Tx, []claim.Item) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("AckBatch = %v, want boom", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 3 {
		t.Fatalf("%d items after a failed batch, want 3", n)
	}
}

func TestAckEachCommitsTogetherAndIsolatesFailures(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE each_results (item_id UUID NOT NULL, tx_at TIMESTAMPTZ NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	rec := func(it claim.Item) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO each_results (item_id, tx_at) VALUES ($1, now())`, it.ID)
			return err
		}
	}
	claimN := func(n int) []claim.Item {
		t.Helper()
		if _, err := q.Enqueue(ctx, payloads(n)...); err != nil {
			t.Fatal(err)
		}
		got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: n})
		if err != nil || len(got) != n {
			t.Fatalf("claimed %d, %v, want %d", len(got), err, n)
		}
		return got
	}

	// All good: one transaction (now() is the transaction's time, so one
	// distinct value), every item acked.
	got := claimN(5)
	reqs := make([]claim.AckRequest, len(got))
	for i, it := range got {
		reqs[i] = claim.AckRequest{Item: it, Record: rec(it)}
	}
	for i, err := range q.AckMany(ctx, reqs, claim.AckOptions{}) {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM each_results`); n != 5 {
		t.Fatalf("%d results, want 5", n)
	}
	if n := count(t, pool, `SELECT count(DISTINCT tx_at) FROM each_results`); n != 1 {
		t.Fatalf("results written by %d transactions, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items left, want 0", n)
	}

	// A lost claim, a failing record, a nil record and good ones: each item
	// gets what Ack alone would have given it.
	got = claimN(6)
	if ok, err := cancelFound(q.CancelItem(ctx, got[0].ID, claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	boom := errors.New("boom")
	reqs = reqs[:0]
	for i, it := range got {
		r := claim.AckRequest{Item: it, Record: rec(it)}
		switch i {
		case 1:
			r.Record = func(context.Context, pgx.Tx) error { return boom }
		case 5:
			r.Record = nil
		}
		reqs = append(reqs, r)
	}
	before := q.Stats()
	errs := q.AckMany(ctx, reqs, claim.AckOptions{})
	if !errors.Is(errs[0], claim.ErrClaimLost) {
		t.Errorf("lost claim: %v, want ErrClaimLost", errs[0])
	}
	if !errors.Is(errs[1], boom) {
		t.Errorf("failing record: %v, want boom", errs[1])
	}
	for i := 2; i < 6; i++ {
		if errs[i] != nil {
			t.Errorf("item %d: %v, want acked", i, errs[i])
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM each_results WHERE item_id = ANY($1)`, []uuid.UUID{got[2].ID, got[3].ID, got[4].ID}); n != 3 {
		t.Fatalf("%d results of the good items, want 3", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM each_results`); n != 8 {
		t.Fatalf("%d results in all, want 8", n)
	}
	// The cancelled item ends when its holder ends it, as a worker does.
	if err := q.EndCancelled(ctx, got[0]); err != nil {
		t.Fatal(err)
	}
	var left []uuid.UUID
	rows, err := pool.Query(ctx, `SELECT id FROM crdbwork_items`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if rows.Err() != nil || len(left) != 1 || left[0] != got[1].ID {
		t.Fatalf("items left %v (%v), want only the one whose record failed (%s)", left, rows.Err(), got[1].ID)
	}
	after := q.Stats()
	if d := after.Acked - before.Acked; d != 4 {
		t.Errorf("Acked grew by %d, want 4", d)
	}
	if d := after.LostClaims - before.LostClaims; d != 1 {
		t.Errorf("LostClaims grew by %d, want 1", d)
	}
}

func TestClaimOrderPriorityThenVesting(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	for _, p := range []int{5, 1, 3, 1, -2} {
		if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte(fmt.Sprint(p)), Priority: p}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("later"), Priority: -10, Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	s := startSession(t, ctx, pool)
	var order []string
	for {
		got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
		for _, it := range got {
			order = append(order, string(it.Payload))
		}
	}
	if want := "-2 1 1 3 5"; strings.Join(order, " ") != want {
		t.Fatalf("claim order %v, want %s (the delayed item not at all)", order, want)
	}
}

func TestNackBacksOffThenDeadLetters(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond})
	s := startSession(t, ctx, pool)
	ids, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x"), MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	claimOne := func() claim.Item {
		t.Helper()
		var got []claim.Item
		await.Until(t, "the item to be claimable again after its backoff", func() bool {
			got, err = q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
			if err != nil {
				t.Fatal(err)
			}
			return len(got) > 0
		})
		return got[0]
	}
	for attempt := 1; attempt <= 3; attempt++ {
		it := claimOne()
		if it.Attempt != attempt {
			t.Fatalf("attempt %d, want %d", it.Attempt, attempt)
		}
		if attempt > 1 && it.LastError != fmt.Sprint("fail ", attempt-1) {
			t.Fatalf("LastError %q", it.LastError)
		}
		out, err := q.Nack(ctx, it, fmt.Errorf("fail %d", attempt))
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]claim.Outcome{true: claim.Dead, false: claim.Retried}[attempt == 3]; out != want {
			t.Fatalf("attempt %d outcome %v, want %v", attempt, out, want)
		}
	}
	var lastErr string
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT last_error, attempts FROM crdbwork_dead_items WHERE id = $1`, ids.IDs[0]).Scan(&lastErr, &attempts); err != nil {
		t.Fatalf("dead item: %v", err)
	}
	if lastErr != "fail 3" || attempts != 3 {
		t.Fatalf("dead item (%q, %d), want (fail 3, 3)", lastErr, attempts)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items left", n)
	}

	// A permanent error dead-letters at once; RetryAfter sets the delay.
	if _, err := q.Enqueue(ctx, payloads(2)...); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	if out, err := q.Nack(ctx, got[0], claim.Permanent(errors.New("bad input"))); err != nil || out != claim.Dead {
		t.Fatalf("permanent nack = %v, %v", out, err)
	}
	if _, err := q.Nack(ctx, got[1], claim.RetryAfter(time.Hour, errors.New("rate limited"))); err != nil {
		t.Fatal(err)
	}
	if later, _ := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2}); len(later) != 0 {
		t.Fatalf("an item nacked with RetryAfter(1h) was claimable at once")
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE vesting_at > now() + INTERVAL '50 minutes'`); n != 1 {
		t.Fatalf("%d items vesting in about an hour, want 1", n)
	}
	// A nack of a lost claim is refused.
	if _, err := q.Nack(ctx, got[1], errors.New("again")); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("second nack = %v, want ErrClaimLost", err)
	}
}

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	q := newQueue(t, pool, claim.Options{BackoffBase: time.Second, BackoffMax: time.Minute})
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 7: time.Minute, 100: time.Minute} {
		for range 50 {
			d := q.Backoff(attempt)
			if d < want/2 || d > want {
				t.Fatalf("Backoff(%d) = %v, want within [%v, %v]", attempt, d, want/2, want)
			}
		}
	}
}

func TestReleaseDoesNotCountAttempt(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	if _, err := q.Enqueue(ctx, payloads(1)...); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
		if err != nil || len(got) != 1 {
			t.Fatalf("claim: %d %v", len(got), err)
		}
		if got[0].Attempt != 1 {
			t.Fatalf("attempt %d after releases, want 1", got[0].Attempt)
		}
		if err := q.Release(ctx, got[0]); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	if _, err := claim.New(pool, claim.Options{MaxAttempts: -1}); err == nil {
		t.Error("New accepted MaxAttempts -1")
	}
	if _, err := claim.New(pool, claim.Options{BackoffBase: time.Hour, BackoffMax: time.Second}); err == nil {
		t.Error("New accepted a backoff base above its max")
	}
	q := newQueue(t, pool, claim.Options{MaxPayload: 10})
	_, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("ok")}, claim.NewItem{Payload: make([]byte, 11)})
	if !errors.Is(err, claim.ErrPayloadTooLarge) || !strings.Contains(err.Error(), "item 1") {
		t.Fatalf("oversized payload: %v, want ErrPayloadTooLarge naming item 1", err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Delay: -time.Second}); err == nil {
		t.Error("negative delay accepted")
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("a rejected enqueue left %d items", n)
	}
}

func TestMissingSchemaIsReported(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t) // no schema
	q := newQueue(t, pool, claim.Options{})
	_, err := q.Enqueue(context.Background(), payloads(1)...)
	if !errors.Is(err, crsql.ErrSchemaMissing) {
		t.Fatalf("Enqueue without schema = %v, want ErrSchemaMissing", err)
	}
	_, err = q.Claimer(uuid.New()).Claim(context.Background(), claim.ClaimRequest{Max: 1})
	if !errors.Is(err, crsql.ErrSchemaMissing) {
		t.Fatalf("Claim without schema = %v, want ErrSchemaMissing", err)
	}
}

func TestClaimForDeletedSession(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	q := newQueue(t, pool, claim.Options{})
	if _, err := q.Enqueue(context.Background(), payloads(1)...); err != nil {
		t.Fatal(err)
	}
	_, err := q.Claimer(uuid.New()).Claim(context.Background(), claim.ClaimRequest{Max: 1})
	if !errors.Is(err, claim.ErrNotOwner) {
		t.Fatalf("Claim for a session that does not exist = %v, want ErrNotOwner", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NULL`); n != 1 {
		t.Fatal("the item was claimed by a session that does not exist")
	}
}

func TestDeadItemsCanBeListedAndRequeued(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	other := newQueue(t, pool, claim.Options{Queue: "other"})
	s := startSession(t, ctx, pool)
	ids, err := q.Enqueue(ctx,
		claim.NewItem{Payload: []byte("a"), Key: "k", Priority: 3, MaxAttempts: 5},
		claim.NewItem{Payload: []byte("b")})
	if err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	for i, it := range got {
		if out, err := q.Nack(ctx, it, claim.Permanent(fmt.Errorf("broken %d", i))); err != nil || out != claim.Dead {
			t.Fatalf("nack: %v %v", out, err)
		}
	}
	dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 2 {
		t.Fatalf("%d dead items, want 2", len(dead))
	}
	var a claim.DeadItem
	for _, d := range dead {
		if d.ID == ids.IDs[0] {
			a = d
		}
	}
	if a.ID != ids.IDs[0] || string(a.Payload) != "a" || a.Key != "k" || a.Priority != 3 || a.Attempts != 1 ||
		a.MaxAttempts != 5 || a.LastError == "" || a.DiedAt.IsZero() {
		t.Fatalf("dead item %+v", a)
	}
	if d, err := deadList(other.DeadItems(ctx, claim.DeadQuery{Limit: 10})); err != nil || len(d) != 0 {
		t.Fatalf("queue other lists %d dead items (%v), want 0", len(d), err)
	}
	if _, err := q.DeadItems(ctx, claim.DeadQuery{Limit: -1}); err == nil {
		t.Fatal("DeadItems with a negative limit: no error")
	}
	// The zero query lists the first DefaultListLimit deaths.
	if d, err := deadList(q.DeadItems(ctx, claim.DeadQuery{})); err != nil || len(d) == 0 {
		t.Fatalf("DeadItems with the zero query: %d items, %v", len(d), err)
	}

	// Another queue cannot requeue or cancel this queue's items.
	if ok, err := requeuedOne(other.Requeue(ctx, claim.RequeueOptions{ID: ids.IDs[0]})); err != nil || ok {
		t.Fatalf("requeue through another queue: %v %v", ok, err)
	}
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: ids.IDs[0]})); err != nil || !ok {
		t.Fatalf("requeue: %v %v", ok, err)
	}
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: ids.IDs[0]})); err != nil || ok {
		t.Fatalf("second requeue of one item: %v %v", ok, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, ids.IDs[0]); n != 0 {
		t.Fatalf("requeued item still dead (%d rows)", n)
	}
	again, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(again) != 1 {
		t.Fatalf("claimed %d after requeue, %v", len(again), err)
	}
	it := again[0]
	if it.ID != ids.IDs[0] || string(it.Payload) != "a" || it.Key != "k" || it.Priority != 3 || it.Attempt != 1 ||
		it.MaxAttempts != 5 || it.LastError == "" {
		t.Fatalf("requeued item %+v", it)
	}
	if ok, err := cancelFound(other.CancelItem(ctx, it.ID, claim.CancelOptions{})); err != nil || ok {
		t.Fatalf("cancel through another queue: %v %v", ok, err)
	}
	if err := q.Ack(ctx, it, nil); err != nil {
		t.Fatalf("ack of the requeued item: %v", err)
	}
	if d, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10})); err != nil || len(d) != 1 || d[0].ID != ids.IDs[1] {
		t.Fatalf("dead items after requeue: %+v %v", d, err)
	}
}
