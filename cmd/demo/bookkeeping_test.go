package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/testschema"
)

// TestEnqueueChunksRecordEveryItem: an enqueue of several chunks, some in
// flight at once (enqueueStreams), records every item it enqueued exactly
// once, under its run id, and nothing else; verify (with and without --run-id)
// then finds a lost item and a duplicate result, with the right counts.
func TestEnqueueChunksRecordEveryItem(t *testing.T) {
	t.Parallel()
	const n = 2*enqueueChunk + 517 // two whole chunks and a partial one
	url := testschema.NewURL(t)
	env := demoEnv("DATABASE_URL=" + url)
	r := demo(t, 3*time.Minute, env, "enqueue", "--count", "20517", "--json")
	if r.code != 0 {
		t.Fatalf("enqueue: exit status %d\n%s", r.code, r.stderr)
	}
	runID, _ := lastJSON(t, r)["run_id"].(string)
	if runID == "" {
		t.Fatalf("enqueue --json has no run id: %s", r.stdout)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	// The record and the queue hold the same n ids; every payload 0..n-1
	// is enqueued once.
	var recorded, items, unrecorded, notEnqueued, payloads int64
	if err := pool.QueryRow(ctx, `SELECT
    (SELECT count(*) FROM demo_enqueued WHERE run_id = $1 AND queue = 'demo'),
    (SELECT count(*) FROM crdbwork_items WHERE queue = 'demo'),
    (SELECT count(*) FROM crdbwork_items AS i WHERE NOT EXISTS (SELECT 1 FROM demo_enqueued AS e WHERE e.item_id = i.id)),
    (SELECT count(*) FROM demo_enqueued AS e WHERE NOT EXISTS (SELECT 1 FROM crdbwork_items AS i WHERE i.id = e.item_id)),
    (SELECT count(DISTINCT convert_from(payload, 'UTF8')) FROM crdbwork_items WHERE queue = 'demo')`, runID).
		Scan(&recorded, &items, &unrecorded, &notEnqueued, &payloads); err != nil {
		t.Fatal(err)
	}
	if recorded != n || items != n || unrecorded != 0 || notEnqueued != 0 || payloads != n {
		t.Fatalf("recorded %d, items %d, unrecorded items %d, records without an item %d, distinct payloads %d; want %d, %d, 0, 0, %d",
			recorded, items, unrecorded, notEnqueued, payloads, n, n, n)
	}
	for _, args := range [][]string{{"verify", "--json"}, {"verify", "--run-id", runID, "--json"}} {
		v := lastJSON(t, demo(t, time.Minute, env, args...))
		for key, w := range map[string]float64{"enqueued": n, "pending": n, "acked": 0, "lost": 0, "duplicates": 0} {
			if got := num(t, v, key); got != w {
				t.Errorf("%s before the results: %s = %v, want %v", strings.Join(args, " "), key, got, w)
			}
		}
	}

	// Every item handled once: a result each, the items gone.
	if _, err := pool.Exec(ctx, `INSERT INTO demo_results (item_id, session_id, part, attempt)
SELECT item_id, gen_random_uuid(), 0, 1 FROM demo_enqueued`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = 'demo'`); err != nil {
		t.Fatal(err)
	}
	if r := demo(t, time.Minute, env, "verify", "--run-id", runID); r.code != 0 {
		t.Fatalf("verify with every result: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// One result lost, another duplicated.
	if _, err := pool.Exec(ctx, `DELETE FROM demo_results WHERE row_id = (SELECT row_id FROM demo_results ORDER BY item_id LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO demo_results (item_id, session_id, part, attempt)
SELECT item_id, gen_random_uuid(), 0, 2 FROM demo_results ORDER BY item_id DESC LIMIT 1`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"verify", "--json"}, {"verify", "--run-id", runID, "--json"}} {
		r := demo(t, time.Minute, env, args...)
		if r.code != 1 {
			t.Errorf("%s with a lost item and a duplicate: exit status %d, want 1\n%s", strings.Join(args, " "), r.code, r.stdout)
		}
		v := lastJSON(t, r)
		for key, w := range map[string]float64{"enqueued": n, "acked": n - 1, "lost": 1, "duplicates": 1, "pending": 0} {
			if got := num(t, v, key); got != w {
				t.Errorf("%s: %s = %v, want %v", strings.Join(args, " "), key, got, w)
			}
		}
	}
}
