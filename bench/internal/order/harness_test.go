package order_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/bench/internal/order"
	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// maxPriority bounds the random priorities: [0, maxPriority), wide enough
// that ties are rare, as with the paper's uniformly distributed priorities.
const maxPriority = 1_000_000

// setup returns a pool on a fresh database of the test with the schema.
func setup(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return testschema.New(t)
}

// startSessions starts n sessions and, with parts > 0, gives them the
// queue's parts as the rebalancer would (partition.Assign: contiguous runs
// in the order of session ids), written directly into the session-parts
// table. It returns the sessions and each one's parts.
func startSessions(t testing.TB, ctx context.Context, pool *pgxpool.Pool, queue string, n, parts int) ([]*session.Session, map[uuid.UUID][]int) {
	t.Helper()
	var ss []*session.Session
	var ids []uuid.UUID
	for range n {
		s, err := session.Start(ctx, pool, session.Options{Tuning: session.Tuning{Heartbeat: 500 * time.Millisecond, Expiry: 10 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(context.Background()) })
		ss = append(ss, s)
		ids = append(ids, s.ID())
	}
	if parts == 0 {
		return ss, nil
	}
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, queue, parts); err != nil {
		t.Fatal(err)
	}
	owned := partition.Assign(ids, parts)
	for id, ps := range owned {
		for _, p := range ps {
			if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, $3)`, id, queue, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ss, owned
}

// randomItems returns n items with random priorities in [0, maxPriority)
// and random keys (so random parts).
func randomItems(rng *rand.Rand, n int) []claim.NewItem {
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{
			Payload:  []byte{1},
			Key:      fmt.Sprintf("k%016x", rng.Uint64()),
			Priority: rng.IntN(maxPriority),
		}
	}
	return items
}

// load is one PEI measurement: a queue with a steady backlog (every claimed
// item is replaced by a new random one, as in the paper's simulations,
// which add one element per element popped) worked by sessions.
type load struct {
	parts    int  // 0: any-part claims; else claims of the session's own parts
	sessions int  // claiming sessions
	backlog  int  // claimable items kept in the queue
	claims   int  // total claim statements
	batch    int  // items per claim (the paper pops one)
	serial   bool // claims one at a time, the sessions in turn: every count is exact
	// urgent, if set, is the urgent priority: a share urgentShare of the
	// items get priorities in [0, *urgent], the others above it, and the
	// result summarizes the urgent items' PEI apart.
	urgent      *int
	urgentShare float64
	// lane claims items with priority <= *urgent through the urgent lane
	// first (claim.Queue.ClaimUrgent), then the rest as above.
	lane bool
	// busy sessions own parts but never claim, like an owner whose handler
	// slots are all taken by long items: their parts' items wait (unless
	// the lane takes them).
	busy int
}

func (l load) name() string {
	mode := "concurrent"
	if l.serial {
		mode = "serial"
	}
	name := fmt.Sprintf("any-part/sessions=%d/%s", l.sessions, mode)
	if l.parts > 0 {
		name = fmt.Sprintf("parts=%d/sessions=%d/%s", l.parts, l.sessions, mode)
	}
	if l.busy > 0 {
		name += fmt.Sprintf("/%d-busy", l.busy)
	}
	if l.lane {
		name += "/urgent-lane"
	} else if l.urgent != nil {
		name += "/no-lane"
	}
	return name
}

// result is what a load measured.
type result struct {
	all, urgent order.Summary
	// retries counts the claims' serialization-failure retries.
	retries int64
	// claimTime is the mean duration of one claim (both statements with
	// the lane), without the count.
	claimTime time.Duration
	// claimed counts items claimed, by the lane and in all.
	laneClaimed, claimed int64
	// owner: for each item claimed, the session that claimed it.
	owner map[uuid.UUID]uuid.UUID
	// urgentLeft counts the urgent items still claimable at the end.
	urgentLeft int
}

// run runs l on a fresh queue of pool and measures every claim's PEI.
func (l load) run(t testing.TB, ctx context.Context, pool *pgxpool.Pool, queue string, seed uint64) result {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	var rngMu sync.Mutex
	newItems := func(n int) []claim.NewItem {
		rngMu.Lock()
		defer rngMu.Unlock()
		items := randomItems(rng, n)
		if l.urgent != nil {
			for i := range items {
				if rng.Float64() < l.urgentShare {
					items[i].Priority = rng.IntN(*l.urgent + 1)
				} else {
					items[i].Priority = *l.urgent + 1 + rng.IntN(maxPriority)
				}
			}
		}
		return items
	}
	q, err := claim.New(pool, claim.Options{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	ss, owned := startSessions(t, ctx, pool, queue, l.sessions, l.parts)
	if _, err := q.Enqueue(ctx, newItems(l.backlog)...); err != nil {
		t.Fatal(err)
	}
	meter, err := order.NewMeter(pool, crsql.Tables{}, queue)
	if err != nil {
		t.Fatal(err)
	}
	batch := max(l.batch, 1)
	var (
		left            atomic.Int64
		claimNanos      atomic.Int64
		laneN, claimedN atomic.Int64
		ownerMu         sync.Mutex
		owner           = map[uuid.UUID]uuid.UUID{}
		firstErr        error
		errOnce         sync.Once
	)
	left.Store(int64(l.claims))
	fail := func(err error) { errOnce.Do(func() { firstErr = err }) }
	// step makes one claim for s, measures it and refills the backlog.
	step := func(s *session.Session) bool {
		if left.Add(-1) < 0 {
			return false
		}
		start := time.Now()
		var items []claim.Item
		if l.lane {
			got, err := q.Claimer(s.ID()).ClaimUrgent(ctx, claim.UrgentRequest{Max: batch, MaxPriority: *l.urgent})
			if err != nil {
				fail(err)
				return false
			}
			laneN.Add(int64(len(got)))
			items = got
		}
		if rest := batch - len(items); rest > 0 {
			var got []claim.Item
			var err error
			if l.parts == 0 {
				got, err = q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: rest})
			} else {
				got, err = q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: rest, Parts: owned[s.ID()]})
			}
			if err != nil {
				fail(err)
				return false
			}
			items = append(items, got...)
		}
		claimNanos.Add(int64(time.Since(start)))
		if _, err := meter.Observe(ctx, items); err != nil {
			fail(err)
			return false
		}
		claimedN.Add(int64(len(items)))
		ownerMu.Lock()
		for _, it := range items {
			if prev, dup := owner[it.ID]; dup {
				fail(fmt.Errorf("item %s claimed twice: by %s and by %s", it.ID, prev, s.ID()))
			}
			owner[it.ID] = s.ID()
		}
		ownerMu.Unlock()
		// Claimed items stay claimed (no longer claimable); new ones
		// replace them, so the backlog stays at l.backlog.
		if len(items) > 0 {
			if _, err := q.Enqueue(ctx, newItems(len(items))...); err != nil {
				fail(err)
				return false
			}
		}
		return true
	}
	// The claimers: not the busy sessions, nor (without the lane) those
	// that own no part (more sessions than parts), which would find
	// nothing to claim.
	var claimers []*session.Session
	for i, s := range ss {
		if i < l.busy || (l.parts > 0 && !l.lane && len(owned[s.ID()]) == 0) {
			continue
		}
		claimers = append(claimers, s)
	}
	if len(claimers) == 0 {
		t.Fatalf("%s: no session claims", l.name())
	}
	if l.serial {
		for i := 0; ; i++ {
			if !step(claimers[i%len(claimers)]) {
				break
			}
		}
	} else {
		var wg sync.WaitGroup
		for _, s := range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for step(s) {
				}
			}()
		}
		wg.Wait()
	}
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	res := result{all: meter.Summary(), retries: q.Stats().Retries["claim"], laneClaimed: laneN.Load(),
		claimed: claimedN.Load(), owner: owner}
	if l.urgent != nil {
		u := *l.urgent
		res.urgent = meter.SummaryWhere(func(p int) bool { return p <= u })
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND claim IS NULL AND priority <= $2`, queue, u).Scan(&res.urgentLeft); err != nil {
			t.Fatal(err)
		}
	}
	if l.claims > 0 {
		res.claimTime = time.Duration(claimNanos.Load() / int64(l.claims))
	}
	return res
}
