package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// The ack's transaction is SERIALIZABLE on both engines (store.AckTxOptions;
// DESIGN.md section 3): the records run in it, so they see it. On
// PostgreSQL, whose default is READ COMMITTED, this fails if the ack stops
// asking for SERIALIZABLE.
func TestAckIsolationLevel(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	if _, err := q.Enqueue(ctx, payloads(1)...); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %v %v", got, err)
	}
	var level string
	if err := q.Ack(ctx, got[0], func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&level)
	}); err != nil {
		t.Fatal(err)
	}
	if level != "serializable" {
		t.Fatalf("the ack's transaction runs at %q, want \"serializable\"", level)
	}
}

// TestAckRechecksTheClaimOnTheNewestRow makes another transaction change
// the claimed item's row and hold its lock while the ack's delete runs: the
// delete waits for the lock. When the other transaction commits, the
// SERIALIZABLE ack's delete fails with a serialization failure (the row
// changed after its snapshot), the ack is retried whole, and the retry
// checks the claim and the token on the row as that transaction left it.
// A release, a release followed by a new claim of the same session (same
// claim, a new token) and a Cancel make the ack report ErrClaimLost with
// nothing written; a lease extension (same claim, same token) and a change
// that rolls back let it commit, once. PostgreSQL only: it finds the
// waiting ack in pg_stat_activity.
func TestAckRechecksTheClaimOnTheNewestRow(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("reads pg_stat_activity, PostgreSQL's")
	}
	pool := setup(t)
	testdb.Quiet(t, pool) // one exact interleaving with a transaction of the test's own
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	for _, c := range []struct {
		name     string
		change   string // run on the item's id, in a transaction held open
		rollback bool
		lost     bool
	}{
		{"released", `UPDATE crdbwork_items SET claim = NULL, claim_queue = NULL, claim_part = NULL, claimed_at = NULL, lease_until = NULL WHERE id = $1`, false, true},
		{"released and claimed again by the same session", `UPDATE crdbwork_items SET claim_token = claim_token + 1, attempts = attempts + 1, claimed_at = now() WHERE id = $1`, false, true},
		{"cancelled", `DELETE FROM crdbwork_items WHERE id = $1`, false, true},
		{"lease extended", `UPDATE crdbwork_items SET lease_until = now() + INTERVAL '1 hour' WHERE id = $1`, false, false},
		{"released, rolled back", `UPDATE crdbwork_items SET claim = NULL, claim_queue = NULL, claim_part = NULL, claimed_at = NULL, lease_until = NULL WHERE id = $1`, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := q.Enqueue(ctx, payloads(1)...); err != nil {
				t.Fatal(err)
			}
			got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
			if err != nil || len(got) != 1 {
				t.Fatalf("claim: %v %v", got, err)
			}
			it := got[0]
			other, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Rollback(ctx)
			if tag, err := other.Exec(ctx, c.change, it.ID); err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("%s: %v, %d rows", c.change, err, tag.RowsAffected())
			}
			retriesBefore := q.Stats().Retries["ack"]
			var runs atomic.Int64
			done := make(chan error, 1)
			go func() {
				done <- q.Ack(ctx, it, func(ctx context.Context, tx pgx.Tx) error {
					runs.Add(1)
					return record(it)(ctx, tx)
				})
			}()
			waitForLockWait(t, pool, done)
			if c.rollback {
				err = other.Rollback(ctx)
			} else {
				err = other.Commit(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			err = <-done
			results := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, it.ID)
			items := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, it.ID)
			acked := count(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE id = $1 AND outcome = 'acked'`, it.ID)
			retries := q.Stats().Retries["ack"] - retriesBefore
			t.Logf("ack: %v (record ran %d times, %d retries); results %d, items %d, recorded as acked %d", err, runs.Load(), retries, results, items, acked)
			if !c.rollback && retries == 0 {
				t.Fatalf("the ack's delete waited for a row changed by a transaction that then committed, and was not retried: was it SERIALIZABLE?")
			}
			if c.lost {
				if !errors.Is(err, claim.ErrClaimLost) || results != 0 || acked != 0 {
					t.Fatalf("the ack of a claim that was %s: err %v, %d results, %d acked records; want ErrClaimLost and nothing written", c.name, err, results, acked)
				}
				return
			}
			if err != nil || results != 1 || items != 0 || acked != 1 {
				t.Fatalf("the ack of a claim that still held: err %v, %d results, %d items, %d acked records; want nil, 1, 0, 1", err, results, items, acked)
			}
		})
	}
}

// waitForLockWait waits until some backend of the test database waits for
// a row lock in a DELETE of the items (the ack's), failing if done reports
// first (the ack did not wait) or if it does not come (await's deadline).
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, done <-chan error) {
	t.Helper()
	await.Until(t, "the ack's delete to wait for the row's lock", func() (bool, string) {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%DELETE FROM "crdbwork_items"%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return true, ""
		}
		select {
		case err := <-done:
			t.Fatalf("the ack returned (%v) without waiting for the row's lock", err)
		default:
		}
		return false, "no backend waits for a lock in a DELETE of the items"
	})
}

// TestAckRacesReaperReclaimAndCancel races, on many items with leases of a
// few milliseconds: ackers of one session, a loop of Reap (which releases
// the expired leases under the ackers), a second session that claims what
// was released and acks it too, and a canceller. Every item must end in
// exactly one way: acked once (one result row, written by the session whose
// ack returned nil, recorded as acked) or cancelled (no result); an ack that
// returned an error wrote nothing. The at-least-once side (a released item
// is claimed again) makes sure the race happens: some acks must lose.
func TestAckRacesReaperReclaimAndCancel(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(3*time.Minute))
	defer cancel()
	const items = 400
	q := newQueue(t, pool, claim.Options{Lease: 2 * time.Millisecond})
	news := payloads(items)
	for i := range news {
		news[i].MaxAttempts = 1000 // reaped often: a crash loop would end it as dead, beside the point here
	}
	enq, err := q.Enqueue(ctx, news...)
	if err != nil {
		t.Fatal(err)
	}
	ids := enq.IDs
	sessions := []interface{ ID() uuid.UUID }{startSession(t, ctx, pool), startSession(t, ctx, pool)}
	var (
		mu        sync.Mutex
		ackedBy   = map[uuid.UUID][]uuid.UUID{} // item → sessions whose ack returned nil
		cancelled = map[uuid.UUID]bool{}
		lost      atomic.Int64
	)
	var stop atomic.Bool
	var wg sync.WaitGroup
	fail := make(chan error, 16)
	for _, s := range sessions {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 8})
					if err != nil {
						fail <- fmt.Errorf("claim: %w", err)
						return
					}
					if len(got) == 0 {
						continue
					}
					reqs := make([]claim.AckRequest, len(got))
					for i, it := range got {
						reqs[i] = claim.AckRequest{Item: it, Record: record(it)}
					}
					for i, err := range q.AckMany(ctx, reqs, claim.AckOptions{}) {
						switch {
						case err == nil:
							mu.Lock()
							ackedBy[got[i].ID] = append(ackedBy[got[i].ID], s.ID())
							mu.Unlock()
						case errors.Is(err, claim.ErrClaimLost):
							lost.Add(1)
						default:
							fail <- fmt.Errorf("ack: %w", err)
							return
						}
					}
				}
			}()
		}
	}
	wg.Add(2)
	go func() { // the reaper
		defer wg.Done()
		for !stop.Load() {
			if _, err := queuemaint.For(q).Reap(ctx); err != nil {
				fail <- fmt.Errorf("reap: %w", err)
				return
			}
		}
	}()
	go func() { // the canceller: every tenth item, once
		defer wg.Done()
		for i := 0; i < len(ids) && !stop.Load(); i += 10 {
			ok, err := cancelFound(q.CancelItem(ctx, ids[i], claim.CancelOptions{}))
			if err != nil {
				fail <- fmt.Errorf("cancel: %w", err)
				return
			}
			if ok {
				mu.Lock()
				cancelled[ids[i]] = true
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { // a failed wait leaves them running
		stop.Store(true)
		wg.Wait()
	})
	// Run until every item has left the table.
	await.Until(t, "every item to leave the table", func() (bool, string) {
		select {
		case err := <-fail:
			t.Fatal(err)
		default:
		}
		left := count(t, pool, `SELECT count(*) FROM crdbwork_items`)
		return left == 0, fmt.Sprintf("%d of %d items left, %d acks lost", left, items, lost.Load())
	}, await.Within(3*time.Minute))
	stop.Store(true)
	wg.Wait()
	close(fail)
	for err := range fail {
		t.Fatal(err)
	}
	if left := count(t, pool, `SELECT count(*) FROM crdbwork_items`); left != 0 {
		t.Fatalf("%d items never finished", left)
	}
	for _, id := range ids {
		results := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, id)
		var outcome string
		if err := pool.QueryRow(ctx, `SELECT outcome FROM crdbwork_ended WHERE id = $1`, id).Scan(&outcome); err != nil {
			t.Fatalf("item %s: no ended record: %v", id, err)
		}
		by := ackedBy[id]
		switch {
		case cancelled[id]:
			if len(by) != 0 || results != 0 || outcome != "cancelled" {
				t.Fatalf("cancelled item %s: acked by %v, %d results, outcome %q", id, by, results, outcome)
			}
		default:
			if len(by) != 1 || results != 1 || outcome != "acked" {
				t.Fatalf("item %s: acked by %v, %d results, outcome %q; want exactly one ack and one result", id, by, results, outcome)
			}
			if n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1 AND session_id = $2`, id, by[0]); n != 1 {
				t.Fatalf("item %s: the result was not written by the session whose ack returned nil", id)
			}
		}
	}
	if total := count(t, pool, `SELECT count(*) FROM results`); total != items-len(cancelled) {
		t.Fatalf("%d results for %d acked items", total, items-len(cancelled))
	}
	t.Logf("%d acked, %d cancelled, %d acks lost their claims; retries %v", items-len(cancelled), len(cancelled), lost.Load(), q.Stats().Retries)
	if lost.Load() == 0 {
		t.Fatal("no ack lost its claim: the reaper never released a claim under an acker, so the race did not happen")
	}
}

// An ack whose record fails writes nothing and leaves the claim as it was:
// the same claim acks afterwards.
func TestAckWithFailingRecordKeepsTheClaim(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	if _, err := q.Enqueue(ctx, payloads(3)...); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 3})
	if err != nil || len(got) != 3 {
		t.Fatalf("claim: %v %v", got, err)
	}
	boom := errors.New("boom")
	reqs := make([]claim.AckRequest, 3)
	for i, it := range got {
		reqs[i] = claim.AckRequest{Item: it, Record: record(it)}
	}
	// The middle one writes its result, then fails.
	reqs[1].Record = func(ctx context.Context, tx pgx.Tx) error {
		if err := record(got[1])(ctx, tx); err != nil {
			return err
		}
		return boom
	}
	errs := q.AckMany(ctx, reqs, claim.AckOptions{})
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], boom) {
		t.Fatalf("errs = %v; want nil, boom, nil", errs)
	}
	var claimant uuid.UUID
	var token int64
	if err := pool.QueryRow(ctx, `SELECT claim, claim_token FROM crdbwork_items WHERE id = $1`, got[1].ID).Scan(&claimant, &token); err != nil {
		t.Fatalf("the item whose record failed: %v", err)
	}
	if claimant != s.ID() || token != got[1].Token {
		t.Fatalf("the item whose record failed is claimed by %s with token %d; want %s, %d", claimant, token, s.ID(), got[1].Token)
	}
	if n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, got[1].ID); n != 0 {
		t.Fatalf("%d results of the failed record were written", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 2 {
		t.Fatalf("%d results, want the 2 of the other items", n)
	}
	if err := q.Ack(ctx, got[1], record(got[1])); err != nil {
		t.Fatalf("the claim kept does not ack: %v", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, got[1].ID); n != 1 {
		t.Fatalf("%d results after the second ack, want 1", n)
	}
}

// TestAckCommitTimeFailure makes the ack's COMMIT fail after its delete and
// its record ran, with a deferred constraint trigger on the results: once
// with a serialization failure (the ack is retried and commits once), then
// with a serialization failure at every COMMIT and with a refusal (the ack
// fails, nothing is written, no ack is counted). The trigger makes the
// COMMIT fail at will, every time, and with errors no other transaction
// can provoke (a refusal); TestAckCommitTimeSerializationFailure provokes
// the serialization failure through a conflicting SERIALIZABLE
// transaction.
func TestAckCommitTimeFailure(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("constraint triggers are PostgreSQL's")
	}
	pool := setup(t)
	testdb.Quiet(t, pool) // it fails the COMMITs itself, and counts the record's runs
	ctx := context.Background()
	for _, s := range []string{
		`CREATE TABLE commit_fails (mode TEXT NOT NULL)`,
		`CREATE FUNCTION fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM commit_fails WHERE mode = 'refuse') THEN
        RAISE EXCEPTION 'refused at commit' USING ERRCODE = 'check_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM commit_fails WHERE mode = 'always') THEN
        RAISE EXCEPTION 'serialization failure at every commit' USING ERRCODE = 'serialization_failure';
    END IF;
    IF EXISTS (SELECT 1 FROM commit_fails WHERE mode = 'once') THEN
        DELETE FROM commit_fails WHERE mode = 'once';
        -- The delete is undone with the failing transaction: mark the
        -- failure done outside it, through the sequence.
        IF nextval('commit_fail_count') = 1 THEN
            RAISE EXCEPTION 'serialization failure at commit' USING ERRCODE = 'serialization_failure';
        END IF;
    END IF;
    RETURN NULL;
END $$`,
		`CREATE SEQUENCE commit_fail_count`,
		`CREATE CONSTRAINT TRIGGER results_commit AFTER INSERT ON results DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_commit()`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	if _, err := q.Enqueue(ctx, payloads(2)...); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("claim: %v %v", got, err)
	}

	// 1. Once: retried, committed once.
	if _, err := pool.Exec(ctx, `INSERT INTO commit_fails VALUES ('once')`); err != nil {
		t.Fatal(err)
	}
	runs := 0
	err = q.Ack(ctx, got[0], func(ctx context.Context, tx pgx.Tx) error {
		runs++
		return record(got[0])(ctx, tx)
	})
	if err != nil || runs != 2 {
		t.Fatalf("ack with one failed COMMIT: %v after %d runs of the record; want nil after 2", err, runs)
	}
	if n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, got[0].ID); n != 1 {
		t.Fatalf("%d results, want 1", n)
	}

	// 2. Every COMMIT fails with a serialization failure (retried until the
	// retries run out), then with a refusal (not retried): the ack fails,
	// and is never reported as acked.
	for _, mode := range []string{"always", "refuse"} {
		if _, err := pool.Exec(ctx, `DELETE FROM commit_fails`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO commit_fails VALUES ($1)`, mode); err != nil {
			t.Fatal(err)
		}
		before := q.Stats().Acked
		runs := 0
		err = q.Ack(ctx, got[1], func(ctx context.Context, tx pgx.Tx) error {
			runs++
			return record(got[1])(ctx, tx)
		})
		if err == nil {
			t.Fatalf("%s: an ack whose COMMIT failed was reported as acked", mode)
		}
		if errors.Is(err, claim.ErrOutcomeUnknown) {
			t.Fatalf("%s: a COMMIT the server refused was reported as unknown: %v", mode, err)
		}
		if mode == "always" && runs < 2 || mode == "refuse" && runs != 1 {
			t.Fatalf("%s: the record ran %d times", mode, runs)
		}
		items := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, got[1].ID)
		results := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, got[1].ID)
		ended := count(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE id = $1`, got[1].ID)
		if items != 1 || results != 0 || ended != 0 || q.Stats().Acked != before {
			t.Fatalf("%s: after a failed COMMIT (%v): %d items, %d results, %d ended records, acked count +%d; want 1, 0, 0, +0",
				mode, err, items, results, ended, q.Stats().Acked-before)
		}
	}
}

// TestEnqueueOfAnIDBeingAckedAddsNothing races the enqueue of a
// caller-given id with the ack of the item that has it: the ack has deleted
// the item and recorded the id as ended, and holds its transaction open
// (its record waits) while the enqueue starts and waits for the item's row;
// then the ack commits. The enqueue must not add the id again (a producer's
// retry after an unknown outcome would run the work twice): it reports the
// item done. PostgreSQL's SERIALIZABLE conflict checks do not catch this
// race by themselves, so the enqueue's transaction finds the conflict
// itself (sql: PostgresInsert locks the ids' existing rows). PostgreSQL
// only: it finds the waiting enqueue in pg_stat_activity.
func TestEnqueueOfAnIDBeingAckedAddsNothing(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("reads pg_stat_activity, PostgreSQL's")
	}
	pool := setup(t)
	// One exact interleaving: the ack commits first (an injected 40001 at
	// its COMMIT would let the enqueue in before it).
	testdb.Quiet(t, pool)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	for _, n := range []int{1, 3} { // one given id (one statement), several (a transaction)
		t.Run(fmt.Sprint(n, " ids"), func(t *testing.T) {
			news := payloads(n)
			for i := range news {
				news[i].ID = uuid.New()
			}
			if _, err := q.Enqueue(ctx, news...); err != nil {
				t.Fatal(err)
			}
			got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: n})
			if err != nil || len(got) != n {
				t.Fatalf("claim: %v %v", got, err)
			}
			inRecord, release := make(chan struct{}), make(chan struct{})
			reqs := make([]claim.AckRequest, n)
			for i, it := range got {
				reqs[i] = claim.AckRequest{Item: it, Record: record(it)}
			}
			once := false
			reqs[n-1].Record = func(ctx context.Context, tx pgx.Tx) error {
				if !once {
					once = true
					close(inRecord)
					<-release
				}
				return record(got[n-1])(ctx, tx)
			}
			acked := make(chan []error, 1)
			go func() { acked <- q.AckMany(ctx, reqs, claim.AckOptions{}) }()
			await.Recv(t, "the ack to run its record function", inRecord)
			type result struct {
				res claim.Enqueued
				err error
			}
			enqueued := make(chan result, 1)
			go func() {
				res, err := q.Enqueue(ctx, news...)
				enqueued <- result{res, err}
			}()
			released := false
			t.Cleanup(func() { // a failed wait leaves the ack holding its locks
				if !released {
					close(release)
				}
			})
			await.Until(t, "the enqueue to wait for the acked item's row", func() bool {
				var waiting int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO "crdbwork_items"%'`).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				return waiting > 0
			})
			released = true
			close(release)
			for i, err := range <-acked {
				if err != nil {
					t.Fatalf("ack %d: %v", i, err)
				}
			}
			r := <-enqueued
			if r.err != nil {
				t.Fatalf("enqueue: %v", r.err)
			}
			left := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = ANY($1)`, r.res.IDs)
			if r.res.Added() != 0 || left != 0 {
				t.Fatalf("the enqueue of ids being acked added %d items (%d in the table); want 0: they were acked", r.res.Added(), left)
			}
			for i := range news {
				if !r.res.Done[i] {
					t.Fatalf("item %d: Done is false; it was acked", i)
				}
			}
		})
	}
}
