package metrics_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/metrics"
	"github.com/crdbwork/crdbwork/session"
)

// TestCheckpointAndRetentionCounters checks the counters of checkpoints,
// progress reports and dead items pruned under retention, for a queue
// added with AddQueue.
func TestCheckpointAndRetentionCounters(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{Queue: "cq"})
	if err != nil {
		t.Fatal(err)
	}
	c := metrics.New(metrics.Options{})
	c.AddQueue(q)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	s, err := session.Start(ctx, pool, session.Options{Tuning: session.Tuning{Heartbeat: 500 * time.Millisecond, Expiry: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %d, %v", len(got), err)
	}
	for i := range 3 {
		if err := q.SaveCheckpoint(ctx, got[0], []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.ReportProgress(ctx, got[0], claim.Progress{Done: 1, Total: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at)
		SELECT gen_random_uuid(), 'cq', 0, 0, 1, 1, '\x00'::BYTEA, now() - INTERVAL '50 days', now() - INTERVAL '40 days' FROM generate_series(1, 5)`); err != nil {
		t.Fatal(err)
	}
	if _, err := queuemaint.For(q).PruneDead(ctx); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, srv.URL)
	for name, want := range map[string]float64{
		"crdbwork_checkpoints_saved_total": 3,
		"crdbwork_progress_reports_total":  1,
		"crdbwork_dead_items_pruned_total": 5,
	} {
		if v := mustValue(t, fams, name, map[string]string{"queue": "cq"}); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
}
