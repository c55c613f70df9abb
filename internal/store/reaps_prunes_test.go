package store_test

import (
	"context"
	"testing"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestQueuePrunesDue: the test of a queue's prune turn (QueuePrunesDue)
// is false when the whole reap's steps it stands for would find nothing
// in the queue (recent ended ids, kept cancelled items and attempt
// errors, a live item, an exhausted item whose cancel was asked for, and
// anything of another queue), and true for each kind of row they would
// act on.
func TestQueuePrunesDue(t *testing.T) {
	t.Parallel()
	quiet := []string{
		`INSERT INTO crdbwork_queues (name, dedup_window, history_window) VALUES ('q', INTERVAL '1 hour', INTERVAL '1 hour')`,
		`INSERT INTO crdbwork_items (id, queue, part, payload) VALUES (gen_random_uuid(), 'q', 0, '\x00'::BYTEA)`,
		// Exhausted, but its cancel was asked for: the cancel step's,
		// which the turn's own test of work finds.
		`INSERT INTO crdbwork_items (id, queue, part, payload, attempts, max_attempts, cancel_requested_at)
		 VALUES (gen_random_uuid(), 'q', 0, '\x00'::BYTEA, 3, 3, now())`,
		`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome) VALUES ('q', gen_random_uuid(), now() - INTERVAL '10 minutes', 'acked')`,
		`INSERT INTO crdbwork_cancelled_items (queue, id, part, priority, max_attempts, payload, enqueued_at, cancelled_at)
		 VALUES ('q', gen_random_uuid(), 0, 0, 1, '\x00'::BYTEA, now(), now() - INTERVAL '10 minutes')`,
		`INSERT INTO crdbwork_attempt_errors (queue, id, errors, updated_at) VALUES ('q', gen_random_uuid(), '[]'::JSONB, now() - INTERVAL '10 minutes')`,
		// Another queue's rows that would be due in it.
		`INSERT INTO crdbwork_items (id, queue, part, payload, attempts, max_attempts) VALUES (gen_random_uuid(), 'other', 0, '\x00'::BYTEA, 3, 3)`,
		`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome) VALUES ('other', gen_random_uuid(), now() - INTERVAL '3 days', 'acked')`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason)
		 VALUES (gen_random_uuid(), 'other', 0, 0, 1, 1, '\x00'::BYTEA, now(), now(), 'failed')`,
		`INSERT INTO crdbwork_waits_across (prereq_queue, prereq, dependent_queue, dependent) VALUES ('q', gen_random_uuid(), 'other', gen_random_uuid())`,
	}
	cases := []struct {
		name string
		row  string // "" : none
		want bool
	}{
		{"nothing to prune", "", false},
		{"an exhausted item", `INSERT INTO crdbwork_items (id, queue, part, payload, attempts, max_attempts)
			VALUES (gen_random_uuid(), 'q', 0, '\x00'::BYTEA, 3, 3)`, true},
		{"an ended id past the windows", `INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
			VALUES ('q', gen_random_uuid(), now() - INTERVAL '2 hours', 'acked')`, true},
		{"a kept cancelled item past the dedup window", `INSERT INTO crdbwork_cancelled_items (queue, id, part, priority, max_attempts, payload, enqueued_at, cancelled_at)
			VALUES ('q', gen_random_uuid(), 0, 0, 1, '\x00'::BYTEA, now(), now() - INTERVAL '2 hours')`, true},
		{"attempt errors past the history window", `INSERT INTO crdbwork_attempt_errors (queue, id, errors, updated_at)
			VALUES ('q', gen_random_uuid(), '[]'::JSONB, now() - INTERVAL '2 hours')`, true},
		{"a dead item", `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason)
			VALUES (gen_random_uuid(), 'q', 0, 0, 1, 1, '\x00'::BYTEA, now(), now(), 'failed')`, true},
		{"a cross-queue edge into the queue", `INSERT INTO crdbwork_waits_across (prereq_queue, prereq, dependent_queue, dependent)
			VALUES ('other', gen_random_uuid(), 'q', gen_random_uuid())`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := newSchemaDB(t)
			ctx := context.Background()
			seed := quiet
			if c.row != "" {
				seed = append(append([]string(nil), quiet...), c.row)
			}
			for _, s := range seed {
				if _, err := pool.Exec(ctx, s); err != nil {
					t.Fatalf("%v\n%s", err, s)
				}
			}
			got, err := store.New(crsql.Tables{}).ReapsPrunesDue(ctx, pool, "q")
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("ReapsPrunesDue: %v; want %v", got, c.want)
			}
		})
	}
}

// TestQueuePrunesDuePlan: the test of a queue's prune turn reads each
// table through its index (one seek each), in a database that has lived:
// other queues' dead items, ended ids and exhausted items, and the queue's
// own backlog and recent ended ids, analyzed. It is not among the hot
// statements (TestHotPlansInEveryState): it runs once a minute per queue,
// and their states keep the dead items empty, whose sequential scan reads
// no page.
func TestQueuePrunesDuePlan(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	seed := []string{
		`INSERT INTO crdbwork_items (id, queue, part, payload, max_attempts, attempts)
		 SELECT gen_random_uuid(), CASE WHEN g % 2 = 0 THEN 'q' ELSE 'other-' || (g % 20)::TEXT END, 0, '\x00'::BYTEA, 3,
		        CASE WHEN g % 2 = 1 AND g % 7 = 0 THEN 3 ELSE 0 END
		 FROM generate_series(1, 20000) AS g`,
		`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
		 SELECT CASE WHEN g % 2 = 0 THEN 'q' ELSE 'other-' || (g % 20)::TEXT END, gen_random_uuid(),
		        now() - CASE WHEN g % 2 = 0 THEN g * INTERVAL '1 millisecond' ELSE INTERVAL '3 days' END, 'acked'
		 FROM generate_series(1, 20000) AS g`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason)
		 SELECT gen_random_uuid(), 'other-' || (g % 20)::TEXT, 0, 0, 1, 1, '\x00'::BYTEA, now(), now() - g * INTERVAL '1 second', 'failed'
		 FROM generate_series(1, 20000) AS g`,
		`INSERT INTO crdbwork_attempt_errors (queue, id, errors, updated_at)
		 SELECT 'other-' || (g % 20)::TEXT, gen_random_uuid(), '[]'::JSONB, now() - INTERVAL '3 days' FROM generate_series(1, 5000) AS g`,
		`INSERT INTO crdbwork_cancelled_items (queue, id, part, priority, max_attempts, payload, enqueued_at, cancelled_at)
		 SELECT 'other-' || (g % 20)::TEXT, gen_random_uuid(), 0, 0, 1, '\x00'::BYTEA, now(), now() - INTERVAL '3 days' FROM generate_series(1, 5000) AS g`,
		`ANALYZE crdbwork_items`, `ANALYZE crdbwork_ended`, `ANALYZE crdbwork_dead_items`, `ANALYZE crdbwork_attempt_errors`, `ANALYZE crdbwork_cancelled_items`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	postgres := false
	if d, err := store.DetectDialect(ctx, pool); err != nil {
		t.Fatal(err)
	} else {
		postgres = d == store.Postgres
	}
	st := store.NewStatements(crsql.Tables{})
	cases := []planCase{{"QueuePrunesDue", st.QueuePrunesDue, []any{"q", 1000}}}
	explainEach(t, pool, "prunes_due_", cases, nil, func(i int, mode, plan string) {
		if msg := hotPlanProblem(cases[i].name, plan, postgres); msg != "" {
			t.Errorf("%s (%s): %s:\n%s", cases[i].name, mode, msg, plan)
		}
		t.Logf("%s (%s):\n%s", cases[i].name, mode, plan)
	})
}
