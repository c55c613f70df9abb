package claim_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// Items enqueued from psql with a key into a sequenced queue are sequenced
// as the Go API's: the calls of one transaction, of one statement and of
// separate transactions are claimed in call order, one item per key at a
// time, after the Go API's items of the key; items without a key, and
// items of a queue that is not sequenced, get no sequence order.
func TestSQLEnqueueSequencedKeysKeepTheirOrder(t *testing.T) {
	t.Parallel()
	pool, url := sqlSetup(t)
	ctx := context.Background()
	q := sequencedQueue(t, pool, claim.Options{Queue: "seq"})
	// The Go API's item first: the psql items of key a come after it.
	if _, err := q.Enqueue(ctx, claim.NewItem{Key: "a", Payload: []byte("a/go")}); err != nil {
		t.Fatal(err)
	}
	call := func(key, payload string) string {
		return `SELECT added FROM crdbwork_enqueue(` + testdb.EnqueueArgs("'seq'", "convert_to('"+payload+"', 'UTF8')", "key", "'"+key+"'") + `);`
	}
	// One transaction, keys interleaved.
	tx := "BEGIN;" + call("a", "a/0") + call("b", "b/0") + call("a", "a/1") + call("a", "a/2") + call("b", "b/1") + "COMMIT;"
	if out, stderr, err := psql(t, url, tx); err != nil || strings.Count(out, "t") != 5 {
		t.Fatalf("psql transaction: %q, %v %s; want 5 added", out, err, stderr)
	}
	// One statement of five calls.
	if out, stderr, err := psql(t, url, `SELECT count(*) FILTER (WHERE (e).added) FROM (SELECT crdbwork_enqueue(`+testdb.EnqueueArgs("'seq'", "convert_to('c/' || g, 'UTF8')", "key", "'c'")+`) AS e FROM generate_series(0, 4) AS g) AS s`); err != nil || out != "5" {
		t.Fatalf("psql statement: %q, %v %s; want 5 added", out, err, stderr)
	}
	// Separate transactions.
	for _, p := range []string{"a/3", "a/4"} {
		if out, stderr, err := psql(t, url, call("a", p)); err != nil || out != "t" {
			t.Fatalf("psql %s: %q, %v %s", p, out, err, stderr)
		}
	}
	if out, stderr, err := psql(t, url, `SELECT added FROM crdbwork_enqueue('seq', convert_to('free', 'UTF8'));
		SELECT added FROM crdbwork_enqueue(`+testdb.EnqueueArgs("'plain'", "convert_to('p', 'UTF8')", "key", "'a'")+`)`); err != nil || out != "t\nt" {
		t.Fatalf("psql unsequenced items: %q, %v %s", out, err, stderr)
	}
	var wrong int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items
		WHERE (seq_order IS NOT NULL) <> (queue = 'seq' AND item_key IS NOT NULL)`).Scan(&wrong); err != nil || wrong != 0 {
		t.Fatalf("%d items sequenced wrongly (%v): want a sequence order exactly on the keyed items of the sequenced queue", wrong, err)
	}

	want := map[string][]string{
		"a": {"a/go", "a/0", "a/1", "a/2", "a/3", "a/4"},
		"b": {"b/0", "b/1"},
		"c": {"c/0", "c/1", "c/2", "c/3", "c/4"},
		"":  {"free"},
	}
	got := map[string][]string{}
	s := startSession(t, ctx, pool)
	c := q.Claimer(s.ID())
	n := 0
	await.Until(t, "the 14 items claimed and acked, key by key", func() (bool, string) {
		items, err := c.Claim(ctx, claim.ClaimRequest{Max: 100})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, it := range items {
			if it.Key != "" && seen[it.Key] {
				t.Fatalf("two items of key %q in one claim: %v", it.Key, payloadsOf(items))
			}
			seen[it.Key] = true
			got[it.Key] = append(got[it.Key], string(it.Payload))
		}
		for _, it := range items {
			if err := q.Ack(ctx, it, nil); err != nil {
				t.Fatal(err)
			}
		}
		n += len(items)
		return n >= 14, fmt.Sprintf("%d of 14 claimed: %v", n, got)
	})
	for key, order := range want {
		if strings.Join(got[key], " ") != strings.Join(order, " ") {
			t.Errorf("key %q claimed in order %v, want %v", key, got[key], order)
		}
	}
}
