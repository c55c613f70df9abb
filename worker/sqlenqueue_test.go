package worker_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/worker"
)

// Items enqueued by the real psql binary through the SQL function
// crdbwork_enqueue, in one transaction with keys, are each run once by a
// worker in parts mode, their results recorded by its acks, in the order
// of their key within each part.
func TestWorkerRunsItemsEnqueuedFromPsql(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("no psql binary")
	}
	pool := setup(t)
	ctx := context.Background()
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	cfg := pool.Config().ConnConfig
	conn := fmt.Sprintf("host=%s port=%d user=%s dbname=%s", cfg.Host, cfg.Port, cfg.User, db)
	if cfg.Password != "" {
		conn += " password=" + cfg.Password
	}
	// The script's transaction is committed once, not retried (on
	// CockroachDB its caller must retry it).
	testdb.Quiet(t, pool)
	const n = 24
	var script strings.Builder
	script.WriteString("BEGIN;\n")
	for i := range n {
		fmt.Fprintf(&script, "SELECT added FROM crdbwork_enqueue(%s);\n",
			testdb.EnqueueArgs("'psql'", fmt.Sprintf("convert_to('%d', 'UTF8')", i), "key", fmt.Sprintf("'k%d'", i%3), "priority", fmt.Sprint(i)))
	}
	script.WriteString("COMMIT;\n")
	cmd := exec.Command(bin, "-X", "-v", "ON_ERROR_STOP=1", "-At", "-d", conn)
	cmd.Stdin = strings.NewReader(script.String())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	if got := strings.Count(string(out), "t\n"); got != n {
		t.Fatalf("psql added %d items, want %d:\n%s", got, n, out)
	}

	q, err := claim.New(pool, claim.Options{Queue: "psql"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	order := map[string][]int{}
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO results (item_id, session_id, part, owned) VALUES ($1, $2, $3, true)`, it.ID, it.Session, it.Part)
			if err == nil {
				mu.Lock()
				var p int
				fmt.Sscan(string(it.Payload), &p)
				order[it.Key] = append(order[it.Key], p)
				mu.Unlock()
			}
			return err
		}, nil
	}
	w, err := worker.New(q, handle, worker.Options{Parts: 4, Concurrency: 1, Poll: 20 * time.Millisecond, Session: fastSession()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	waitFor(t, "every psql item acked", 30*time.Second, func() bool { return count(t, pool, `SELECT count(*) FROM results`) >= n })
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if r, d := count(t, pool, `SELECT count(DISTINCT item_id) FROM results`), count(t, pool, `SELECT count(*) FROM results`); r != n || d != n {
		t.Fatalf("%d results of %d items, want %d once each", d, r, n)
	}
	if left := count(t, pool, `SELECT count(*) FROM crdbwork_items`); left != 0 {
		t.Fatalf("%d items left", left)
	}
	mu.Lock()
	defer mu.Unlock()
	for k, ps := range order {
		for i := 1; i < len(ps); i++ {
			if ps[i] < ps[i-1] {
				t.Errorf("key %s ran out of priority order: %v", k, ps)
			}
		}
	}
}
