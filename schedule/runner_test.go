package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/schedule"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// nilDB is a database for tests that do no I/O.
type nilDB struct{ *pgxpool.Pool }

// setup returns a pool on a fresh database of the test with the schema.
func setup(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return testschema.New(t)
}

// newRunner returns a runner of s on queue ("": the default) of pool.
func newRunner(t testing.TB, pool *pgxpool.Pool, queue string, opts schedule.Options, s ...schedule.Schedule) *schedule.Runner {
	t.Helper()
	q, err := claim.New(pool, claim.Options{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	r, err := schedule.New(q, opts, s...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// dbNow reads the database clock.
func dbNow(t testing.TB, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	if err := pool.QueryRow(context.Background(), `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// waitDB waits until the database clock reaches at.
func waitDB(t testing.TB, pool *pgxpool.Pool, at time.Time) {
	t.Helper()
	await.Until(t, "the database clock to reach "+at.Format("15:04:05.000"), func() (bool, string) {
		now := dbNow(t, pool)
		return !now.Before(at), "now " + now.Format("15:04:05.000")
	}, await.Within(time.Until(at)+time.Minute))
}

// itemsOf returns, for each id in the items table, how many rows have it,
// keyed by id, for the queue.
func itemIDs(t testing.TB, pool *pgxpool.Pool, queue string) map[uuid.UUID]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id FROM crdbwork_items WHERE queue = $1`, queue)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ids := map[uuid.UUID]int{}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[id]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// Four runners (each with its Run loop, plus a goroutine calling Tick as
// fast as it can) race on two schedules of 300 ms (stretched with the
// machine's load) for at least 10 periods.
// Every item in the table is the item of one period, with that period's id,
// and no period has two; each item was reported enqueued by exactly one
// runner; almost every period between the first and the last has its item
// (a period is only missed if all four runners were late by a whole
// period).
func TestRacingRunnersEnqueueOneItemPerPeriod(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	// A period that a loaded machine's four runners do not all miss.
	every := await.Stretch(300 * time.Millisecond).Truncate(time.Millisecond)
	scheds := []schedule.Schedule{
		{Name: "catch-up", Every: every, Item: claim.NewItem{Payload: []byte("c")}},
		{Name: "skip", Every: every, Missed: schedule.Skip, Make: func(p time.Time) claim.NewItem {
			return claim.NewItem{Payload: []byte(p.Format(time.RFC3339Nano)), Key: "skip"}
		}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	reported := map[uuid.UUID]int{}
	var tickErrs atomic.Int64
	var wg sync.WaitGroup
	start := dbNow(t, pool) // before the runners: none enqueues a period before start's
	for range 4 {
		r := newRunner(t, pool, "periodic", schedule.Options{OnEnqueue: func(f schedule.Fired) {
			mu.Lock()
			reported[f.ID]++
			mu.Unlock()
		}}, scheds...)
		wg.Add(2)
		go func() { defer wg.Done(); _ = r.Run(ctx) }()
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := r.Tick(ctx); err != nil && ctx.Err() == nil {
					tickErrs.Add(1)
					t.Errorf("Tick: %v", err)
					return
				}
			}
		}()
	}
	waitDB(t, pool, start.Add(11*every))
	cancel()
	wg.Wait()

	ids := itemIDs(t, pool, "periodic")
	for _, s := range scheds {
		first, err := schedule.PeriodAt(s, start)
		if err != nil {
			t.Fatal(err)
		}
		present, total := 0, 0
		for p := first; p.Before(start.Add(10 * every)); p = p.Add(every) {
			total++
			id := schedule.ItemID("periodic", s.Name, p)
			switch ids[id] {
			case 0:
				t.Logf("%s: period %s has no item", s.Name, p.Format("15:04:05.000"))
			case 1:
				present++
				delete(ids, id)
			default:
				t.Fatalf("%s: period %s has %d items", s.Name, p, ids[id])
			}
			if reported[id] > 1 {
				t.Fatalf("%s: period %s reported enqueued by %d runners", s.Name, p, reported[id])
			}
		}
		if present < total*4/5 {
			t.Fatalf("%s: %d of %d periods have their item", s.Name, present, total)
		}
		t.Logf("%s: %d of %d periods have their item", s.Name, present, total)
	}
	// What is left: periods after the window (at most a few each), no other items.
	for id, n := range ids {
		if n != 1 {
			t.Fatalf("item %s %d times", id, n)
		}
		if reported[id] != 1 {
			t.Fatalf("item %s in the table, reported by %d runners", id, reported[id])
		}
	}
	if len(ids) > 2*3 {
		t.Fatalf("%d items after the window, want a few at most", len(ids))
	}
	mu.Lock()
	for id, n := range reported {
		if n != 1 {
			t.Fatalf("item %s reported by %d runners", id, n)
		}
	}
	mu.Unlock()
}

// A period's item that was acked (deleted) is not enqueued again by any
// runner: the schedule's row remembers the period.
func TestAckedPeriodIsNotEnqueuedAgain(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := schedule.Schedule{Name: "hourly", Every: time.Hour, Item: claim.NewItem{Payload: []byte("h")}}
	a := newRunner(t, pool, "", schedule.Options{}, s)
	fired, err := a.Tick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(fired) != 1 || !fired[0].New || fired[0].CatchUp {
		t.Fatalf("first tick fired %+v, want the current period's item", fired)
	}
	p, err := schedule.PeriodAt(s, dbNow(t, pool))
	if err != nil {
		t.Fatal(err)
	}
	if !fired[0].Period.Equal(p) || fired[0].ID != schedule.ItemID(claim.DefaultQueue, "hourly", p) {
		t.Fatalf("fired %+v, want period %s", fired[0], p)
	}
	// The item is handled and acked: gone from the items table.
	if tag, err := pool.Exec(ctx, `DELETE FROM crdbwork_items WHERE id = $1`, fired[0].ID); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("delete: %v, %v", tag, err)
	}
	for _, r := range []*schedule.Runner{a, newRunner(t, pool, "", schedule.Options{}, s)} {
		again, err := r.Tick(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(again) != 0 {
			t.Fatalf("the acked period was enqueued again: %+v", again)
		}
	}
	if n := len(itemIDs(t, pool, claim.DefaultQueue)); n != 0 {
		t.Fatalf("%d items, want 0", n)
	}
	var last time.Time
	if err := pool.QueryRow(ctx, `SELECT last_period FROM crdbwork_schedules WHERE queue = $1 AND name = 'hourly'`, claim.DefaultQueue).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if !last.Equal(p) {
		t.Fatalf("last_period %s, want %s", last, p)
	}
}

// Runners are stopped mid-period; while none runs, several periods pass.
// When a runner comes back, the catch-up schedule gets one item for the
// latest missed period and one for the current period; the skip schedule
// only the current period's. No other missed period gets an item.
func TestMissedPeriodsCatchUpOnceOrSkip(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	const every = time.Second
	scheds := []schedule.Schedule{
		{Name: "catch-up", Every: every, Item: claim.NewItem{Payload: []byte("c")}},
		{Name: "skip", Every: every, Missed: schedule.Skip, Item: claim.NewItem{Payload: []byte("s")}},
	}
	run := func(stopAfter func(fired []schedule.Fired) bool) []schedule.Fired {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var mu sync.Mutex
		var fired []schedule.Fired
		stopped := make(chan struct{})
		var once sync.Once
		var wg sync.WaitGroup
		for range 3 { // three runners, stopped together
			r := newRunner(t, pool, "m", schedule.Options{OnEnqueue: func(f schedule.Fired) {
				mu.Lock()
				defer mu.Unlock()
				fired = append(fired, f)
				if stopAfter(fired) {
					once.Do(func() { close(stopped) })
				}
			}}, scheds...)
			wg.Add(1)
			go func() { defer wg.Done(); _ = r.Run(ctx) }()
		}
		await.Recv(t, "the runners to enqueue the items awaited", stopped, await.Within(2*time.Minute))
		cancel()
		wg.Wait()
		return fired
	}
	// First life: until both schedules fired once. On a loaded machine it
	// may span a period boundary: each schedule's items of the first life
	// are those its runners reported (firstOf), from pmin to p0.
	first := run(func(f []schedule.Fired) bool {
		got := map[string]bool{}
		for _, x := range f {
			got[x.Schedule] = true
		}
		return got["catch-up"] && got["skip"]
	})
	firstOf := map[string]map[time.Time]bool{}
	var pmin, p0 time.Time
	for _, f := range first {
		if firstOf[f.Schedule] == nil {
			firstOf[f.Schedule] = map[time.Time]bool{}
		}
		firstOf[f.Schedule][f.Period] = true
		if f.Period.After(p0) {
			p0 = f.Period
		}
		if pmin.IsZero() || f.Period.Before(pmin) {
			pmin = f.Period
		}
	}
	// Down for at least three whole periods.
	waitDB(t, pool, p0.Add(4*every))
	// Second life: until both schedules fired for a period after the gap.
	second := run(func(f []schedule.Fired) bool {
		got := map[string]bool{}
		for _, x := range f {
			if !x.CatchUp {
				got[x.Schedule] = true
			}
		}
		return got["catch-up"] && got["skip"]
	})
	cur := map[string]time.Time{}
	for _, f := range second {
		if !f.CatchUp && (cur[f.Schedule].IsZero() || f.Period.Before(cur[f.Schedule])) {
			cur[f.Schedule] = f.Period
		}
	}
	ids := itemIDs(t, pool, "m")
	for _, s := range scheds {
		c := cur[s.Name]
		if c.Before(p0.Add(4 * every)) {
			t.Fatalf("%s: first period after the gap %s, want from %s", s.Name, c, p0.Add(4*every))
		}
		want := map[time.Time]bool{c: true}
		if s.Missed == schedule.CatchUp {
			want[c.Add(-every)] = true
		}
		for p := pmin.Add(-5 * every); !p.After(c); p = p.Add(every) {
			n := ids[schedule.ItemID("m", s.Name, p)]
			switch {
			case p.Before(pmin) && n != 0:
				t.Fatalf("%s: an item for %s, before the first life", s.Name, p)
			case firstOf[s.Name][p] || want[p]:
				if n != 1 {
					t.Fatalf("%s: period %s has %d items, want 1 (first life from %s to %s, back at %s)", s.Name, p, n, pmin, p0, c)
				}
			case !p.After(p0) && n != 0:
				t.Fatalf("%s: period %s of the first life has %d items its runners did not report (first life from %s to %s)", s.Name, p, n, pmin, p0)
			case p.After(p0) && n != 0:
				t.Fatalf("%s: missed period %s has %d items, want none (first life from %s to %s, back at %s)", s.Name, p, n, pmin, p0, c)
			}
		}
	}
	var catchUps []string
	for _, f := range second {
		if f.CatchUp {
			catchUps = append(catchUps, fmt.Sprint(f.Schedule, " ", f.Period.Format("15:04:05")))
		}
	}
	if len(catchUps) != 1 {
		t.Fatalf("catch-up items %v, want one, of the catch-up schedule", catchUps)
	}
	t.Logf("first life: %s to %s; back at %v; catch-up items: %v", pmin.Format("15:04:05"), p0.Format("15:04:05"), cur, catchUps)
}

// A runner on a pool of one connection works: nothing it does needs a
// second connection while its transaction holds the first. On a database
// without the schema it fails with a clear error.
func TestRunnerOnOneConnection(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t) // no schema: the runner must say so
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newRunner(t, pool, "", schedule.Options{}, schedule.Schedule{Name: "s", Every: time.Hour})
	if _, err := r.Tick(ctx); !errors.Is(err, crsql.ErrSchemaMissing) {
		t.Fatalf("Tick without the schema: %v, want ErrSchemaMissing", err)
	}
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	r = newRunner(t, pool, "", schedule.Options{}, schedule.Schedule{Name: "s", Every: time.Hour})
	fired, err := r.Tick(ctx)
	if err != nil || len(fired) != 1 {
		t.Fatalf("Tick on one connection: %v, %v", fired, err)
	}
}

// A schedule transaction whose COMMIT answer is lost returns an error
// wrapping ErrOutcomeUnknown; the next Tick finds the period recorded and
// enqueues nothing: the period has its one item. The same when the COMMIT
// is answered with CockroachDB's 40003, committed or not: the next Tick
// enqueues the period's item only if the first did not, and the period has
// one item in all (invariants 10 and 13).
func TestTickAfterUnknownOutcome(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		action    faultproxy.Action
		committed bool
	}{
		{"answer-lost", faultproxy.DropAnswer, true},
		{"40003-committed", faultproxy.AmbiguousForward, true},
		{"40003-rolled-back", faultproxy.AmbiguousDrop, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tickAfterUnknownOutcome(t, c.action, c.committed)
		})
	}
}

func tickAfterUnknownOutcome(t *testing.T, action faultproxy.Action, committed bool) {
	url := testschema.NewURL(t)
	direct, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	ctx := context.Background()
	testdb.Quiet(t, direct) // the proxy decides whether the COMMIT commits (no injected 40001)
	proxy, purl, err := faultproxy.ForURL(url)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	pool, err := pgxpool.New(ctx, purl)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := schedule.Schedule{Name: "s", Every: time.Hour, Item: claim.NewItem{Payload: []byte("x")}}
	r := newRunner(t, pool, "", schedule.Options{}, s)
	warm := newRunner(t, pool, "", schedule.Options{}, schedule.Schedule{Name: "warm-up", Every: time.Hour})
	if _, err := warm.Tick(ctx); err != nil {
		t.Fatal(err) // connections and the schema check before the fault
	}
	proxy.Arm(faultproxy.Rule{Match: faultproxy.IsCommit, Action: action})
	fired, err := r.Tick(ctx)
	if !errors.Is(err, claim.ErrOutcomeUnknown) || len(fired) != 0 {
		t.Fatalf("Tick whose COMMIT's outcome is unknown: %v, %v; want ErrOutcomeUnknown and nothing reported", fired, err)
	}
	again, err := r.Tick(ctx)
	want := map[bool]int{true: 0, false: 1}[committed]
	if err != nil || len(again) != want {
		t.Fatalf("Tick after the unknown outcome: %v, %v; want %d fired (the first one committed: %v)", again, err, want, committed)
	}
	p, _ := schedule.PeriodAt(s, dbNow(t, direct))
	if ids := itemIDs(t, direct, claim.DefaultQueue); ids[schedule.ItemID(claim.DefaultQueue, "s", p)] != 1 || len(ids) != 2 {
		t.Fatalf("items %v: want the period's item once, and the warm-up's", ids)
	}
}

// The database server restarts twice while three runners keep a 300 ms
// schedule: no period gets two items, and items come again after each
// restart.
func TestRunnersThroughDatabaseRestarts(t *testing.T) {
	t.Parallel() // on a server of its own
	srv, url := testdb.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	const every = 300 * time.Millisecond
	s := schedule.Schedule{Name: "s", Every: every, Item: claim.NewItem{Payload: []byte("x")}}
	// Read before the runners start: their first period is this one or a
	// later one (read after, a period boundary in between left the first
	// item before it).
	start := dbNow(t, pool)
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 3 {
		r := newRunner(t, pool, "r", schedule.Options{RetryDelay: 100 * time.Millisecond}, s)
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(rctx) }()
	}
	last := func() time.Time {
		var p time.Time
		_ = pool.QueryRow(ctx, `SELECT last_period FROM crdbwork_schedules WHERE queue = 'r' AND name = 's'`).Scan(&p)
		return p
	}
	waitNext := func(what string) {
		t.Helper()
		from := last()
		await.Until(t, what+": a new period recorded", func() (bool, string) {
			p := last()
			return p.After(from.Add(every)), "last period " + p.Format("15:04:05.000")
		}, await.Within(2*time.Minute))
	}
	waitNext("before the restarts")
	for i := range 2 {
		if err := srv.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		waitNext(fmt.Sprint("after restart ", i+1))
	}
	stop()
	wg.Wait()
	ids := itemIDs(t, pool, "r")
	matched := 0
	for p, _ := schedule.PeriodAt(s, start); !p.After(last()); p = p.Add(every) {
		n := ids[schedule.ItemID("r", "s", p)]
		if n > 1 {
			t.Fatalf("period %s has %d items", p, n)
		}
		matched += n
	}
	if matched != len(ids) {
		t.Fatalf("%d items, %d of them for the periods of the run", len(ids), matched)
	}
	t.Logf("%d periods had their item through two restarts", matched)
}
