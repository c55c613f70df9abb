package claim_test

import (
	"context"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
)

// Options returns the options as given to New (zero fields stay zero), DB
// the database: what a worker, a schedule runner or workertest built on the
// queue reads.
func TestQueueOptionsAndDB(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	given := claim.Options{Queue: "mail", MaxAttempts: 3}
	q := newQueue(t, pool, given)
	if q.Options() != given || q.Name() != "mail" || q.DB() != claim.DB(pool) {
		t.Errorf("Options %+v, Name %q, DB %v; want %+v, \"mail\", the pool", q.Options(), q.Name(), q.DB(), given)
	}
	if d := newQueue(t, pool, claim.Options{}); d.Options() != (claim.Options{}) || d.Name() != claim.DefaultQueue {
		t.Errorf("zero options: Options %+v, Name %q; want zero, %q", d.Options(), d.Name(), claim.DefaultQueue)
	}
}

// A claim request's Lease replaces Options.Lease for its claims (any part,
// own parts and the urgent lane); zero keeps the queue's; a lease out of
// range is refused before anything is claimed.
func TestClaimRequestLease(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	if _, err := q.Enqueue(ctx, payloads(4)...); err != nil {
		t.Fatal(err)
	}
	within := func(what string, it claim.Item, want time.Duration) {
		t.Helper()
		if d := time.Until(it.LeaseUntil); d < want-30*time.Second || d > want+30*time.Second {
			t.Errorf("%s: lease ends in %v, want about %v", what, d, want)
		}
	}
	for _, bad := range []time.Duration{time.Microsecond, -time.Second, 366 * 24 * time.Hour} {
		if got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1, Lease: bad}); err == nil || len(got) != 0 {
			t.Errorf("Claim with Lease %v: %d items, %v; want an error", bad, len(got), err)
		}
		if got, err := q.Claimer(s.ID()).ClaimUrgent(ctx, claim.UrgentRequest{Max: 1, MaxPriority: 1, Lease: bad}); err == nil || len(got) != 0 {
			t.Errorf("ClaimUrgent Lease %v: %d items, %v; want an error", bad, len(got), err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NOT NULL`); n != 0 {
		t.Fatalf("%d items claimed by refused requests, want 0", n)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1, Lease: 2 * time.Minute})
	if err != nil || len(got) != 1 {
		t.Fatalf("Claim: %d items, %v", len(got), err)
	}
	within("Claim with Lease 2m", got[0], 2*time.Minute)
	got, err = q.Claimer(s.ID()).ClaimUrgent(ctx, claim.UrgentRequest{Max: 1, MaxPriority: 1, Lease: 10 * time.Minute})
	if err != nil || len(got) != 1 {
		t.Fatalf("ClaimUrgent: %d items, %v", len(got), err)
	}
	within("ClaimUrgent Lease 10m", got[0], 10*time.Minute)
	within("Claim (the queue's lease)", claimOne(t, q, s.ID()), claim.DefaultLease)
}
