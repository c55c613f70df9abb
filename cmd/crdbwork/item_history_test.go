package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// crdbwork item shows each attempt: an item that failed, failed with a
// panic's stack trace (its lines kept, its machine paths as they are) and
// succeeded shows three attempts with their outcomes, sessions and
// errors, in text and in --json; an ended record of code older than schema
// version 6 says "no history recorded".
func TestItemShowsItsHistory(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	q, err := claim.New(d.pool, claim.Options{Queue: "invoices", BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s, err := session.Start(ctx, d.pool, session.Options{Name: "history"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte(`{"invoice":1042}`)})
	if err != nil {
		t.Fatal(err)
	}
	id := res.IDs[0]
	stack := "handler panic: assignment to entry in nil map\ngoroutine 71 [running]:\nmain.render(...)\n\t/srv/app/invoice.go:42 +0x1d"
	for _, cause := range []error{errors.New("the billing service refused: 503"), errors.New(stack), nil} {
		var it claim.Item
		await.Until(t, "the item to be due", func() bool {
			items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(items) == 1 {
				it = items[0]
			}
			return len(items) == 1
		})
		if cause == nil {
			err = q.Ack(ctx, it, nil)
		} else {
			_, err = q.Nack(ctx, it, cause)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	r := must(t, d.env, "item", id.String())
	for _, s := range []string{
		"history: 3 attempts", "#1   failed", "#2   failed", "#3   succeeded", "session " + s.ID().String(),
		"       | the billing service refused: 503",
		"       | goroutine 71 [running]:", "       | \t/srv/app/invoice.go:42 +0x1d",
	} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("item does not say %q:\n%s", s, r.stdout)
		}
	}
	j := jsonOf(t, must(t, d.env, "item", "--json", id.String()))
	h, _ := j["history"].([]any)
	if len(h) != 3 || j["history_recorded"] != true {
		t.Fatalf("item --json: history %v", j["history"])
	}
	for i, want := range []string{"failed", "failed", "succeeded"} {
		a := h[i].(map[string]any)
		if a["outcome"] != want || a["number"] != float64(i+1) || a["session"] != s.ID().String() || a["started_at"] == nil || a["ended_at"] == nil {
			t.Errorf("item --json attempt %d: %v; want %s", i+1, a, want)
		}
	}
	if e := h[1].(map[string]any)["error"]; e != stack {
		t.Errorf("item --json attempt 2's error: %q", e)
	}

	old := uuid.New()
	if _, err := d.pool.Exec(ctx, `INSERT INTO crdbwork_ended (queue, id, outcome) VALUES ('invoices', $1, 'acked')`, old); err != nil {
		t.Fatal(err)
	}
	if r := must(t, d.env, "item", old.String()); !strings.Contains(r.stdout, "history: no history recorded") {
		t.Errorf("an old ended record:\n%s", r.stdout)
	}
}
