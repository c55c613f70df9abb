package claim_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// sqlAfter is the SQL of an array of prerequisite ids.
func sqlAfter(ids ...uuid.UUID) string {
	var s []string
	for _, id := range ids {
		s = append(s, "'"+id.String()+"'")
	}
	return "ARRAY[" + strings.Join(s, ", ") + "]::UUID[]"
}

// An item enqueued from SQL with prerequisites (after) waits exactly as one
// enqueued from Go with After: it is a waiting item with one edge per
// pending prerequisite, no claim sees it, Dependencies reports it, the ack
// of its last prerequisite releases it, and a call with its id meanwhile
// is a duplicate. A prerequisite acked already is satisfied (the item is
// claimable at once); one dead or cancelled fails the call, unless
// run_after names that end, as RunAfter does.
func TestSQLEnqueueAfterWaitsAsGo(t *testing.T) {
	t.Parallel()
	pool, _ := sqlSetup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "sqlafter"})
	s := startSession(t, ctx, pool)
	p1, p2, dep := uuid.New(), uuid.New(), uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: p1, Payload: []byte("p1")}, claim.NewItem{ID: p2, Payload: []byte("p2")}); err != nil {
		t.Fatal(err)
	}
	call := testdb.EnqueueArgs("'sqlafter'", "convert_to('join', 'UTF8')", "id", "$1", "key", "'k'", "priority", "4",
		"headers", `'{"traceparent": "00-sql"}'`, "kind", "'report'", "after", sqlAfter(p1, p2))
	r, err := sqlEnqueue(ctx, pool, call, dep)
	if err != nil || !r.Added || r.Done || r.ID != dep {
		t.Fatalf("crdbwork_enqueue with after: %+v, %v; want added", r, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting WHERE id = $1 AND queue = 'sqlafter' AND remaining = 2`, dep); n != 1 {
		t.Fatalf("%d waiting rows with 2 remaining for the dependent, want 1", n)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_for WHERE queue = 'sqlafter' AND dependent = $1 AND prereq = ANY($2)`, dep, []uuid.UUID{p1, p2}); n != 2 {
		t.Fatalf("%d edges to the dependent, want 2", n)
	}
	d, err := q.Dependencies(ctx, dep, 10)
	if err != nil || !d.Waiting || d.Remaining != 2 || len(d.Prereqs) != 2 {
		t.Fatalf("Dependencies: %+v, %v; want waiting for 2", d, err)
	}
	// A retry of the call is a duplicate, not a second item.
	if r, err := sqlEnqueue(ctx, pool, call, dep); err != nil || r.Added || r.Done {
		t.Fatalf("the same call again: %+v, %v; want a duplicate", r, err)
	}
	items := claimEvery(t, q, s.ID())
	if got := idSet(items); len(got) != 2 || !got[p1] || !got[p2] {
		t.Fatalf("claimed %v; want the two prerequisites alone", got)
	}
	ackAll(t, q, items[:1])
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting WHERE id = $1 AND remaining = 1`, dep); n != 1 {
		t.Fatalf("after one prerequisite's ack: %d waiting rows with 1 remaining, want 1", n)
	}
	ackAll(t, q, items[1:])
	got := claimEvery(t, q, s.ID())
	if len(got) != 1 || got[0].ID != dep || string(got[0].Payload) != "join" || got[0].Key != "k" || got[0].Priority != 4 ||
		got[0].Headers["traceparent"] != "00-sql" || got[0].Kind != "report" {
		t.Fatalf("after both acks claimed %+v; want the dependent with its key, priority, headers and kind", got)
	}
	ackAll(t, q, got)
	if r, err := sqlEnqueue(ctx, pool, call, dep); err != nil || r.Added || !r.Done {
		t.Fatalf("the call again after the dependent's ack: %+v, %v; want done", r, err)
	}

	// A prerequisite acked already: satisfied, the item is claimable at once.
	r, err = sqlEnqueue(ctx, pool, testdb.EnqueueArgs("'sqlafter'", "''::BYTEA", "after", sqlAfter(p1)))
	if err != nil || !r.Added {
		t.Fatalf("after an acked prerequisite: %+v, %v; want added", r, err)
	}
	if got := claimEvery(t, q, s.ID()); len(got) != 1 || got[0].ID != r.ID {
		t.Fatalf("after an acked prerequisite: claimed %d items, want the new one at once", len(got))
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting`) + countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_for`); n != 0 {
		t.Fatalf("%d waiting rows and edges left", n)
	}
}

// A prerequisite that died or was cancelled: before the call, the call
// fails (SQLSTATE 55000, as Go's ErrPrerequisiteDied) unless run_after
// names that end, and then the item is claimable at once; after the call,
// the reaper ends the dependent dead (reason "dependency died: <id>") or,
// with run_after, releases it, as for Go's RunAfter.
func TestSQLEnqueueAfterRunAfter(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"died", "cancelled"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			pool, _ := sqlSetup(t)
			ctx := context.Background()
			q := newQueue(t, pool, claim.Options{Queue: "sqlra"})
			s := startSession(t, ctx, pool)
			other := map[string]string{"died": "cancelled", "cancelled": "died"}[how]
			p, healthy := uuid.New(), uuid.New()
			if _, err := q.Enqueue(ctx, claim.NewItem{ID: p, Payload: []byte("p")}, claim.NewItem{ID: healthy, Payload: []byte("h")}); err != nil {
				t.Fatal(err)
			}
			enq := func(runAfter string, ids ...uuid.UUID) (sqlEnqueued, error) {
				args := []string{"after", sqlAfter(ids...)}
				if runAfter != "" {
					args = append(args, "run_after", runAfter)
				}
				return sqlEnqueue(ctx, pool, testdb.EnqueueArgs("'sqlra'", "''::BYTEA", args...))
			}
			anyway, err := enq("ARRAY['"+how+"']", p, healthy)
			if err != nil || !anyway.Added {
				t.Fatalf("with run_after %s: %+v, %v", how, anyway, err)
			}
			both, err := enq("ARRAY['died', 'cancelled']", p, healthy)
			if err != nil || !both.Added {
				t.Fatal(err)
			}
			wrong, err := enq("ARRAY['"+other+"']", p, healthy)
			if err != nil || !wrong.Added {
				t.Fatal(err)
			}
			plain, err := enq("", p, healthy)
			if err != nil || !plain.Added {
				t.Fatal(err)
			}
			if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting WHERE queue = 'sqlra'`); n != 4 {
				t.Fatalf("%d waiting items, want 4", n)
			}
			if how == "died" {
				killOne(t, q, s.ID(), p) // acks the healthy one
			} else {
				if ok, err := cancelFound(q.CancelItem(ctx, p, claim.CancelOptions{})); err != nil || !ok {
					t.Fatalf("CancelItem: %v, %v", ok, err)
				}
				ackAll(t, q, claimEvery(t, q, s.ID())) // the healthy one
			}
			st, err := queuemaint.For(q).Reap(ctx)
			if err != nil || st.DependencyDead != 2 || st.Unblocked != 2 {
				t.Fatalf("Reap: %+v, %v; want 2 dependency deaths and 2 released", st, err)
			}
			if got := idSet(claimEvery(t, q, s.ID())); len(got) != 2 || !got[anyway.ID] || !got[both.ID] {
				t.Fatalf("claimable after the reap: %v; want the two whose run_after has %s", got, how)
			}
			for _, id := range []uuid.UUID{wrong.ID, plain.ID} {
				if o := endedOutcome(t, pool, "sqlra", id); o != "dead" {
					t.Fatalf("dependent %s ended %q, want dead", id, o)
				}
			}
			// At the call: the prerequisite has ended already.
			late, err := enq("ARRAY['"+how+"']", p)
			if err != nil || !late.Added {
				t.Fatalf("run_after %s after the end: %+v, %v; want added", how, late, err)
			}
			if got := idSet(claimEvery(t, q, s.ID())); !got[late.ID] {
				t.Fatalf("the late item is not claimable at once: %v", got)
			}
			var pe *pgconn.PgError
			if _, err := enq("ARRAY['"+other+"']", p); !errors.As(err, &pe) || pe.Code != "55000" || !strings.Contains(pe.Message, "ended without an ack") {
				t.Fatalf("run_after %s after a %s prerequisite: %v; want SQLSTATE 55000", other, how, err)
			}
			if _, err := enq("", p); !errors.As(err, &pe) || pe.Code != "55000" {
				t.Fatalf("no run_after after a %s prerequisite: %v; want SQLSTATE 55000", how, err)
			}
			// Go refuses the same, with ErrPrerequisiteDied.
			if _, err := q.Enqueue(ctx, claim.NewItem{After: []uuid.UUID{p}, Payload: []byte("go")}); !errors.Is(err, claim.ErrPrerequisiteDied) {
				t.Fatalf("Go: %v; want ErrPrerequisiteDied", err)
			}
		})
	}
}

// Each bad after or run_after raises its SQLSTATE with a clear message and
// writes nothing, as Go refuses the same items.
func TestSQLEnqueueAfterRefusesBadInput(t *testing.T) {
	t.Parallel()
	pool, _ := sqlSetup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "sqlbad"})
	qo := newQueue(t, pool, claim.Options{Queue: "sqlbad-other"})
	p, self, otherItem := uuid.New(), uuid.New(), uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: p, Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	if _, err := qo.Enqueue(ctx, claim.NewItem{ID: otherItem, Payload: []byte("o")}); err != nil {
		t.Fatal(err)
	}
	if err := newQueue(t, pool, claim.Options{Queue: "sqlbad-nodedup"}).UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupOff: true}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, queue, code, msg string
		args                   []string
	}{
		{"NULL prerequisite", "sqlbad", "22023", "NULL or the zero id", []string{"after", "ARRAY[NULL]::UUID[]"}},
		{"zero id", "sqlbad", "22023", "NULL or the zero id", []string{"after", sqlAfter(uuid.Nil)}},
		{"listed twice", "sqlbad", "22023", "is listed twice", []string{"after", sqlAfter(p, p)}},
		{"itself", "sqlbad", "22023", "waits for itself", []string{"id", "'" + self.String() + "'", "after", sqlAfter(p, self)}},
		{"too many", "sqlbad", "22023", "the limit is 10000", []string{"after", "(SELECT array_agg(gen_random_uuid()) FROM generate_series(1, 10001))"}},
		{"bad run_after", "sqlbad", "22023", "run_after takes", []string{"after", sqlAfter(p), "run_after", "ARRAY['dead']"}},
		{"run_after alone", "sqlbad", "22023", "run_after without after", []string{"run_after", "ARRAY['died']"}},
		{"unknown", "sqlbad", "23503", "is unknown", []string{"after", sqlAfter(p, uuid.New())}},
		{"another queue's", "sqlbad", "23503", "is an item of queue sqlbad-other", []string{"after", sqlAfter(otherItem)}},
		{"no dedup window", "sqlbad-nodedup", "55000", "dedup window", []string{"after", sqlAfter(p)}},
		{"no dedup window of after_queues", "sqlbad", "55000", "queue sqlbad-nodedup: dedup window off",
			[]string{"after", sqlAfter(p), "after_queues", "ARRAY['sqlbad-nodedup']"}},
		{"after_queues not one per prerequisite", "sqlbad", "22023", "one per prerequisite", []string{"after", sqlAfter(p), "after_queues", "ARRAY['a', 'b']"}},
		{"named in the wrong queue", "sqlbad", "23503", "is an item of queue sqlbad, not of queue sqlbad-other", []string{"after", sqlAfter(p), "after_queues", "ARRAY['sqlbad-other']"}},
	} {
		before := countRows(t, pool, `SELECT (SELECT count(*) FROM crdbwork_items) + (SELECT count(*) FROM crdbwork_waiting) + (SELECT count(*) FROM crdbwork_waits_for)`)
		_, err := sqlEnqueue(ctx, pool, testdb.EnqueueArgs("'"+c.queue+"'", "''::BYTEA", c.args...))
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != c.code || !strings.Contains(pe.Message, c.msg) || !strings.HasPrefix(pe.Message, "enqueue: ") {
			t.Errorf("%s: %v; want SQLSTATE %s with %q", c.name, err, c.code, c.msg)
		}
		if after := countRows(t, pool, `SELECT (SELECT count(*) FROM crdbwork_items) + (SELECT count(*) FROM crdbwork_waiting) + (SELECT count(*) FROM crdbwork_waits_for)`); after != before {
			t.Errorf("%s: %d rows before, %d after the refused call", c.name, before, after)
		}
	}
	// A call by position with the 14 arguments of revision 3 still works.
	var added bool
	if err := pool.QueryRow(ctx, `SELECT added FROM crdbwork_enqueue('sqlbad', ''::BYTEA, NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, false, NULL)`).Scan(&added); err != nil || !added {
		t.Fatalf("a call with revision 3's arguments: %v, %v", added, err)
	}
}

// An item enqueued from SQL may wait for items of other queues
// (after_queues names each prerequisite's queue, NULL its own): it waits as
// one with Go's AfterIn, the ack in the other queue releases it at once,
// and a prerequisite of the other queue already acked is satisfied.
func TestSQLEnqueueAfterInOtherQueues(t *testing.T) {
	t.Parallel()
	pool, _ := sqlSetup(t)
	ctx := context.Background()
	qa := newQueue(t, pool, claim.Options{Queue: "sqlx-a"})
	qb := newQueue(t, pool, claim.Options{Queue: "sqlx-b"})
	s := startSession(t, ctx, pool)
	a, b, dep := uuid.New(), uuid.New(), uuid.New()
	if _, err := qa.Enqueue(ctx, claim.NewItem{ID: a, Payload: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	if _, err := qb.Enqueue(ctx, claim.NewItem{ID: b, Payload: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	r, err := sqlEnqueue(ctx, pool, testdb.EnqueueArgs("'sqlx-b'", "''::BYTEA", "id", "$1", "after", sqlAfter(a, b),
		"after_queues", "ARRAY['sqlx-a', NULL]"), dep)
	if err != nil || !r.Added {
		t.Fatalf("crdbwork_enqueue with a prerequisite of another queue: %+v, %v", r, err)
	}
	d, err := qb.Dependencies(ctx, dep, 10)
	if err != nil || !d.Waiting || d.Remaining != 2 || len(d.Prereqs) != 2 {
		t.Fatalf("Dependencies: %+v, %v; want waiting for 2", d, err)
	}
	for _, p := range d.Prereqs {
		if want := map[uuid.UUID]string{a: "sqlx-a", b: ""}[p.ID]; p.Queue != want || p.State != "queued" {
			t.Fatalf("prerequisite %s: queue %q, %s; want %q, queued", p.ID, p.Queue, p.State, want)
		}
	}
	ackAll(t, qb, claimEvery(t, qb, s.ID()))
	ackAll(t, qa, claimEvery(t, qa, s.ID()))
	if got := claimEvery(t, qb, s.ID()); len(got) != 1 || got[0].ID != dep {
		t.Fatalf("after both acks B claimed %d items, want the dependent (released by the ack in A)", len(got))
	}
	// A prerequisite of another queue acked already: claimable at once.
	r, err = sqlEnqueue(ctx, pool, testdb.EnqueueArgs("'sqlx-b'", "''::BYTEA", "after", sqlAfter(a), "after_queues", "ARRAY['sqlx-a']"))
	if err != nil || !r.Added {
		t.Fatal(err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, r.ID); n != 1 {
		t.Fatalf("the item after an acked prerequisite of another queue is not claimable at once")
	}
}
