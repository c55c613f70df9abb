package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// crdbwork sequence shows and sets a queue's sequencing, in text and JSON,
// refuses an unknown queue and a bad argument, and says when sequenced
// items are left after "off"; the library sees what it set.
func TestSequence(t *testing.T) {
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	d.enqueue(t, "orders", 1)
	q := d.queue(t, "orders", crsql.Tables{})
	if r := must(t, d.env, "sequence", "--queue", "orders"); !strings.Contains(r.stdout, `"orders" is not sequenced`) {
		t.Errorf("sequence:\n%s", r)
	}
	m := jsonOf(t, must(t, d.env, "sequence", "on", "--queue", "orders", "--json"))
	if m["sequenced"] != true || m["was_sequenced"] != false || m["sequenced_items"] != false {
		t.Errorf("sequence on: %v", m)
	}
	if info, err := q.Sequencing(ctx); err != nil || !info.On {
		t.Errorf("after sequence on: %+v, %v", info, err)
	}
	if r := must(t, d.env, "sequence", "on", "--queue", "orders"); !strings.Contains(r.stdout, "already sequenced") {
		t.Errorf("sequence on again:\n%s", r)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Key: "k", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	// status shows the sequencing, in text and JSON.
	if r := must(t, d.env, "status", "--queue", "orders"); !strings.Contains(r.stdout, "sequenced true") {
		t.Errorf("status of a sequenced queue:\n%s", r)
	}
	if st := jsonOf(t, must(t, d.env, "status", "--queue", "orders", "--json")); st["settings"].(map[string]any)["sequenced"] != true ||
		st["settings"].(map[string]any)["sequenced_items"] != true {
		t.Errorf("status --json of a sequenced queue: settings %v", st["settings"])
	}
	if r := must(t, d.env, "status"); !regexp.MustCompile(`(?m)^orders .*sequenced$`).MatchString(r.stdout) {
		t.Errorf("status of every queue does not mark orders sequenced:\n%s", r)
	}
	r := must(t, d.env, "sequence", "off", "--queue", "orders")
	if !strings.Contains(r.stdout, "is now not sequenced") || !strings.Contains(r.stdout, "still holds sequenced items") {
		t.Errorf("sequence off with a sequenced item left:\n%s", r)
	}
	if info, err := q.Sequencing(ctx); err != nil || info.On || !info.Items {
		t.Errorf("after sequence off: %+v, %v", info, err)
	}
	r = must(t, d.env, "status", "--queue", "orders")
	if strings.Contains(r.stdout, "sequenced true") || !strings.Contains(r.stdout, "sequenced items remain") {
		t.Errorf("status after sequence off, with a sequenced item left:\n%s", r)
	}
	if st := jsonOf(t, must(t, d.env, "status", "--queue", "orders", "--json")); st["settings"].(map[string]any)["sequenced"] != false ||
		st["settings"].(map[string]any)["sequenced_items"] != true {
		t.Errorf("status --json after sequence off: settings %v", st["settings"])
	}
	want(t, d.env, 2, []string{"say on or off"}, "sequence", "maybe", "--queue", "orders")
	want(t, d.env, 2, []string{`unknown queue "ordrs"`, `did you mean "orders"?`}, "sequence", "on", "--queue", "ordrs")
	if n := d.count(t, `SELECT count(*) FROM crdbwork_queues WHERE name = 'ordrs'`); n != 0 {
		t.Errorf("sequence on an unknown queue stored a row")
	}
	m = jsonOf(t, must(t, d.env, "sequence", "on", "--queue", "fresh", "--create", "--json"))
	if m["sequenced"] != true {
		t.Errorf("sequence on --create: %v", m)
	}
}
