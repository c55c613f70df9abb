package worker_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// keyInPart returns a key that claim.Enqueue puts in part p of n (FNV-1a
// of the key, non-negative, modulo n; the test checks where items land).
func keyInPart(p, n int) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("key-%d", i)
		h := fnv.New64a()
		h.Write([]byte(k))
		if int((h.Sum64()&math.MaxInt64)%uint64(n)) == p {
			return k
		}
	}
}

// TestUrgentLaneTakesBusyOwnersItem: two workers with one handler each and
// the urgent lane on, two parts. The owner of part 0 is kept busy by a
// blocking item; an urgent item enqueued into part 0 must be handled by the
// other worker, while the owner is still busy. Then 300 items of mixed
// priorities (a third urgent) go through both workers: each is handled and
// recorded exactly once.
func TestUrgentLaneTakesBusyOwnersItem(t *testing.T) {
	t.Parallel()
	const parts = 2
	pool := setup(t)
	ctx := context.Background()
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", parts); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	record := recordHandler(0)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if string(it.Payload) == "block" {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return record(ctx, it)
	}
	opts := worker.Options{
		Parts: parts, Concurrency: 1, UrgentLane: true, UrgentPriority: 0,
		Partition: partition.Tuning{Poll: 100 * time.Millisecond, DrainTimeout: 2 * time.Second},
	}
	a, b := start(t, pool, h, opts), start(t, pool, h, opts)
	waitFor(t, "each worker to own one part", 20*time.Second, func() bool {
		return count(t, pool, `SELECT count(DISTINCT session_id) FROM crdbwork_session_parts WHERE queue = 'default'`) == parts &&
			count(t, pool, `SELECT count(*) FROM crdbwork_session_parts WHERE queue = 'default'`) == parts
	})
	var owner uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT session_id FROM crdbwork_session_parts WHERE queue = 'default' AND part = 0`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := keyInPart(0, parts)
	blocker, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("block"), Key: key, Priority: 5})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "part 0's owner to claim the blocking item", 20*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND claim = $2`, blocker.IDs[0], owner) == 1
	})
	urgent, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("urgent"), Key: key, Priority: 0})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the urgent item to be handled", 20*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, urgent.IDs[0]) == 1
	})
	// Its part as its handler saw it: the item itself may be acked and gone
	// by the time the enqueue returns (the other worker is idle).
	var by uuid.UUID
	var part int64
	if err := pool.QueryRow(ctx, `SELECT session_id, part FROM results WHERE item_id = $1`, urgent.IDs[0]).Scan(&by, &part); err != nil {
		t.Fatal(err)
	}
	if part != 0 {
		t.Fatalf("the urgent item is in part %d; want 0", part)
	}
	if by == owner {
		t.Fatalf("the urgent item was handled by its part's owner %s; want the other worker", owner)
	}
	if count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND claim = $2`, blocker.IDs[0], owner) != 1 {
		t.Fatal("the owner's blocking item is no longer claimed by it: the owner was not busy throughout")
	}
	close(release)

	// Mixed load: keyed items over both parts, a third of them urgent.
	const n = 300
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(fmt.Sprint(i)), Key: fmt.Sprint("mixed-", i%37), Priority: rand.IntN(3)}
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every item to be handled", 60*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	a.Stop(t)
	b.Stop(t)
	assertExactlyOnce(t, pool, n+2)
	var laneByOthers int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM results WHERE NOT owned`).Scan(&laneByOthers); err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	t.Logf("items handled by a session that did not own their part (through the lane): %d", laneByOthers)
}
