package main

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// crdbwork requeue refuses a dead id that is a waiting item (enqueued again
// with prerequisites, in its queue or in another), one id or by --all,
// says so, and keeps both the dead copy and the waiting item; the other
// dead ids are requeued.
func TestRequeueRefusesAWaitingID(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	dead := d.kill(t, "emails", 3)
	same, elsewhere := dead[0], dead[1]
	d.kill(t, "reports", 2)
	emails, reports := d.queue(t, "emails", crsql.Tables{}), d.queue(t, "reports", crsql.Tables{})
	p, pr := uuid.New(), uuid.New()
	if _, err := emails.Enqueue(ctx, claim.NewItem{ID: p, Payload: []byte("p")},
		claim.NewItem{ID: same, Payload: []byte("again"), After: []uuid.UUID{p}}); err != nil {
		t.Fatal(err)
	}
	if _, err := reports.Enqueue(ctx, claim.NewItem{ID: pr, Payload: []byte("p")},
		claim.NewItem{ID: elsewhere, Payload: []byte("again"), After: []uuid.UUID{pr}}); err != nil {
		t.Fatal(err)
	}
	want(t, d.env, 1, []string{"waiting item of queue \"emails\"", "the dead item stays"}, "requeue", "--queue", "emails", same.String())
	want(t, d.env, 1, []string{"waiting item of queue \"reports\""}, "requeue", "--queue", "emails", elsewhere.String())
	m := jsonOf(t, must(t, d.env, "requeue", "--queue", "emails", "--all", "--yes", "--json"))
	if m["requeued"] != float64(1) || m["live"] != float64(2) {
		t.Errorf("requeue --all: %v, want 1 requeued and 2 live", m)
	}
	if n := d.count(t, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'emails' AND id = ANY($1)`, []uuid.UUID{same, elsewhere}); n != 2 {
		t.Errorf("%d dead copies of the waiting ids left, want 2", n)
	}
	if n := d.count(t, `SELECT count(*) FROM crdbwork_waiting WHERE id = ANY($1)`, []uuid.UUID{same, elsewhere}); n != 2 {
		t.Errorf("%d of the 2 waiting items left", n)
	}
	if n := d.count(t, `SELECT count(*) FROM crdbwork_items WHERE id = ANY($1)`, []uuid.UUID{same, elsewhere}); n != 0 {
		t.Errorf("%d of the waiting ids are in the items table", n)
	}
	if n := d.count(t, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'reports'`); n != 2 {
		t.Errorf("%d dead items left in reports, want its 2", n)
	}
}
