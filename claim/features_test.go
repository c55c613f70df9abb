package claim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// An item past its deadline is never handed out again and ends dead with
// reason "expired"; one claimed before its deadline may still be acked, and
// items without a deadline are untouched.
func TestItemTTLExpires(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	// "held" must be claimed before its deadline: stretched with the
	// machine's load.
	ttl := await.Stretch(300 * time.Millisecond)
	ids, err := q.Enqueue(ctx,
		claim.NewItem{Payload: []byte("short"), TTL: ttl, Tenant: "acme"},
		claim.NewItem{Payload: []byte("held"), TTL: ttl, Priority: -1},
		claim.NewItem{Payload: []byte("forever"), Priority: 5})
	if err != nil {
		t.Fatal(err)
	}
	held := claimOne(t, q, s.ID())
	if held.ID != ids.IDs[1] || held.ExpiresAt.IsZero() {
		t.Fatalf("claimed %s (expires %v), want the priority -1 item %s with a deadline", held.ID, held.ExpiresAt, ids.IDs[1])
	}
	await.Until(t, "the two deadlines to pass by the database's clock", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE expires_at <= now()`)
		return n >= 2, fmt.Sprintf("%d of 2 passed", n)
	})
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(got) != 1 || got[0].ID != ids.IDs[2] {
		t.Fatalf("claim after the deadline = %v, %v; want only the item without a deadline", got, err)
	}
	st, err := queuemaint.For(q).Reap(ctx)
	if err != nil || st.Expired != 1 {
		t.Fatalf("Reap = %+v, %v; want 1 expired (the claimed one is its holder's)", st, err)
	}
	dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
	if err != nil || len(dead) != 1 || dead[0].ID != ids.IDs[0] || dead[0].Reason != claim.ReasonExpired || dead[0].Tenant != "acme" {
		t.Fatalf("dead items %+v, %v; want %s expired, tenant acme", dead, err, ids.IDs[0])
	}
	// The claim made before the deadline still acks.
	if err := q.Ack(ctx, held, nil); err != nil {
		t.Fatalf("ack of an item claimed before its deadline: %v", err)
	}
	if err := q.Ack(ctx, got[0], nil); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items left", n)
	}
	// A nacked item past its deadline is not retried: the reaper takes it.
	ids, err = q.Enqueue(ctx, claim.NewItem{Payload: []byte("nacked"), TTL: await.Stretch(200 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	it := claimOne(t, q, s.ID())
	await.Until(t, "the nacked item's deadline to pass by the database's clock", func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE expires_at <= now()`) >= 1
	})
	if _, err := q.Nack(ctx, it, claim.RetryAfter(0, errors.New("later"))); err != nil {
		t.Fatal(err)
	}
	if got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10}); err != nil || len(got) != 0 {
		t.Fatalf("an expired, nacked item was handed out again: %v %v", got, err)
	}
	if st, err := queuemaint.For(q).Reap(ctx); err != nil || st.Expired != 1 {
		t.Fatalf("Reap = %+v, %v; want the nacked item expired", st, err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x"), TTL: -time.Second}); err == nil {
		t.Fatal("a negative TTL was accepted")
	}
}

// At-most-once items are deleted by the claim that hands them out: never
// handed out twice, even when the claimer dies at once; by item and by
// queue setting, through the INSERT and the COPY paths.
func TestAtMostOnceClaimDeletes(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	ids, err := q.Enqueue(ctx,
		claim.NewItem{Payload: []byte("once"), AtMostOnce: true, MaxAttempts: 5},
		claim.NewItem{Payload: []byte("normal"), Priority: 1})
	if err != nil {
		t.Fatal(err)
	}
	crashed, err := startSessionNoCleanup(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(crashed).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(got) != 2 || got[0].ID != ids.IDs[0] || !got[0].AtMostOnce || got[1].AtMostOnce {
		t.Fatalf("claim = %+v, %v", got, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, ids.IDs[0]); n != 0 {
		t.Fatal("the at-most-once item is still in the items table after its claim")
	}
	if _, err := q.Nack(ctx, got[0], errors.New("x")); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("nack of an at-most-once item = %v, want ErrClaimLost (nothing to put back)", err)
	}
	// Ack only records its result.
	if err := q.Ack(ctx, got[0], record(got[0])); err != nil {
		t.Fatalf("ack of an at-most-once item: %v", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, ids.IDs[0]); n != 1 {
		t.Fatalf("%d result rows for the at-most-once item, want 1", n)
	}
	// The claimer dies: the ordinary item comes back, the other never does.
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id = $1`, crashed); err != nil {
		t.Fatal(err)
	}
	s := startSession(t, ctx, pool)
	again, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(again) != 1 || again[0].ID != ids.IDs[1] {
		t.Fatalf("after the crash: %+v, %v; want only the ordinary item", again, err)
	}
	if err := q.Ack(ctx, again[0], nil); err != nil {
		t.Fatal(err)
	}

	// The queue setting makes every item at-most-once: 200 items (COPY)
	// and 3 with given ids (INSERT).
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{AtMostOnce: true}}); err != nil {
		t.Fatal(err)
	}
	if st, err := q.Settings(ctx); err != nil || !st.AtMostOnce {
		t.Fatalf("settings = %+v, %v", st, err)
	}
	items := payloads(200)
	for i := range 3 {
		items = append(items, claim.NewItem{ID: uuid.New(), Payload: []byte(fmt.Sprint("given ", i))})
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE at_most_once AND max_attempts = 1`); n != 203 {
		t.Fatalf("%d of 203 items are at-most-once with one attempt", n)
	}
	seen := map[uuid.UUID]bool{}
	for {
		got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 64})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
		for _, it := range got {
			if seen[it.ID] || !it.AtMostOnce {
				t.Fatalf("item %s handed out twice or not at-most-once", it.ID)
			}
			seen[it.ID] = true
		}
	}
	if len(seen) != 203 || count(t, pool, `SELECT count(*) FROM crdbwork_items`) != 0 {
		t.Fatalf("handed out %d of 203; %d left", len(seen), count(t, pool, `SELECT count(*) FROM crdbwork_items`))
	}
}

// In a fair queue a tenant with a large backlog does not starve small
// tenants: their items are claimed within a round; in a plain queue they
// wait behind the backlog.
func TestFairQueueServesSmallTenants(t *testing.T) {
	t.Parallel()
	for _, fair := range []bool{true, false} {
		t.Run(fmt.Sprint("fair=", fair), func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ctx := context.Background()
			q := newQueue(t, pool, claim.Options{})
			if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: fair}}); err != nil {
				t.Fatal(err)
			}
			big := make([]claim.NewItem, 2000)
			for i := range big {
				big[i] = claim.NewItem{Payload: []byte("big"), Tenant: "big"}
			}
			// Two batches: the second must queue behind the first (the
			// tenant's last turn), not beside it.
			if _, err := q.Enqueue(ctx, big[:1000]...); err != nil {
				t.Fatal(err)
			}
			if _, err := q.Enqueue(ctx, big[1000:]...); err != nil {
				t.Fatal(err)
			}
			var small []claim.NewItem
			for i := range 10 {
				small = append(small, claim.NewItem{Payload: []byte("small"), Tenant: fmt.Sprint("small-", i)})
			}
			for _, it := range small { // one call each, as a trickle
				if _, err := q.Enqueue(ctx, it); err != nil {
					t.Fatal(err)
				}
			}
			s := startSession(t, ctx, pool)
			served := 0
			for claimed := 0; claimed < 40; claimed++ {
				it := claimOne(t, q, s.ID())
				if it.Tenant != "big" {
					served++
				}
				if err := q.Ack(ctx, it, nil); err != nil {
					t.Fatal(err)
				}
			}
			if fair && served != 10 {
				t.Fatalf("fair: %d of 10 small tenants' items among the first 40 claims, want all", served)
			}
			if !fair && served != 0 {
				t.Fatalf("plain: %d small items jumped a 2000-item backlog", served)
			}
			if fair {
				// Turns of the big tenant are distinct and one apart.
				if n := count(t, pool, `SELECT count(DISTINCT turn_at) FROM crdbwork_items WHERE tenant = 'big'`); n != 2000-40+10 {
					t.Fatalf("%d distinct turns among the big tenant's %d items", n, 2000-40+10)
				}
			}
		})
	}
}

// SkipTenants leaves a tenant's items unclaimed; a tenant's items without a
// key land in the part PartOf names.
func TestSkipTenantsAndTenantPart(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	if _, err := partition.EnsureParts(ctx, pool, crsql.Tables{}, "default", 8); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{})
	var items []claim.NewItem
	for i := range 40 {
		items = append(items, claim.NewItem{Payload: []byte("x"), Tenant: fmt.Sprint("t", i%4)})
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		tenant := fmt.Sprint("t", i)
		want := claim.PartOf("", tenant, 8)
		if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE tenant = $1 AND part <> $2`, tenant, want); n != 0 {
			t.Fatalf("%d items of tenant %s outside its part %d", n, tenant, want)
		}
	}
	s := startSession(t, ctx, pool)
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 100, SkipTenants: []string{"t1", "t3"}})
	if err != nil || len(got) != 20 {
		t.Fatalf("claimed %d, %v; want the 20 items of t0 and t2", len(got), err)
	}
	for _, it := range got {
		if it.Tenant == "t1" || it.Tenant == "t3" {
			t.Fatalf("claimed an item of skipped tenant %s", it.Tenant)
		}
	}
}

// Dead items say why they died.
func TestDeadItemReasons(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	ids, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("a"), MaxAttempts: 1}, claim.NewItem{Payload: []byte("b"), Priority: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Nack(ctx, claimOne(t, q, s.ID()), errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Nack(ctx, claimOne(t, q, s.ID()), claim.Permanent(errors.New("bad"))); err != nil {
		t.Fatal(err)
	}
	dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
	if err != nil || len(dead) != 2 {
		t.Fatal(dead, err)
	}
	reasons := map[uuid.UUID]string{}
	for _, d := range dead {
		reasons[d.ID] = d.Reason
	}
	if reasons[ids.IDs[0]] != claim.ReasonFailed || reasons[ids.IDs[1]] != claim.ReasonPermanent {
		t.Fatalf("reasons %v", reasons)
	}
}

// A queue's first EnqueueTx checks the schema in the caller's transaction:
// on a pool of one connection, held by that transaction, it does not wait
// for a second one.
func TestFirstEnqueueTxOnOneConnection(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(setupURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	testdb.Quiet(t, pool) // the test's own transaction is committed once, not retried
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(20*time.Second))
	defer cancel()
	q := newQueue(t, pool, claim.Options{})
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := q.EnqueueTx(ctx, tx, claim.NewItem{Payload: []byte("x"), Tenant: "t"}); err != nil {
		t.Fatalf("first EnqueueTx on a one-connection pool: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
