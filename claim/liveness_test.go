package claim_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// claimOne claims exactly one item or fails the test.
func claimOne(t *testing.T, q *claim.Queue, session uuid.UUID) claim.Item {
	t.Helper()
	got, err := q.Claimer(session).Claim(context.Background(), claim.ClaimRequest{Max: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("claimed %d items (err %v), want 1", len(got), err)
	}
	return got[0]
}

// A stale Item (claimed, released, claimed again by the same session) cannot
// ack, nack or release the newer claim: the token grew although the attempt
// did not.
func TestStaleItemCannotActOnNewerClaim(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	if _, err := q.Enqueue(ctx, payloads(1)...); err != nil {
		t.Fatal(err)
	}
	old := claimOne(t, q, s.ID())
	if err := q.Release(ctx, old); err != nil {
		t.Fatal(err)
	}
	cur := claimOne(t, q, s.ID())
	if cur.Attempt != old.Attempt || cur.Token <= old.Token {
		t.Fatalf("re-claim: attempt %d token %d after attempt %d token %d; want the same attempt and a larger token",
			cur.Attempt, cur.Token, old.Attempt, old.Token)
	}
	if err := q.Ack(ctx, old, record(old)); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("ack of the stale item = %v, want ErrClaimLost", err)
	}
	if _, err := q.Nack(ctx, old, errors.New("stale")); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("nack of the stale item = %v, want ErrClaimLost", err)
	}
	if err := q.Release(ctx, old); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("release of the stale item = %v, want ErrClaimLost", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 0 {
		t.Fatalf("the stale ack wrote %d results", n)
	}
	if err := q.Ack(ctx, cur, record(cur)); err != nil {
		t.Fatalf("ack of the current claim: %v", err)
	}
}

// Issue 9: deleting a session whose items were claimed in parts mode nulls
// claim through the single-column key first, so the composite key's SET NULL
// matches nothing and claim_queue/claim_part stay behind. An any-part claim
// must still succeed: it writes all three claim columns.
func TestAnyPartClaimAfterPartsSessionDied(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_queues (name, num_parts) VALUES ($1, 2)`, q.Name()); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, payloads(6)...); err != nil {
		t.Fatal(err)
	}
	victim, err := startSessionNoCleanup(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range []int{0, 1} {
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, $3)`, victim, q.Name(), part); err != nil {
			t.Fatal(err)
		}
	}
	got, err := q.Claimer(victim).Claim(ctx, claim.ClaimRequest{Max: 6, Parts: []int{0, 1}})
	if err != nil || len(got) != 6 {
		t.Fatalf("parts claim: %d items, %v", len(got), err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id = $1`, victim); err != nil {
		t.Fatal(err)
	}
	stale := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NULL AND claim_part IS NOT NULL`)
	t.Logf("%d released items kept a stale claim_part", stale)
	peer := startSession(t, ctx, pool)
	again, err := q.Claimer(peer.ID()).Claim(ctx, claim.ClaimRequest{Max: 6})
	if err != nil || len(again) != 6 {
		t.Fatalf("any-part claim after the parts session died: %d items, %v; want 6", len(again), err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim = $1 AND claim_part IS NULL AND claim_queue IS NULL`, peer.ID()); n != 6 {
		t.Fatalf("%d items claimed with clean claim columns, want 6", n)
	}
	for _, it := range again {
		if err := q.Ack(ctx, it, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// startSessionNoCleanup inserts a session row directly, for tests that
// delete it themselves.
func startSessionNoCleanup(ctx context.Context, pool *pgxpool.Pool) (uuid.UUID, error) {
	var id uuid.UUID
	err := pool.QueryRow(ctx, `INSERT INTO crdbwork_sessions (expiry) VALUES (INTERVAL '1 hour') RETURNING id`).Scan(&id)
	return id, err
}

// An expired lease is released by Reap (any session may run it), the stale
// claim's ack is refused, and the item is claimed again with its attempt
// counted and a new token.
func TestReapReleasesExpiredLeases(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	short := newQueue(t, pool, claim.Options{Lease: 50 * time.Millisecond})
	long := newQueue(t, pool, claim.Options{}) // same queue, default lease
	s := startSession(t, ctx, pool)
	if _, err := short.Enqueue(ctx, payloads(3)...); err != nil {
		t.Fatal(err)
	}
	hung, err := short.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil || len(hung) != 2 {
		t.Fatalf("claimed %d, %v", len(hung), err)
	}
	kept := claimOne(t, long, s.ID())
	if d := time.Until(kept.LeaseUntil); d < 4*time.Minute || d > 6*time.Minute {
		t.Fatalf("default lease ends in %v, want about %v", d, claim.DefaultLease)
	}
	released := 0
	await.Until(t, "Reap to release the 2 expired leases", func() (bool, string) {
		st, err := queuemaint.For(long).Reap(ctx)
		if err != nil {
			t.Fatal(err)
		}
		released += st.Released
		return released >= 2, fmt.Sprintf("%d released", released)
	})
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NOT NULL`); n != 1 {
		t.Fatalf("%d items claimed after the reap, want 1 (the one with a live lease)", n)
	}
	if err := short.Ack(ctx, hung[0], record(hung[0])); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("ack after the lease expired = %v, want ErrClaimLost", err)
	}
	again, err := long.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 5})
	if err != nil || len(again) != 2 {
		t.Fatalf("re-claimed %d, %v; want the 2 reaped items", len(again), err)
	}
	for _, it := range again {
		if it.Attempt != 2 || it.Token != 2 {
			t.Errorf("re-claimed item: attempt %d token %d, want 2 and 2 (the hung attempt counts)", it.Attempt, it.Token)
		}
	}
	if st, err := queuemaint.For(long).Reap(ctx); err != nil || st != (queuemaint.ReapStats{}) {
		t.Fatalf("a second Reap did %+v (%v), want nothing", st, err)
	}
	if got := long.Stats().Reaped; got != 2 {
		t.Errorf("Stats.Reaped = %d, want 2", got)
	}
}

// A crash loop ends dead: claims never hand out an item whose attempts are
// used up, and Reap moves it to the dead items with a last error saying so.
func TestCrashLoopEndsDead(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	ids, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("poison"), MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		crashed, err := startSessionNoCleanup(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if it := claimOne(t, q, crashed); it.Attempt != attempt {
			t.Fatalf("attempt %d, want %d", it.Attempt, attempt)
		}
		// The process dies mid-handler: its session row goes, the claim with it.
		if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id = $1`, crashed); err != nil {
			t.Fatal(err)
		}
	}
	s := startSession(t, ctx, pool)
	if got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10}); err != nil || len(got) != 0 {
		t.Fatalf("a claim handed out %d items whose attempts are used up (%v)", len(got), err)
	}
	st, err := queuemaint.For(q).Reap(ctx)
	if err != nil || st.Dead != 1 {
		t.Fatalf("Reap = %+v, %v; want 1 dead", st, err)
	}
	dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
	if err != nil || len(dead) != 1 || dead[0].ID != ids.IDs[0] {
		t.Fatalf("dead items %+v, %v", dead, err)
	}
	if dead[0].LastError != claim.CrashLoopError || dead[0].Attempts != 2 {
		t.Fatalf("dead item: attempts %d, last error %q", dead[0].Attempts, dead[0].LastError)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items left", n)
	}
	// A requeued item keeps growing its token.
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: ids.IDs[0]})); err != nil || !ok {
		t.Fatalf("requeue: %v %v", ok, err)
	}
	if it := claimOne(t, q, s.ID()); it.Token != 3 || it.Attempt != 1 {
		t.Fatalf("requeued item: token %d attempt %d, want 3 and 1", it.Token, it.Attempt)
	}
}

// Extend moves the leases of the items still held by the Claimer's session,
// and only those.
func TestExtendRefusesLostClaims(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Lease: time.Minute})
	s := startSession(t, ctx, pool)
	if _, err := q.Enqueue(ctx, payloads(3)...); err != nil {
		t.Fatal(err)
	}
	c := q.Claimer(s.ID())
	got, err := c.Claim(ctx, claim.ClaimRequest{Max: 3})
	if err != nil || len(got) != 3 {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	if err := q.Release(ctx, got[0]); err != nil {
		t.Fatal(err)
	}
	ext, err := c.Extend(ctx, got, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(ext) != 2 || ext[0].ID != got[1].ID || ext[1].ID != got[2].ID {
		t.Fatalf("extended %v, want the two items still held", ext)
	}
	for _, it := range ext {
		if d := time.Until(it.LeaseUntil); d < 50*time.Minute {
			t.Fatalf("extended lease ends in %v, want about an hour", d)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE lease_until > now() + INTERVAL '50 minutes'`); n != 2 {
		t.Fatalf("%d leases moved in the database, want 2", n)
	}
	if ext, err := c.Extend(ctx, got[:1], time.Hour); err != nil || len(ext) != 0 {
		t.Fatalf("Extend of a released item = %v, %v; want nothing", ext, err)
	}
	if _, err := c.Extend(ctx, got, 0); err == nil {
		t.Fatal("Extend by 0 accepted")
	}
	// Another session's Claimer extends nothing of s's, though the claims hold.
	if ext, err := q.Claimer(uuid.New()).Extend(ctx, got[1:], 2*time.Hour); err != nil || len(ext) != 0 {
		t.Fatalf("Extend through another session's Claimer = %v, %v; want nothing", ext, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE lease_until > now() + INTERVAL '90 minutes'`); n != 0 {
		t.Fatalf("%d leases moved by another session's Claimer, want 0", n)
	}
}

// ReleaseForgotten releases what a session holds but does not know about.
func TestReleaseForgotten(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	if _, err := q.Enqueue(ctx, payloads(5)...); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 5})
	if err != nil || len(got) != 5 {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	n, err := q.Claimer(s.ID()).ReleaseForgotten(ctx, []uuid.UUID{got[0].ID, got[1].ID})
	if err != nil || n != 3 {
		t.Fatalf("ReleaseForgotten = %d, %v; want 3", n, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NULL AND attempts = 0`); n != 3 {
		t.Fatalf("%d items released with their attempt given back, want 3", n)
	}
	for _, it := range got[:2] {
		if err := q.Ack(ctx, it, nil); err != nil {
			t.Fatalf("ack of a kept item: %v", err)
		}
	}
}

// A paused queue hands out nothing, to either kind of claim.
func TestPausedQueueClaimsNothing(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	other := newQueue(t, pool, claim.Options{Queue: "other"})
	s := startSession(t, ctx, pool)
	two := payloads(2)
	two[1].Priority = 1 // distinct claim order (see the claim after Resume)
	if _, err := q.Enqueue(ctx, two...); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Enqueue(ctx, payloads(1)...); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, 0)`, s.ID(), q.Name()); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Paused: claim.On}); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := readPaused(q.Settings(ctx)); err != nil || !p {
		t.Fatalf("Paused = %v, %v", p, err)
	}
	if p, err := readPaused(other.Settings(ctx)); err != nil || p {
		t.Fatalf("other queue Paused = %v, %v", p, err)
	}
	if got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 5}); err != nil || len(got) != 0 {
		t.Fatalf("Claim of a paused queue: %d items, %v", len(got), err)
	}
	if got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 5, Parts: []int{0}}); err != nil || len(got) != 0 {
		t.Fatalf("Claim of parts of a paused queue: %d items, %v", len(got), err)
	}
	if got, err := other.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 5}); err != nil || len(got) != 1 {
		t.Fatalf("Claim of another queue: %d items, %v; want 1", len(got), err)
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Paused: claim.Off}); err != nil {
		t.Fatal(err)
	}
	// A part listed twice is read once: both items, not one item twice.
	if got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2, Parts: []int{0, 0}}); err != nil || len(got) != 2 {
		t.Fatalf("Claim of parts after Resume: %d items, %v; want 2", len(got), err)
	}
}

// proxied returns a pool on a fresh database with the schema, through a
// fault proxy. The fault model is quiet there: the proxy's faults are the
// subject, and the tests assert what the server did (a COMMIT whose answer
// the proxy drops commits, unless an injected 40001 refused it).
func proxied(t *testing.T) (*pgxpool.Pool, *pgxpool.Pool, *faultproxy.Proxy) {
	t.Helper()
	url := setupURL(t)
	direct, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	testdb.Quiet(t, direct)
	p, purl, err := faultproxy.ForURL(url)
	if err != nil {
		t.Skipf("no fault proxy: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	pool, err := pgxpool.New(context.Background(), purl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return direct, pool, p
}

// An ack whose COMMIT CockroachDB answers with 40003 ("result is
// ambiguous"), whether it committed or not, is reported as
// ErrOutcomeUnknown, not run again and not counted as acked (invariants 7
// and 10); acked again, it writes the result only if the first did not
// (invariant 13).
func TestAckCommitAmbiguous(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		action    faultproxy.Action
		committed bool
	}{{"committed", faultproxy.AmbiguousForward, true}, {"rolled-back", faultproxy.AmbiguousDrop, false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			direct, pool, proxy := proxied(t)
			ctx := context.Background()
			q := newQueue(t, pool, claim.Options{})
			s := startSession(t, ctx, direct)
			if _, err := q.Enqueue(ctx, payloads(1)...); err != nil {
				t.Fatal(err)
			}
			it := claimOne(t, q, s.ID())
			runs := 0
			fired := proxy.Arm(faultproxy.Rule{Match: faultproxy.IsCommit, Action: c.action})
			err := q.Ack(ctx, it, func(ctx context.Context, tx pgx.Tx) error {
				runs++
				return record(it)(ctx, tx)
			})
			select {
			case <-fired:
			default:
				t.Fatal("the fault did not fire")
			}
			if !errors.Is(err, claim.ErrOutcomeUnknown) || errors.Is(err, claim.ErrClaimLost) {
				t.Fatalf("ack answered 40003 = %v, want ErrOutcomeUnknown", err)
			}
			if runs != 1 {
				t.Fatalf("record ran %d times: an unknown outcome was retried", runs)
			}
			want := map[bool]int{true: 1, false: 0}[c.committed]
			if n := count(t, direct, `SELECT count(*) FROM results`); n != want {
				t.Fatalf("%d results after the ambiguous COMMIT, want %d", n, want)
			}
			if got := q.Stats().Acked; got != 0 {
				t.Fatalf("Stats.Acked = %d for an unknown outcome", got)
			}
			// The same ack again: it writes the result once in all.
			err = q.Ack(ctx, it, record(it))
			switch {
			case c.committed && !errors.Is(err, claim.ErrClaimLost):
				t.Fatalf("the ack again, after it committed: %v, want ErrClaimLost", err)
			case !c.committed && err != nil:
				t.Fatalf("the ack again, after it did not commit: %v", err)
			}
			if n := count(t, direct, `SELECT count(*) FROM results`); n != 1 {
				t.Fatalf("%d results after the ack again, want 1", n)
			}
		})
	}
}

// A COMMIT whose answer is lost (the connection dropped after the server got
// it) is reported as ErrOutcomeUnknown — never as acked, never as failed —
// and not run again: the ack did commit, and its record ran once.
func TestAckCommitAnswerLostIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	direct, pool, proxy := proxied(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, direct)
	if _, err := q.Enqueue(ctx, payloads(1)...); err != nil {
		t.Fatal(err)
	}
	it := claimOne(t, q, s.ID())
	runs := 0
	fired := proxy.Arm(faultproxy.Rule{Match: faultproxy.IsCommit, Action: faultproxy.DropAnswer})
	err := q.Ack(ctx, it, func(ctx context.Context, tx pgx.Tx) error {
		runs++
		return record(it)(ctx, tx)
	})
	select {
	case <-fired:
	default:
		t.Fatal("the fault did not fire")
	}
	if !errors.Is(err, claim.ErrOutcomeUnknown) || errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("ack whose COMMIT answer was lost = %v, want ErrOutcomeUnknown", err)
	}
	if runs != 1 {
		t.Fatalf("record ran %d times: an unknown outcome was retried", runs)
	}
	if n := count(t, direct, `SELECT count(*) FROM results`); n != 1 {
		t.Fatalf("%d results: the commit did happen, want 1", n)
	}
	if got := q.Stats().Acked; got != 0 {
		t.Fatalf("Stats.Acked = %d for an unknown outcome", got)
	}

	// A claim whose answer was lost (on PostgreSQL the claim statement
	// commits by itself; on CockroachDB its transaction's COMMIT): unknown,
	// and the items it took are released by ReleaseForgotten.
	if _, err := q.Enqueue(ctx, payloads(3)...); err != nil {
		t.Fatal(err)
	}
	lost := faultproxy.Contains("WITH picked")
	if testdb.Kind(t) == "cockroach" {
		lost = faultproxy.IsCommit
	}
	proxy.Arm(faultproxy.Rule{Match: lost, Action: faultproxy.DropAnswer})
	if got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 3}); !errors.Is(err, claim.ErrOutcomeUnknown) {
		t.Fatalf("claim whose COMMIT answer was lost = %d items, %v; want ErrOutcomeUnknown", len(got), err)
	}
	if n, err := q.Claimer(s.ID()).ReleaseForgotten(ctx, nil); err != nil || n != 3 {
		t.Fatalf("ReleaseForgotten = %d, %v; want the 3 items the lost claim took", n, err)
	}

	// A statement dropped before it reached the server is a plain failure
	// inside a transaction: retried or reported failed, never unknown.
	it2 := claimOne(t, q, s.ID())
	proxy.Arm(faultproxy.Rule{Match: faultproxy.Contains("DELETE FROM"), Action: faultproxy.DropStatement})
	err = q.Ack(ctx, it2, record(it2))
	if errors.Is(err, claim.ErrOutcomeUnknown) {
		t.Fatalf("ack whose DELETE never ran = %v: not unknown, it did not commit", err)
	}
	t.Logf("ack whose DELETE was dropped: %v", err)
	if err != nil && count(t, direct, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, it2.ID) != 1 {
		t.Fatal("a failed ack removed the item")
	}

	// A nack (one statement) whose answer is lost: unknown.
	it3 := claimOne(t, q, s.ID())
	proxy.Arm(faultproxy.Rule{Match: faultproxy.Contains("vesting_at = now()"), Action: faultproxy.DropAnswer})
	if _, err := q.Nack(ctx, it3, errors.New("x")); !errors.Is(err, claim.ErrOutcomeUnknown) {
		t.Fatalf("nack whose answer was lost = %v, want ErrOutcomeUnknown", err)
	}
	// And a refused connection is a plain failure.
	proxy.Cut()
	pool.Reset()
	cctx, cancel := context.WithTimeout(ctx, await.Stretch(5*time.Second))
	defer cancel()
	_, err = q.Nack(cctx, it3, errors.New("x"))
	if err == nil || errors.Is(err, claim.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "connect") {
		t.Fatalf("nack with the database unreachable = %v, want a plain connection failure", err)
	}
}

// Code refuses a schema it does not know: on a database whose version row
// says Version+1, session.Start, Enqueue and Claim fail with ErrSchemaNewer, and
// nothing is written.
func TestNewerSchemaIsRefused(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool) // while the version was current
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_schema_version SET version = $1`, crsql.Version+1); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{})
	if _, err := q.Enqueue(ctx, payloads(1)...); !errors.Is(err, crsql.ErrSchemaNewer) {
		t.Fatalf("Enqueue on a newer database = %v, want ErrSchemaNewer", err)
	}
	if _, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1}); !errors.Is(err, crsql.ErrSchemaNewer) {
		t.Fatalf("Claim on a newer database = %v, want ErrSchemaNewer", err)
	}
	if _, err := session.Start(ctx, pool, session.Options{}); !errors.Is(err, crsql.ErrSchemaNewer) {
		t.Fatalf("session.Start on a newer database = %v, want ErrSchemaNewer", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items enqueued into a schema this code does not know", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_sessions`); n != 1 {
		t.Fatalf("%d sessions, want only the one started before", n)
	}
	// The check is cached only after success: back at this code's version, it works.
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_schema_version SET version = $1`, crsql.Version); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, payloads(1)...); err != nil {
		t.Fatal(err)
	}
}

// TestAckRacesTheDeletionOfItsSession runs an ack and the deletion of its
// session's row (a peer's reap, or the session's close) against each other,
// in both orders, each side waiting in the database on the other (invariants
// 1, 3 and 6). A deletion that locked the item's claim first (its foreign
// key's SET NULL) makes the ack wait, then fail as lost, writing nothing;
// an ack that deleted the item first makes the deletion wait, and the
// ack's result commits before the row is gone. So no result can commit after
// the deletion of the session that claimed its item; a test that saw a
// result stamped later than the last time it saw the row (cmd/demo,
// faultDemo.checkFence) saw the gap in its own sampling.
func TestAckRacesTheDeletionOfItsSession(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	testdb.Quiet(t, pool) // one exact interleaving, its transactions committed once
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	if _, err := q.Enqueue(ctx, payloads(2)...); err != nil {
		t.Fatal(err)
	}
	// waiting waits until a statement of the database waits for a lock
	// (PostgreSQL; CockroachDB has no pg_stat_activity wait events: there
	// the order is whichever comes first, and the outcome is checked alike).
	waiting := func(what string) {
		if testdb.Kind(t) != "postgres" {
			return
		}
		await.Until(t, what+" to wait for a lock", func() bool {
			return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
		})
	}

	// The deletion first: it holds the claim's row until it commits.
	first, err := startSessionNoCleanup(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	lost := claimOne(t, q, first)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id = $1`, first); err != nil {
		t.Fatal(err)
	}
	acked := make(chan error, 1)
	go func() { acked <- q.Ack(ctx, lost, record(lost)) }()
	waiting("the ack of an item whose session is being deleted")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-acked; !errors.Is(err, claim.ErrClaimLost) {
		t.Errorf("ack after its session's deletion committed: %v, want ErrClaimLost", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, lost.ID); n != 0 {
		t.Errorf("the ack that lost its claim to the deletion of its session wrote %d results", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND claim IS NULL`, lost.ID); n != 1 {
		t.Errorf("the item whose ack lost is not back in the queue, unclaimed")
	}

	// The ack first: it has deleted the item and writes its result while
	// the session's row is being deleted.
	second, err := startSessionNoCleanup(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	it, err := q.Claimer(second).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(it) != 1 {
		t.Fatalf("claimed %d items (err %v), want 1", len(it), err)
	}
	inAck, release := make(chan struct{}), make(chan struct{})
	var once bool
	go func() {
		acked <- q.Ack(ctx, it[0], func(ctx context.Context, tx pgx.Tx) error {
			if !once {
				once = true
				close(inAck)
				<-release
			}
			return record(it[0])(ctx, tx)
		})
	}()
	<-inAck
	deleted := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id = $1`, second)
		deleted <- err
	}()
	waiting("the deletion of a session whose item is being acked")
	close(release)
	if err := <-acked; err != nil {
		t.Errorf("ack before its session's deletion: %v, want it committed", err)
	}
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1 AND session_id = $2`, it[0].ID, second); n != 1 {
		t.Errorf("%d results of the ack that came first, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 1 {
		t.Errorf("%d items left, want the one whose ack lost", n)
	}
}
