package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/testschema"
)

// `demo enqueue --producers 64`, with and without --buffered: every item is
// enqueued once and recorded once in demo_enqueued; the buffered run shares
// statements (fewer flushes than items).
func TestEnqueueProducers(t *testing.T) {
	t.Parallel()
	url := testschema.NewURL(t)
	env := demoEnv("DATABASE_URL=" + url)
	db, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	const n = 3000
	for _, mode := range []struct{ queue, flag string }{{"direct", ""}, {"buffered", "--buffered"}} {
		args := []string{"enqueue", "--queue", mode.queue, "--count", fmt.Sprint(n), "--producers", "64", "--json"}
		if mode.flag != "" {
			args = append(args, mode.flag)
		}
		r := demo(t, 2*time.Minute, env, args...)
		if r.code != 0 {
			t.Fatalf("%s: exit status %d\n%s", mode.queue, r.code, r.stderr)
		}
		m := lastJSON(t, r)
		var recorded, matched, items int
		err := db.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM demo_enqueued WHERE run_id = $1::UUID),
			(SELECT count(DISTINCT e.item_id) FROM demo_enqueued AS e JOIN crdbwork_items AS i ON i.id = e.item_id WHERE e.run_id = $1::UUID),
			(SELECT count(*) FROM crdbwork_items WHERE queue = $2)`, m["run_id"], mode.queue).Scan(&recorded, &matched, &items)
		if err != nil {
			t.Fatal(err)
		}
		if recorded != n || matched != n || items != n {
			t.Fatalf("%s: %d ids recorded, %d of them distinct items in the queue, %d items; want %d each", mode.queue, recorded, matched, items, n)
		}
		if mode.flag != "" {
			if f, _ := m["flushes"].(float64); f <= 0 || f >= n/4 {
				t.Fatalf("%s: %v flushes for %d items", mode.queue, m["flushes"], n)
			}
		}
		t.Logf("%s: %.0f items/s, flushes %v", mode.queue, m["items_per_second"], m["flushes"])
	}
}
