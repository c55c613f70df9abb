package claim_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// TestRefreshStatisticsAnalyzesABacklogNeverAnalyzed enqueues a backlog
// into tables PostgreSQL never analyzed (autovacuum off, so that nothing
// else does): a few items leave them alone, 20,000 get the items table
// analyzed once, and the check then finds nothing to do. Two queues share
// the tables. On CockroachDB RefreshStatistics does nothing.
func TestRefreshStatisticsAnalyzesABacklogNeverAnalyzed(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	postgres := testdb.Kind(t) == "postgres"
	if postgres {
		for _, table := range []string{"crdbwork_items", "crdbwork_ended"} {
			if _, err := pool.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`); err != nil {
				t.Fatal(err)
			}
		}
	}
	a, b := newQueue(t, pool, claim.Options{Queue: "a"}), newQueue(t, pool, claim.Options{Queue: "b"})
	analyzed := func() bool {
		if !postgres {
			return false
		}
		var done bool
		if err := pool.QueryRow(ctx, `SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'crdbwork_items'`).Scan(&done); err != nil {
			t.Fatal(err)
		}
		return done
	}
	if _, err := a.Enqueue(ctx, payloads(100)...); err != nil {
		t.Fatal(err)
	}
	if done, err := queuemaint.For(b).RefreshStatistics(ctx); err != nil || len(done) != 0 || analyzed() {
		t.Fatalf("100 items: RefreshStatistics = %q, %v (analyzed: %v); want nothing done", done, err, analyzed())
	}
	for range 2 {
		if _, err := a.Enqueue(ctx, payloads(10000)...); err != nil {
			t.Fatal(err)
		}
	}
	if !postgres {
		if done, err := queuemaint.For(b).RefreshStatistics(ctx); err != nil || len(done) != 0 {
			t.Fatalf("CockroachDB: RefreshStatistics = %q, %v; want nothing done", done, err)
		}
		return
	}
	// A role that may use the tables but does not own them leaves them to
	// autovacuum (PostgreSQL would skip them with a warning).
	notOwner := newQueue(t, otherRole(t, pool), claim.Options{Queue: "a"})
	if done, err := queuemaint.For(notOwner).RefreshStatistics(ctx); err != nil || len(done) != 0 || analyzed() {
		t.Fatalf("a role that does not own the tables: RefreshStatistics = %q, %v (analyzed: %v); want nothing done", done, err, analyzed())
	}
	done, err := queuemaint.For(b).RefreshStatistics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{`"crdbwork_items"`}; !slices.Equal(done, want) || !analyzed() {
		t.Fatalf("20,100 items never analyzed: RefreshStatistics = %q (analyzed: %v), want %q", done, analyzed(), want)
	}
	var believed float64
	if err := pool.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE relname = 'crdbwork_items'`).Scan(&believed); err != nil {
		t.Fatal(err)
	}
	if believed < 15000 {
		t.Fatalf("after the ANALYZE PostgreSQL believes the items table holds %.0f rows, want about 20,100", believed)
	}
	if done, err := queuemaint.For(a).RefreshStatistics(ctx); err != nil || len(done) != 0 {
		t.Fatalf("once analyzed: RefreshStatistics = %q, %v; want nothing done", done, err)
	}
}

// otherRole returns a pool of a new PostgreSQL role that may read and
// change crdbwork's tables but owns none of them.
func otherRole(t *testing.T, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	for _, stmt := range []string{
		`CREATE ROLE crdbwork_user LOGIN`,
		`GRANT USAGE ON SCHEMA public TO crdbwork_user`,
		`GRANT ALL ON ALL TABLES IN SCHEMA public TO crdbwork_user`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	cfg := pool.Config().Copy()
	cfg.ConnConfig.User = "crdbwork_user"
	other, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	return other
}
