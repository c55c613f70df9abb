package worker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

var partsOpts = worker.Options{
	Parts: 16, Concurrency: 8,
	Partition: partition.Tuning{Poll: 100 * time.Millisecond, DrainTimeout: 2 * time.Second},
}

// TestChurnKeepsExactlyOnce has sessions join and leave while keyed items
// are processed in 32 parts: six membership changes, each made while items
// remain (the items come in batches, and a change follows each batch but
// the last once all but half a batch is done), the next one after
// every live worker rebalanced twice more (its rebalancer's rounds, not a
// sleep). Every item is acked once, by the owner of its part.
func TestChurnKeepsExactlyOnce(t *testing.T) {
	t.Parallel()
	const n, batch, parts = 2100, 300, 32
	pool := setup(t)
	ctx := context.Background()
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", parts); err != nil {
		t.Fatal(err)
	}
	var live []*running
	var rebalances []*await.Rounds // live[i]'s rebalances
	joined := 0
	join := func() {
		joined++
		rounds := await.NewRounds(fmt.Sprintf("rebalances of worker %d", joined))
		opts := partsOpts
		opts.Testing.Partition.AfterRebalance = func([]int, error) { rounds.Tick() }
		live = append(live, start(t, pool, recordHandler(0), opts))
		rebalances = append(rebalances, rounds)
	}
	for range 3 {
		join()
	}
	joins, leaves := 0, 0
	var stopped []*running
	var remained []int
	for enqueued := 0; ; {
		enqueue(t, pool, "default", batch, true)
		enqueued += batch
		if enqueued >= n {
			break
		}
		half := enqueued - batch/2
		await.Until(t, fmt.Sprintf("%d items done", half), func() (bool, string) {
			done := count(t, pool, `SELECT count(*) FROM results`)
			return done >= half, fmt.Sprintf("%d done", done)
		})
		remained = append(remained, count(t, pool, `SELECT count(*) FROM crdbwork_items`))
		if len(live) > 1 && (len(live) >= 5 || rand.IntN(2) == 0) {
			i := rand.IntN(len(live))
			live[i].Stop(t)
			stopped = append(stopped, live[i])
			live = append(live[:i], live[i+1:]...)
			rebalances = append(rebalances[:i], rebalances[i+1:]...)
			leaves++
		} else {
			join()
			joins++
		}
		for _, r := range rebalances {
			r.Wait(t, 3) // a round under way counts: three for two whole ones
		}
	}
	await.Until(t, "every item to be handled", func() (bool, string) {
		left := count(t, pool, `SELECT count(*) FROM crdbwork_items`)
		return left == 0, fmt.Sprintf("%d items left", left)
	}, await.Within(2*time.Minute))
	var retries, lost int64
	for _, r := range append(live, stopped...) {
		r.Stop(t)
		st := r.w.Stats()
		retries += st.Retries["claim"]
		lost += st.LostClaims
	}
	t.Logf("%d joins, %d leaves; items left at each change %v; claim retries %d; acks refused for lost claims %d", joins, leaves, remained, retries, lost)
	if len(remained) != n/batch-1 || slices.Contains(remained, 0) {
		t.Fatalf("items left at each membership change: %v; want %d changes, each with items left", remained, n/batch-1)
	}
	assertExactlyOnce(t, pool, n)
	if bad := count(t, pool, `SELECT count(*) FROM results WHERE NOT owned`); bad != 0 {
		t.Errorf("%d results recorded by a session that did not own the item's part at ack time", bad)
	}
}

// TestCrashedSessionPartsFailOver crashes a session that owns parts and holds
// claims (it stops heartbeating, no close): after its expiry, the survivors
// take its parts and handle its items.
func TestCrashedSessionPartsFailOver(t *testing.T) {
	t.Parallel()
	const n, parts = 400, 8
	pool := setup(t)
	ctx := context.Background()
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", parts); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, "default", n, true)

	// The victim owns every part and claims everything it can, then crashes.
	crashCtx, crash := context.WithCancel(ctx)
	sess := fastSession()
	victim, err := session.Start(crashCtx, pool, session.Options{Tuning: sess})
	if err != nil {
		t.Fatal(err)
	}
	reb, err := partition.New(pool, victim, partition.Options{Tuning: partition.Tuning{Poll: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	// The victim's rebalancer stops once it owns every part, so that it does
	// not hand parts to the survivors while its session is alive: the parts
	// can then move only through the session's expiry.
	rebCtx, stopReb := context.WithCancel(crashCtx)
	rebDone := make(chan error, 1)
	go func() { rebDone <- reb.Run(rebCtx) }()
	waitFor(t, "the victim to own every part", 20*time.Second, func() bool { return len(reb.Owned()) == parts })
	owned := reb.Owned()
	stopReb()
	await.Recv(t, "the victim's rebalancer to stop", rebDone)
	q, err := claim.New(pool, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	held, err := q.Claimer(victim.ID()).Claim(ctx, claim.ClaimRequest{Max: 50, Parts: owned})
	if err != nil || len(held) != 50 {
		t.Fatalf("victim claimed %d items (%v), want 50", len(held), err)
	}
	ids := make([]uuid.UUID, len(held))
	for i, it := range held {
		ids[i] = it.ID
	}

	// The survivors are up but own nothing while the victim is alive: no
	// item is handled through three rebalances of each.
	var survivors []*running
	rebalanced := await.NewRounds("the survivors' rebalances")
	for range 2 {
		opts := partsOpts
		opts.Testing.Partition.AfterRebalance = func([]int, error) { rebalanced.Tick() }
		survivors = append(survivors, start(t, pool, recordHandler(0), opts))
	}
	await.Never(t, "a survivor handles an item while the victim owns every part", rebalanced, 2*3, func() (bool, string) {
		got := count(t, pool, `SELECT count(*) FROM results`)
		return got != 0, fmt.Sprintf("%d handled", got)
	})
	crash()
	killed := time.Now()
	firstReclaim := waitFor(t, "a survivor to re-claim one of the victim's items", time.Minute, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = ANY($1) AND claim IS NOT NULL AND claim <> $2`, ids, victim.ID())+
			count(t, pool, `SELECT count(*) FROM results WHERE item_id = ANY($1)`, ids) > 0
	})
	waitFor(t, "every item to be handled", 2*time.Minute, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	t.Logf("failover: kill → first re-claim %v, kill → all %d items done %v (heartbeat %v, expiry %v)",
		firstReclaim, n, time.Since(killed), sess.Heartbeat, sess.Expiry)
	for _, r := range survivors {
		r.Stop(t)
	}
	assertExactlyOnce(t, pool, n)
	if got := count(t, pool, `SELECT count(*) FROM results WHERE session_id = $1`, victim.ID()); got != 0 {
		t.Fatalf("the crashed session recorded %d results", got)
	}
	if late := q.Ack(ctx, held[0], nil); late == nil {
		t.Fatal("the crashed session's late ack succeeded")
	}
}

// TestPartsClaimWithoutRetries runs the same load with and without parts and
// compares the claim statement's serialization-failure retries.
func TestPartsClaimWithoutRetries(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{16, 0} {
		pool := setup(t)
		testdb.Quiet(t, pool) // it counts the claims' retries: the fault model's would count too
		ctx := context.Background()
		if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", 16); err != nil {
			t.Fatal(err)
		}
		enqueue(t, pool, "default", 3000, true)
		opts := partsOpts
		opts.Parts = parts
		var ws []*running
		for range 4 {
			ws = append(ws, start(t, pool, recordHandler(0), opts))
		}
		waitFor(t, "the queue to drain", 2*time.Minute, func() bool {
			return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0
		})
		var retries, claims int64
		for _, r := range ws {
			r.Stop(t)
			st := r.w.Stats()
			retries += st.Retries["claim"]
			claims += st.Claimed
		}
		t.Logf("parts=%v: %d claim retries for %d claimed items", parts, retries, claims)
		if parts > 0 && retries != 0 {
			t.Errorf("parts mode had %d claim retries, want 0", retries)
		}
		assertExactlyOnce(t, pool, 3000)
	}
}
