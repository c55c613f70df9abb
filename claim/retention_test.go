package claim_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
)

// seedDead inserts n deaths of queue, the i-th (from 1) dead for
// ago + i seconds.
func seedDead(t *testing.T, pool *pgxpool.Pool, queue string, n int, ago time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason)
		SELECT gen_random_uuid(), $1, 0, 0, 1, 1, '\x00'::BYTEA, now() - $2::BIGINT * INTERVAL '1 microsecond' - INTERVAL '1 hour',
		       now() - $2::BIGINT * INTERVAL '1 microsecond' - g * INTERVAL '1 second', 'failed'
		FROM generate_series(1, $3::INT) AS g`, queue, ago.Microseconds(), n)
	if err != nil {
		t.Fatal(err)
	}
}

// TestRetentionPrunesByAgeAndCount seeds dead items in three queues of one
// database and checks that PruneDead deletes, in bounded batches, those
// older than the queue's age bound and the oldest beyond its count bound,
// keeping the newest; that a queue whose bounds are off, and the other
// queues, are untouched; that a queue never set keeps the default
// retention; and that once a queue is within its count, a prune with
// nothing to delete makes no exact check of the count (it counts the
// deaths since its last one), until a new death passes the bound.
func TestRetentionPrunesByAgeAndCount(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	defer claim.SetDeadCountCheckEvery(0)()
	a := newQueue(t, pool, claim.Options{Queue: "a"})
	b := newQueue(t, pool, claim.Options{Queue: "b"})
	c := newQueue(t, pool, claim.Options{Queue: "c"})
	// a: 50 deaths 40 days old, 10,000 recent ones; bounds 7 days, 1,000.
	seedDead(t, pool, "a", 50, 40*24*time.Hour)
	seedDead(t, pool, "a", 10000, 0)
	// b: the same, its bounds off.
	seedDead(t, pool, "b", 50, 40*24*time.Hour)
	seedDead(t, pool, "b", 10000, 0)
	// c: never set (30 days, 100,000): 20 old deaths, 300 recent.
	seedDead(t, pool, "c", 20, 40*24*time.Hour)
	seedDead(t, pool, "c", 300, 0)

	if r, err := readRetention(a.Settings(ctx)); err != nil || r != (claim.Retention{DeadMaxAge: claim.DefaultDeadMaxAge, DeadMaxCount: claim.DefaultDeadMaxCount, HistoryWindow: claim.DefaultHistoryWindow}) {
		t.Fatalf("Retention of a queue never set = %+v, %v; want the defaults", r, err)
	}
	if err := a.UpdateSettings(ctx, claim.SettingsUpdate{Retention: &claim.Retention{DeadMaxAge: 7 * 24 * time.Hour, DeadMaxCount: 1000}}); err != nil {
		t.Fatal(err)
	}
	if err := b.UpdateSettings(ctx, claim.SettingsUpdate{Retention: &claim.Retention{NoDeadMaxAge: true, NoDeadMaxCount: true}}); err != nil {
		t.Fatal(err)
	}
	if r, err := readRetention(a.Settings(ctx)); err != nil || r != (claim.Retention{DeadMaxAge: 7 * 24 * time.Hour, DeadMaxCount: 1000, HistoryWindow: claim.DefaultHistoryWindow}) {
		t.Fatalf("Retention = %+v, %v", r, err)
	}
	if r, err := readRetention(b.Settings(ctx)); err != nil || r != (claim.Retention{NoDeadMaxAge: true, NoDeadMaxCount: true, HistoryWindow: claim.DefaultHistoryWindow}) {
		t.Fatalf("Retention = %+v, %v", r, err)
	}
	for _, bad := range []claim.Retention{{DeadMaxAge: -time.Hour}, {DeadMaxCount: -1}, {DeadMaxAge: time.Millisecond},
		{NoDeadMaxAge: true, DeadMaxAge: time.Hour}, {NoDeadMaxCount: true, DeadMaxCount: 5}} {
		if err := a.UpdateSettings(ctx, claim.SettingsUpdate{Retention: &bad}); err == nil {
			t.Errorf("SetRetention(%+v) accepted", bad)
		}
	}

	deaths := func(queue string) int {
		return count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1`, queue)
	}
	// The death time of the 1,000th newest of a, as the database stamped
	// it: the count bound keeps it and the newer ones. (Counting the deaths
	// of the last 1,001 seconds by the clock of the check failed whenever
	// the prunes took more than the one second between the seeded deaths.)
	var keepFrom time.Time
	if err := pool.QueryRow(ctx, `SELECT died_at FROM crdbwork_dead_items WHERE queue = 'a'
		ORDER BY died_at DESC LIMIT 1 OFFSET 999`).Scan(&keepFrom); err != nil {
		t.Fatal(err)
	}
	// The first prune: the 50 old deaths (one batch), then 8 batches of
	// the 9,000 beyond the count, the most one call deletes for a bound.
	n, err := queuemaint.For(a).PruneDead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 50+8000 || deaths("a") != 10050-n {
		t.Fatalf("first PruneDead deleted %d (%d left), want 8,050: the old ones and 8 batches of 1,000", n, deaths("a"))
	}
	// The next reap deletes the rest.
	st, err := queuemaint.For(a).Reap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.DeadPruned != 1000 || deaths("a") != 1000 {
		t.Fatalf("Reap pruned %d dead items (%d left), want 1,000 (1,000 left)", st.DeadPruned, deaths("a"))
	}
	// The newest 1,000 are kept.
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'a' AND died_at >= $1`, keepFrom); n != 1000 {
		t.Fatalf("%d of the newest 1,000 deaths kept", n)
	}
	if got := a.Stats().DeadPruned; got != 9050 {
		t.Fatalf("Stats.DeadPruned = %d, want 9,050", got)
	}

	// Within the bound: nothing to delete, and no exact check of the count.
	checks := a.DeadCountChecks()
	for range 3 {
		if n, err := queuemaint.For(a).PruneDead(ctx); err != nil || n != 0 {
			t.Fatalf("PruneDead within the bounds = %d, %v", n, err)
		}
	}
	if got := a.DeadCountChecks(); got != checks {
		t.Fatalf("%d exact checks of the count while the queue stayed within it, want none", got-checks)
	}
	// A new death passes the bound: the oldest goes.
	seedDead(t, pool, "a", 1, -time.Second) // died a moment from now, the newest
	if n, err := queuemaint.For(a).PruneDead(ctx); err != nil || n != 1 || deaths("a") != 1000 {
		t.Fatalf("PruneDead after one more death = %d, %v (%d left), want 1 (1,000 left)", n, err, deaths("a"))
	}

	// b's bounds are off; c keeps the default: only its 40-day-old deaths go.
	for _, q := range []*claim.Queue{b, c} {
		if _, err := queuemaint.For(q).PruneDead(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if deaths("b") != 10050 {
		t.Fatalf("b, with its bounds off, has %d dead items, want 10,050", deaths("b"))
	}
	if deaths("c") != 300 {
		t.Fatalf("c, never set, has %d dead items, want 300 (the 20 older than 30 days pruned)", deaths("c"))
	}
	info, err := a.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Retention.DeadMaxCount != 1000 || info.Dead != 1000 {
		t.Fatalf("Inspect: retention %+v, %d dead", info.Retention, info.Dead)
	}
}
