package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// crdbwork status shows a queue's items by kind: unclaimed, due, the
// oldest due, claimed and dead for each kind, the most unclaimed first,
// "(none)" for the items without a kind; with --queue when the queue has
// more than one kind (not for a queue of one kind, unless --by-kind), for
// every queue with --by-kind; --json has them as "kinds".
func TestStatusShowsItemsByKind(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	shop := d.queue(t, "shop", crsql.Tables{})
	var items []claim.NewItem
	for i := range 9 {
		it := claim.NewItem{Kind: []string{"email", "email", "email", "email", "email", "sms", "sms", "", "report"}[i], Payload: []byte(fmt.Sprint(i))}
		if i == 4 {
			it.Delay = time.Hour // an email not yet due
		}
		items = append(items, it)
	}
	if _, err := shop.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	// The report is claimed; one dead sms.
	s, err := session.Start(ctx, d.pool, session.Options{Name: "kinds"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	if _, err := d.pool.Exec(ctx, `UPDATE crdbwork_items SET claim = $1, claimed_at = now(), lease_until = now() + INTERVAL '1 hour' WHERE kind = 'report'`, s.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := d.pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, reason, kind)
		VALUES (gen_random_uuid(), 'shop', 0, 0, 1, 1, '\x00'::BYTEA, now(), 'failed', 'sms')`); err != nil {
		t.Fatal(err)
	}
	mail := d.queue(t, "mail", crsql.Tables{})
	if _, err := mail.Enqueue(ctx, claim.NewItem{Kind: "digest", Payload: []byte("x")}, claim.NewItem{Kind: "digest", Payload: []byte("y")}); err != nil {
		t.Fatal(err)
	}

	row := func(text string, cells ...string) bool {
		return regexp.MustCompile(`(?m)^` + strings.Join(cells, `\s+`) + `\s*$`).MatchString(text)
	}
	r := must(t, d.env, "status", "--queue", "shop")
	for _, cells := range [][]string{
		{"KIND", "UNCLAIMED", "DUE", "OLDEST DUE", "CLAIMED", "DEAD"},
		{"email", "5", "4", `\S+`, "0", "0"},
		{"sms", "2", "2", `\S+`, "0", "1"},
		{`\(none\)`, "1", "1", `\S+`, "0", "0"},
		{"report", "0", "0", "-", "1", "0"},
	} {
		if !row(r.stdout, cells...) {
			t.Errorf("status --queue shop has no row %q:\n%s", strings.Join(cells, " "), r.stdout)
		}
	}
	if i, j := strings.Index(r.stdout, "\nemail "), strings.Index(r.stdout, "\nreport "); i < 0 || j < i {
		t.Errorf("status --queue shop: email (5 unclaimed) is not listed before report (0):\n%s", r.stdout)
	}
	j := jsonOf(t, must(t, d.env, "status", "--queue", "shop", "--json"))
	kinds, _ := j["kinds"].([]any)
	if len(kinds) != 4 {
		t.Fatalf("status --queue shop --json: kinds %v, want 4", j["kinds"])
	}
	first := kinds[0].(map[string]any)
	if first["kind"] != "email" || first["unclaimed"] != float64(5) || first["due"] != float64(4) || first["claimed"] != float64(0) ||
		first["dead"] != float64(0) || first["oldest_due_seconds"] == nil {
		t.Errorf("status --json: the first kind %v, want email with 5 unclaimed, 4 due", first)
	}

	// A queue of one kind: no table, unless asked.
	if r := must(t, d.env, "status", "--queue", "mail"); strings.Contains(r.stdout, "KIND") {
		t.Errorf("status --queue mail (one kind) shows the items by kind:\n%s", r.stdout)
	}
	if r := must(t, d.env, "status", "--queue", "mail", "--by-kind"); !row(r.stdout, "digest", "2", "2", `\S+`, "0", "0") {
		t.Errorf("status --queue mail --by-kind:\n%s", r.stdout)
	}
	// Every queue: with --by-kind only.
	if r := must(t, d.env, "status"); strings.Contains(r.stdout, "KIND") {
		t.Errorf("status shows the items by kind without --by-kind:\n%s", r.stdout)
	}
	r = must(t, d.env, "status", "--by-kind")
	if !row(r.stdout, "QUEUE", "KIND", "UNCLAIMED", "DUE", "OLDEST DUE", "CLAIMED", "DEAD") || !row(r.stdout, "mail", "digest", "2", "2", `\S+`, "0", "0") ||
		!row(r.stdout, "shop", "sms", "2", "2", `\S+`, "0", "1") {
		t.Errorf("status --by-kind:\n%s", r.stdout)
	}
	all := jsonOf(t, must(t, d.env, "status", "--by-kind", "--json"))
	for _, q := range all["queues"].([]any) {
		m := q.(map[string]any)
		if ks, _ := m["kinds"].([]any); len(ks) == 0 {
			t.Errorf("status --by-kind --json: queue %v has no kinds", m["queue"])
		}
	}
}
