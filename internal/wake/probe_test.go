package wake

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The tests of this package share the process's probers, idle counts and
// engines (package variables): they do not run in parallel.

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	await.Until(t, what, cond)
}

// awaitSignal waits for a wake-up of sub and returns its hints.
func awaitSignal(t *testing.T, sub *Sub, what string) (hashes []int64, ok bool) {
	t.Helper()
	await.Recv(t, "a wake-up: "+what, sub.C())
	return sub.Hints()
}

// The probe announces each claimable item once, naming its part, and only
// while the channel has an idle worker; when its connection stalls it
// stops counting as answering within probeTimeout and wakes the channel
// (so that workers go back to their poll), and after the stall it answers
// again and announces new items.
func TestProbeAnnouncesItemsAndSurvivesAStall(t *testing.T) {
	ctx := context.Background()
	direct, p, proxied := proxiedDB(t)
	st := store.New(crsql.Tables{})
	ch := st.NotifyChannel("q")
	sub := Subscribe(ch)
	defer sub.Close()
	// Counts the probe's statements (Pass forwards them untouched).
	p.Arm(faultproxy.Rule{Match: faultproxy.Contains(`SELECT id, part FROM "crdbwork_items"`), Action: faultproxy.Pass, Times: 1 << 30})
	stop, ok := Probe(proxied, ch, ProbeSpec{Store: st, Queue: "q", Every: 10 * time.Millisecond, Again: time.Hour}, nil)
	if !ok {
		t.Fatal("Probe refused a pool")
	}
	defer stop()
	if Probing(ch) || p.Fired() != 0 {
		t.Fatalf("probing (%v, %d statements) before any worker idles", Probing(ch), p.Fired())
	}
	idled := Idle(ch)
	defer idled()
	waitUntil(t, "the probe to answer", func() bool { return Probing(ch) })
	select {
	case <-sub.C():
		t.Fatal("a wake-up for an empty queue")
	default:
	}
	enqueue := func(hash int64) int64 {
		t.Helper()
		id := uuid.New()
		if _, err := st.ItemsEnqueue(ctx, direct, store.Postgres, "q", []store.EnqueueRow{{ID: id, Hash: hash, MaxAttempts: 3, Payload: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		var part int64
		if err := direct.QueryRow(ctx, `SELECT part FROM crdbwork_items WHERE id = $1`, id).Scan(&part); err != nil {
			t.Fatal(err)
		}
		return part
	}
	part := enqueue(5)
	if hs, ok := awaitSignal(t, sub, "the first item"); !ok || !slices.Equal(hs, []int64{part}) {
		t.Fatalf("hints %v (%v), want the item's part %d", hs, ok, part)
	}
	// The item stays (nobody claims it): five more probes find it and do
	// not announce it again (Again is an hour).
	n := p.Fired()
	waitUntil(t, "five more probes", func() bool { return p.Fired() >= n+5 })
	select {
	case <-sub.C():
		hs, _ := sub.Hints()
		t.Fatalf("the same item announced again (hints %v)", hs)
	default:
	}
	// A stalled connection: the probe gives up within probeTimeout, wakes
	// the channel once for any part, and no longer counts as answering.
	p.Stall()
	began := time.Now()
	if _, ok := awaitSignal(t, sub, "the stalled probe"); ok {
		t.Error("the stalled probe's wake-up names parts, want any part")
	}
	if Probing(ch) {
		t.Error("the probe counts as answering after its wake-up for a stall")
	}
	if d := time.Since(began); d > probeTimeout+5*time.Second {
		t.Errorf("the stall was noticed after %v (probeTimeout %v)", d, probeTimeout)
	}
	p.Restore()
	waitUntil(t, "the probe to answer again", func() bool { return Probing(ch) })
	// Found again on the new connection: announced once more, with the new one.
	second := enqueue(6)
	waitUntil(t, "an announcement of the new item", func() bool {
		select {
		case <-sub.C():
			hs, ok := sub.Hints()
			return ok && slices.Contains(hs, second)
		default:
			return false
		}
	})
	// Without idle workers, no probe runs: the count of probe statements
	// stops growing (with one idle worker it grows every 10 ms).
	idled()
	waitUntil(t, "five intervals without a probe", func() bool {
		n = p.Fired()
		time.Sleep(50 * time.Millisecond)
		return p.Fired() == n
	})
	// A second user of the channel with a short Again (the shortest
	// applies): the items, still claimable, are announced again, and again.
	stop2, _ := Probe(proxied, ch, ProbeSpec{Store: st, Queue: "q", Every: 10 * time.Millisecond, Again: 50 * time.Millisecond}, nil)
	defer stop2()
	idledAgain := Idle(ch)
	defer idledAgain()
	for i := range 2 {
		if hs, ok := awaitSignal(t, sub, "a re-announcement"); !ok || !slices.Contains(hs, part) || !slices.Contains(hs, second) {
			t.Fatalf("re-announcement %d: hints %v (%v), want parts %d and %d", i, hs, ok, part, second)
		}
	}
}

// With CockroachOnly (worker.WakeAuto), the prober does not connect until
// the engine is known to be CockroachDB (the listener's first connection
// finds it: simulated here by recording it as the listener does). Then it
// connects, finds the engine itself (PostgreSQL here: the record was
// wrong) and probes nothing.
func TestProbeCockroachOnlyWaitsForTheEngine(t *testing.T) {
	_, p, proxied := proxiedDB(t)
	// Counts every statement on the proxy: the prober's would be the only ones.
	p.Arm(faultproxy.Rule{Match: func(string) bool { return true }, Action: faultproxy.Pass, Times: 1 << 30})
	st := store.New(crsql.Tables{})
	ch := st.NotifyChannel("q")
	stop, _ := Probe(proxied, ch, ProbeSpec{Store: st, Queue: "q", Every: 10 * time.Millisecond, Again: time.Hour, CockroachOnly: true}, nil)
	defer stop()
	idled := Idle(ch)
	defer idled()
	key := dbKey(connConfig(proxied))
	t.Cleanup(func() { dialects.Delete(key) })
	// Recorded as PostgreSQL: still nothing.
	dialects.Store(key, store.Postgres)
	kickProbers()
	waitUntil(t, "five intervals", func() bool {
		time.Sleep(50 * time.Millisecond)
		return true
	})
	if n := p.Fired(); n != 0 || Probing(ch) {
		t.Fatalf("%d statements (probing %v) before the engine was known to be CockroachDB", n, Probing(ch))
	}
	dialects.Store(key, store.Cockroach)
	kickProbers()
	waitUntil(t, "the prober to connect and find PostgreSQL", func() bool {
		d, _ := dialects.Load(key)
		return p.Fired() > 0 && d == store.Postgres
	})
	if Probing(ch) {
		t.Error("a CockroachOnly channel probed on PostgreSQL")
	}
}

// proxiedDB starts a database with crdbwork's schema and returns a pool
// straight to it, the fault proxy in front of it and a pool through the
// proxy, all closed when the test ends.
func proxiedDB(t *testing.T) (direct *pgxpool.Pool, p *faultproxy.Proxy, proxied *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	url := testdb.NewURL(t)
	direct, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	if err := crsql.Apply(ctx, direct, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	p, pu, err := faultproxy.ForURL(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	proxied, err = pgxpool.New(ctx, pu)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	return direct, p, proxied
}
