package fleet_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/fleet"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// A queue stays known once it is drained: "reports" whose items were all
// acked (its ended ids remain for its dedup window), "nightly" known only
// by a schedule's mark, "waits" only by a waiting item; each is listed by
// the snapshot and by claim.Queues, with its last activity (before, all
// three disappeared: "no such queue").
func TestDrainedQueuesStayKnown(t *testing.T) {
	t.Parallel()
	pool := testschema.New(t)
	ctx := context.Background()
	reports, err := claim.New(pool, claim.Options{Queue: "reports"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reports.Enqueue(ctx, claim.NewItem{Payload: []byte("r1")}, claim.NewItem{Payload: []byte("r2")}); err != nil {
		t.Fatal(err)
	}
	sess, err := session.Start(ctx, pool, session.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(context.Background())
	items, err := reports.Claimer(sess.ID()).Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil || len(items) != 2 {
		t.Fatalf("claiming the reports: %d, %v", len(items), err)
	}
	for _, it := range items {
		if err := reports.Ack(ctx, it, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_schedules (queue, name, last_period, updated_at) VALUES ('nightly', 'backup', now(), now() - INTERVAL '3 hours')`); err != nil {
		t.Fatal(err)
	}
	waits, err := claim.New(pool, claim.Options{Queue: "waits"})
	if err != nil {
		t.Fatal(err)
	}
	pre, err := waits.Enqueue(ctx, claim.NewItem{Payload: []byte("p")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := waits.Enqueue(ctx, claim.NewItem{Payload: []byte("d"), After: pre.IDs}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = 'waits'`); err != nil { // only the waiting one stays
		t.Fatal(err)
	}

	names, err := claim.Queues(ctx, pool, crsql.Tables{})
	if err != nil || !slices.Equal(names, []string{"nightly", "reports", "waits"}) {
		t.Fatalf("claim.Queues = %v, %v; want nightly, reports, waits", names, err)
	}
	r, err := fleet.New(pool, crsql.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := r.Snapshot(ctx, fleet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]fleet.Queue{}
	for _, q := range snap.Queues {
		got[q.Name] = q
	}
	if len(got) != 3 {
		t.Fatalf("the snapshot lists %d queues, want 3: %+v", len(got), snap.Queues)
	}
	rq := got["reports"]
	if !rq.Known() || rq.HasItems() || rq.LastEnded == nil || rq.LastActivity() == nil || rq.Now.Sub(*rq.LastActivity()) > time.Hour {
		t.Errorf("reports, drained: known %v, last ended %v, last activity %v (now %v)", rq.Known(), rq.LastEnded, rq.LastActivity(), rq.Now)
	}
	nq := got["nightly"]
	if !nq.Known() || nq.Schedules != 1 || nq.LastActivity() == nil || nq.Now.Sub(*nq.LastActivity()) < 3*time.Hour {
		t.Errorf("nightly, a schedule only: known %v, %d schedules, last activity %v (now %v)", nq.Known(), nq.Schedules, nq.LastActivity(), nq.Now)
	}
	if wq := got["waits"]; !wq.Known() || wq.Waiting != 1 {
		t.Errorf("waits, a waiting item only: known %v, waiting %d", wq.Known(), wq.Waiting)
	}
	one, err := r.Snapshot(ctx, fleet.Options{Queue: "reports"})
	if err != nil || len(one.Queues) != 1 || !one.Queues[0].Known() {
		t.Errorf("the snapshot of reports alone: %+v, %v", one, err)
	}
}
