package store_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestAttemptErrorsPrune: the retention of crdbwork_attempt_errors deletes
// a row only when its item is in none of the items, waiting, dead and kept
// cancelled tables and its ended record is gone or older than the history
// window, and only rows older than the window; a row of another queue is
// left.
func TestAttemptErrorsPrune(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	ids := map[string]uuid.UUID{}
	for _, n := range []string{"live", "waiting", "dead", "cancelled", "ended recent", "ended old", "gone", "gone recent", "other queue"} {
		ids[n] = uuid.New()
	}
	id := func(n string) string { return "'" + ids[n].String() + "'::UUID" }
	seed := []string{
		`INSERT INTO crdbwork_queues (name, history_window) VALUES ('q', INTERVAL '1 hour')`,
		`INSERT INTO crdbwork_items (id, queue, part, payload) VALUES (` + id("live") + `, 'q', 0, '\x00'::BYTEA)`,
		`INSERT INTO crdbwork_waiting (id, queue, hash, payload, remaining) VALUES (` + id("waiting") + `, 'q', 0, '\x00'::BYTEA, 1)`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason)
		 VALUES (` + id("dead") + `, 'q', 0, 0, 1, 1, '\x00'::BYTEA, now(), now() - INTERVAL '2 hours', 'failed')`,
		`INSERT INTO crdbwork_cancelled_items (queue, id, part, priority, max_attempts, payload, enqueued_at, cancelled_at)
		 VALUES ('q', ` + id("cancelled") + `, 0, 0, 1, '\x00'::BYTEA, now(), now() - INTERVAL '2 hours')`,
		`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome) VALUES
		 ('q', ` + id("ended recent") + `, now() - INTERVAL '10 minutes', 'dead'),
		 ('q', ` + id("ended old") + `, now() - INTERVAL '2 hours', 'acked')`,
		`INSERT INTO crdbwork_attempt_errors (queue, id, errors, updated_at)
		 SELECT 'q', u, '[]'::JSONB, now() - INTERVAL '3 hours' FROM unnest(ARRAY[` + id("live") + `, ` + id("waiting") + `, ` + id("dead") + `, ` +
			id("cancelled") + `, ` + id("ended recent") + `, ` + id("ended old") + `, ` + id("gone") + `]) AS u`,
		`INSERT INTO crdbwork_attempt_errors (queue, id, errors, updated_at) VALUES
		 ('q', ` + id("gone recent") + `, '[]'::JSONB, now() - INTERVAL '10 minutes'),
		 ('other', ` + id("other queue") + `, '[]'::JSONB, now() - INTERVAL '3 days')`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	s := store.New(crsql.Tables{})
	var n int64
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
		var err error
		n, err = s.AttemptErrorsPrune(ctx, tx, "q", 1000)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT id FROM crdbwork_attempt_errors`)
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for name, u := range ids {
		if slices.Contains(left, u) {
			kept = append(kept, name)
		}
	}
	slices.Sort(kept)
	want := []string{"cancelled", "dead", "ended recent", "gone recent", "live", "other queue", "waiting"}
	if n != 2 || !slices.Equal(kept, want) {
		t.Errorf("the prune deleted %d rows and kept %q; want 2 deleted (ended old, gone) and %q kept", n, kept, want)
	}
}

// TestAttemptErrorsPrunePlans seeds 60,000 rows of attempt errors over two
// queues, as many items, dead items and ended records, ANALYZEs, and
// EXPLAINs the retention of crdbwork_attempt_errors: it reads
// crdbwork_attempt_errors_by_age from the oldest end and looks each
// candidate's item up by key, never a whole table (custom and generic
// plans on PostgreSQL).
func TestAttemptErrorsPrunePlans(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	seed := []string{
		`INSERT INTO crdbwork_attempt_errors (queue, id, errors, updated_at)
		 SELECT CASE WHEN g % 2 = 0 THEN 'q' ELSE 'other' END, gen_random_uuid(), '[{"attempt": 1, "kind": "failed", "error": "boom"}]'::JSONB,
		        now() - g * INTERVAL '1 minute'
		 FROM generate_series(1, 60000) AS g`,
		`INSERT INTO crdbwork_items (id, queue, part, payload)
		 SELECT id, queue, 0, '\x00'::BYTEA FROM crdbwork_attempt_errors WHERE updated_at > now() - INTERVAL '100 minutes'`,
		`INSERT INTO crdbwork_items (id, queue, part, payload)
		 SELECT gen_random_uuid(), 'q', g % 16, '\x00'::BYTEA FROM generate_series(1, 60000) AS g`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason)
		 SELECT gen_random_uuid(), 'q', 0, 0, 1, 1, '\x00'::BYTEA, now(), now() - g * INTERVAL '1 minute', 'failed'
		 FROM generate_series(1, 60000) AS g`,
		`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
		 SELECT 'q', gen_random_uuid(), now() - g * INTERVAL '1 second', 'acked' FROM generate_series(1, 60000) AS g`,
		`ANALYZE crdbwork_attempt_errors`, `ANALYZE crdbwork_items`, `ANALYZE crdbwork_dead_items`, `ANALYZE crdbwork_ended`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	cases := []planCase{{"PruneAttemptErrors", store.AttemptErrorsPruneForTest(crsql.Tables{}), []any{"q", 1000}}}
	explainEach(t, pool, "attempt_errors_", cases, nil, func(i int, mode, text string) {
		switch {
		case strings.Contains(text, "Seq Scan on crdbwork_") || strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan"):
			t.Errorf("%s (%s) scans a table:\n%s", cases[i].name, mode, text)
		case testdb.Kind(t) == "postgres" && !strings.Contains(text, "crdbwork_attempt_errors_by_age"):
			t.Errorf("%s (%s) does not read crdbwork_attempt_errors_by_age:\n%s", cases[i].name, mode, text)
		default:
			t.Logf("%s (%s):\n%s", cases[i].name, mode, text)
		}
	})
}
