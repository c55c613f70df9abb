package store_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestRetentionAndProgressPlans seeds 60,000 deaths over three queues
// (the oldest of queue q 40 days old) and 50,000 items, 200 of which
// reported a progress, ANALYZEs, and EXPLAINs the statements of retention
// and of checkpoints: the prunes and the dead-count reads must read
// crdbwork_dead_items_by_queue (never the dead items whole), the progress
// list crdbwork_items_progress, and the saves the items' primary key. On
// PostgreSQL it checks the custom and the generic plans.
//
// Then it checks what a reap with nothing to prune costs: on PostgreSQL,
// EXPLAIN ANALYZE of the age prune with a bound that nothing passes, and of
// the count of deaths since a recent time, must read no row of the table
// (the index seek finds nothing), whatever the queue holds.
func TestRetentionAndProgressPlans(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	session := uuid.New()
	seed := []string{
		`INSERT INTO crdbwork_sessions (id, expiry) VALUES ('` + session.String() + `', INTERVAL '1 hour')`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason)
		 SELECT gen_random_uuid(), CASE WHEN g % 3 = 0 THEN 'q' WHEN g % 3 = 1 THEN 'other' ELSE 'third' END, 0, 0, 1, 1, '\x00'::BYTEA,
		        now() - INTERVAL '41 days', now() - g * INTERVAL '1 minute', 'failed'
		 FROM generate_series(1, 60000) AS g`,
		`INSERT INTO crdbwork_items (id, queue, part, payload, attempts, claim, claim_token, lease_until, progress_done, progress_total, progress_at, checkpoint, checkpoint_at)
		 SELECT gen_random_uuid(), CASE WHEN g % 2 = 0 THEN 'q' ELSE 'other' END, g % 16, '\x00'::BYTEA,
		        CASE WHEN g % 250 = 0 THEN 1 ELSE 0 END,
		        CASE WHEN g % 500 = 0 THEN '` + session.String() + `'::UUID END,
		        CASE WHEN g % 250 = 0 THEN 1 ELSE 0 END,
		        CASE WHEN g % 500 = 0 THEN now() + INTERVAL '5 minutes' END,
		        CASE WHEN g % 250 = 0 THEN g END, CASE WHEN g % 250 = 0 THEN 50000 END,
		        CASE WHEN g % 250 = 0 THEN now() - g * INTERVAL '1 second' END,
		        CASE WHEN g % 250 = 0 THEN '\x0102'::BYTEA END,
		        CASE WHEN g % 250 = 0 THEN now() - g * INTERVAL '1 second' END
		 FROM generate_series(1, 50000) AS g`,
		`INSERT INTO crdbwork_queues (name, dead_max_age, dead_max_count) VALUES ('q', INTERVAL '30 days', 1000)`,
		`ANALYZE crdbwork_dead_items`,
		`ANALYZE crdbwork_items`,
		`ANALYZE crdbwork_queues`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	var id uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT id FROM crdbwork_items WHERE claim IS NOT NULL LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	ret := store.NewRetentionStatements(crsql.Tables{})
	ck := store.NewCheckpointStatements(crsql.Tables{})
	recent := time.Now().Add(-time.Hour)
	pruneOlder, pruneBefore := ret.PruneDeadOlder, ret.PruneDeadBefore
	if testdb.Kind(t) == "postgres" {
		pruneOlder, pruneBefore = ret.PostgresPruneDeadOlder, ret.PostgresPruneDeadBefore
	}
	refused := store.NewRefusedStatements(crsql.Tables{})
	var ids []uuid.UUID
	rows, err := pool.Query(ctx, `SELECT id FROM crdbwork_dead_items WHERE queue = 'q' ORDER BY died_at LIMIT 64`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var d uuid.UUID
		if err := rows.Scan(&d); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, d)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	cases := []planCase{
		{"Retention", ret.Retention, []any{"q"}},
		{"SetRetention", ret.SetRetention, []any{"q", int64(3600e6), int64(500), int64(86400e6)}},
		{"PruneDeadOlder", pruneOlder, []any{"q", int64(30 * 24 * 3600e6), 1000}},
		{"PruneDeadBefore", pruneBefore, []any{"q", recent, 1000}},
		{"DeadNewest", ret.DeadNewest, []any{"q", int64(1000), int64(60e6)}},
		{"DeadSince", ret.DeadSince, []any{"q", recent, int64(1001)}},
		{"SaveCheckpoint", ck.SaveCheckpoint, []any{id, session, int64(1), nil}},
		{"SaveProgress", ck.SaveProgress, []any{id, session, int64(1), int64(3), int64(10)}},
		{"Progressing", ck.Progressing, []any{"q", 20}},
		// The by-id fallback of the pruning (items_refused.go).
		{"PruneDeadCandidates", refused.PruneDeadCandidates, []any{"q", nil, int64(30 * 24 * 3600e6), 1000}},
		{"PruneDeadCandidates (before)", refused.PruneDeadCandidates, []any{"q", recent, int64(0), 1000}},
		{"PruneDeadIDs", refused.PruneDeadIDs, []any{"q", ids, nil, int64(30 * 24 * 3600e6)}},
		{"PruneDeadIDs (before)", refused.PruneDeadIDs, []any{"q", ids, recent, int64(0)}},
	}
	want := map[string]string{
		"PruneDeadOlder": "crdbwork_dead_items_by_queue", "PruneDeadBefore": "crdbwork_dead_items_by_queue",
		"DeadNewest": "crdbwork_dead_items_by_queue", "DeadSince": "crdbwork_dead_items_by_queue",
		"SaveCheckpoint": "crdbwork_items_pkey", "SaveProgress": "crdbwork_items_pkey",
		"Progressing":         "crdbwork_items_progress",
		"PruneDeadCandidates": "crdbwork_dead_items_by_queue", "PruneDeadCandidates (before)": "crdbwork_dead_items_by_queue",
		"PruneDeadIDs": "crdbwork_dead_items_pkey", "PruneDeadIDs (before)": "crdbwork_dead_items_pkey",
		// Retention and SetRetention read the queues table by its key,
		// which PostgreSQL may read whole while it is a few rows.
	}
	explainEach(t, pool, "retention_", cases, nil, func(i int, mode, text string) {
		c := cases[i]
		switch {
		case strings.Contains(text, "Seq Scan on crdbwork_dead_items") || strings.Contains(text, "Seq Scan on crdbwork_items") ||
			strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan"):
			t.Errorf("%s (%s) reads a whole table:\n%s", c.name, mode, text)
		case testdb.Kind(t) == "postgres" && want[c.name] != "" && !strings.Contains(text, want[c.name]):
			t.Errorf("%s (%s) does not read %s:\n%s", c.name, mode, want[c.name], text)
		default:
			t.Logf("%s (%s):\n%s", c.name, mode, text)
		}
	})

	if testdb.Kind(t) != "postgres" {
		return
	}
	// Nothing to prune: the statements' index seeks find nothing, and no
	// row of the table is read.
	actualRows := regexp.MustCompile(`actual time=[0-9.]+\.\.[0-9.]+ rows=([0-9]+)`)
	for _, c := range []planCase{
		{"PruneDeadOlder (nothing older)", pruneOlder, []any{"q", int64(100 * 24 * 3600e6), 1000}},
		{"PruneDeadBefore (nothing before)", pruneBefore, []any{"q", time.Now().Add(-100 * 24 * time.Hour), 1000}},
		{"DeadSince (nothing since)", ret.DeadSince, []any{"q", time.Now(), int64(1001)}},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+c.stmt, c.args...)
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for rows.Next() {
			var l string
			if err := rows.Scan(&l); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, l)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		text := strings.Join(lines, "\n")
		for _, l := range lines {
			if !strings.Contains(l, "crdbwork_dead_items") {
				continue
			}
			m := actualRows.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			if n, _ := strconv.Atoi(m[1]); n != 0 {
				t.Errorf("%s reads %d rows of the dead items, want 0:\n%s", c.name, n, text)
			}
		}
		if !strings.Contains(text, "crdbwork_dead_items_by_queue") {
			t.Errorf("%s does not seek crdbwork_dead_items_by_queue:\n%s", c.name, text)
		}
		t.Logf("%s:\n%s", c.name, text)
	}
}
