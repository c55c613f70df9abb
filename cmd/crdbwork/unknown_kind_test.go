package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// A --kind that no item has (kinds are not registered anywhere: a kind is
// whatever producers wrote) is an empty result in every command that
// filters by kind, never an error: dead, dead --count, cancelled, requeue
// and requeue --cancelled exit 0, name the kind, list or move nothing, and
// leave every row where it was (the dashboard's filter agrees:
// TestUnknownKindIsAnEmptyResult in package dashboard).
func TestUnknownKindIsAnEmptyResult(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	q := d.queue(t, "shop", crsql.Tables{})
	enq, err := q.Enqueue(ctx, claim.NewItem{Kind: "refund", Payload: []byte("1")}, claim.NewItem{Kind: "refund", Payload: []byte("2")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.CancelItem(ctx, enq.IDs[1], claim.CancelOptions{By: "ops"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, reason, kind)
		VALUES (gen_random_uuid(), 'shop', 0, 0, 1, 1, '\x00'::BYTEA, now(), 'failed', 'refund')`); err != nil {
		t.Fatal(err)
	}
	before := d.snapshot(t, "shop") + " " + kept(t, d)
	for _, c := range []struct {
		args []string
		text string
	}{
		{[]string{"dead", "--queue", "shop", "--kind", "nosuch"}, `queue "shop" has no dead items of kind "nosuch"`},
		{[]string{"dead", "--queue", "shop", "--kind", "nosuch", "--count"}, "0"},
		{[]string{"cancelled", "--queue", "shop", "--kind", "nosuch"}, `queue "shop" has no cancelled items of kind "nosuch"`},
		{[]string{"requeue", "--queue", "shop", "--kind", "nosuch", "--yes"}, `requeued 0 dead items of kind "nosuch" into queue "shop"`},
		{[]string{"requeue", "--queue", "shop", "--cancelled", "--kind", "nosuch", "--yes"}, `requeued 0 cancelled items of kind "nosuch" into queue "shop"`},
	} {
		r := must(t, d.env, c.args...)
		if !strings.Contains(r.stdout, c.text) {
			t.Errorf("crdbwork %s: stdout does not say %q:\n%s", strings.Join(c.args, " "), c.text, r)
		}
	}
	for _, c := range []struct {
		args []string
		key  string
	}{
		{[]string{"dead", "--queue", "shop", "--kind", "nosuch", "--json"}, "items"},
		{[]string{"cancelled", "--queue", "shop", "--kind", "nosuch", "--json"}, "items"},
	} {
		j := jsonOf(t, must(t, d.env, c.args...))
		if list, ok := j[c.key].([]any); !ok || len(list) != 0 {
			t.Errorf("crdbwork %s: %s is %v, want an empty list", strings.Join(c.args, " "), c.key, j[c.key])
		}
	}
	for _, args := range [][]string{
		{"requeue", "--queue", "shop", "--kind", "nosuch", "--yes", "--json"},
		{"requeue", "--queue", "shop", "--cancelled", "--kind", "nosuch", "--yes", "--json"},
	} {
		if j := jsonOf(t, must(t, d.env, args...)); j["requeued"] != float64(0) {
			t.Errorf("crdbwork %s: requeued %v, want 0", strings.Join(args, " "), j["requeued"])
		}
	}
	if after := d.snapshot(t, "shop") + " " + kept(t, d); after != before {
		t.Errorf("the commands of an unknown kind changed the tables: before %s, after %s", before, after)
	}
}

// kept counts the cancelled items kept for a requeue.
func kept(t *testing.T, d *db) string {
	t.Helper()
	return fmt.Sprintf("kept=%d", d.count(t, `SELECT count(*) FROM crdbwork_cancelled_items`))
}
