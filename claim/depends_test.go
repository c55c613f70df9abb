package claim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// claimAll claims every claimable item of q for session.
func claimEvery(t *testing.T, q *claim.Queue, session uuid.UUID) []claim.Item {
	t.Helper()
	items, err := q.Claimer(session).Claim(context.Background(), claim.ClaimRequest{Max: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return items
}

func ackAll(t *testing.T, q *claim.Queue, items []claim.Item) {
	t.Helper()
	for _, it := range items {
		if err := q.Ack(context.Background(), it, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func idSet(items []claim.Item) map[uuid.UUID]bool {
	m := map[uuid.UUID]bool{}
	for _, it := range items {
		m[it.ID] = true
	}
	return m
}

func countRows(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A fan-out / fan-in in one call: a root, children after it, a join after
// every child. Only the root is claimable first; the children once the
// root is acked; the join only once every child is acked, and its claim
// (by the database clock) comes after every child's ack.
func TestDependsFanInReleasesAfterEveryAck(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "fan"})
	s := startSession(t, ctx, pool)
	root, join := uuid.New(), uuid.New()
	const children = 20
	items := []claim.NewItem{{ID: root, Payload: []byte("root")}}
	var kids []uuid.UUID
	for range children {
		id := uuid.New()
		kids = append(kids, id)
		items = append(items, claim.NewItem{ID: id, Payload: []byte("child"), After: []uuid.UUID{root}})
	}
	items = append(items, claim.NewItem{ID: join, Payload: []byte("join"), After: kids})
	res, err := q.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	if res.Added() != children+2 || res.Waiting[0] || !res.Waiting[1] || !res.Waiting[children+1] {
		t.Fatalf("enqueue: added %d, waiting %v", res.Added(), res.Waiting)
	}
	if n, err := waitingOf(q.Inspect(ctx)); err != nil || n != children+1 {
		t.Fatalf("WaitingCount = %d, %v; want %d", n, err, children+1)
	}
	got := claimEvery(t, q, s.ID())
	if len(got) != 1 || got[0].ID != root {
		t.Fatalf("first claim: %d items, want the root alone", len(got))
	}
	ackAll(t, q, got)
	got = claimEvery(t, q, s.ID())
	if len(got) != children {
		t.Fatalf("after the root's ack: claimed %d, want the %d children", len(got), children)
	}
	for i, it := range got {
		if idSet(got)[join] {
			t.Fatal("the join was claimable before its prerequisites were acked")
		}
		ackAll(t, q, []claim.Item{it})
		d, err := q.Dependencies(ctx, join, 10)
		if err != nil {
			t.Fatal(err)
		}
		if i < children-1 {
			if !d.Waiting || d.Remaining != int64(children-1-i) || len(d.Prereqs) != children-1-i {
				t.Fatalf("after %d acks: join waiting %v with %d remaining, %d prerequisites listed", i+1, d.Waiting, d.Remaining, len(d.Prereqs))
			}
			if more := claimEvery(t, q, s.ID()); len(more) != 0 {
				t.Fatalf("after %d of %d children acked: claimed %d items", i+1, children, len(more))
			}
		} else if d.Waiting {
			t.Fatal("the join still waits after its last prerequisite's ack")
		}
	}
	got = claimEvery(t, q, s.ID())
	if len(got) != 1 || got[0].ID != join {
		t.Fatalf("after every child: claimed %d items, want the join", len(got))
	}
	var started time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	var lastAck time.Time
	if err := pool.QueryRow(ctx, `SELECT max(ended_at) FROM crdbwork_ended WHERE queue = 'fan' AND id = ANY($1) AND outcome = 'acked'`, kids).Scan(&lastAck); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue = 'fan' AND id = ANY($1) AND outcome = 'acked'`, kids); n != children {
		t.Fatalf("%d children recorded acked, want %d", n, children)
	}
	if !started.After(lastAck) {
		t.Fatalf("the join's handler started at %v, not after the last child's ack at %v", started, lastAck)
	}
	ackAll(t, q, got)
	if st := q.Stats(); st.Unblocked != children+1 {
		t.Fatalf("Stats.Unblocked = %d, want %d", st.Unblocked, children+1)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting`) + countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_for`) +
		countRows(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d rows left in the waiting, edge and item tables", n)
	}
}

// An ack that runs no release (a version-4 worker's: the ack statement
// alone, in its own transaction) leaves the dependent waiting; the next
// Reap releases it.
func TestDependsReapReleasesAfterOtherAcks(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	testdb.Quiet(t, pool) // the test's own transaction is committed once, not retried
	ctx := context.Background()
	producer := newQueue(t, pool, claim.Options{Queue: "old"})
	a, b := uuid.New(), uuid.New()
	if _, err := producer.Enqueue(ctx, claim.NewItem{ID: a, Payload: []byte("a")}, claim.NewItem{ID: b, Payload: []byte("b"), After: []uuid.UUID{a}}); err != nil {
		t.Fatal(err)
	}
	old := newQueue(t, pool, claim.Options{Queue: "old"})
	s := startSession(t, ctx, pool)
	got := claimEvery(t, old, s.ID())
	if len(got) != 1 {
		t.Fatalf("claimed %d items, want a", len(got))
	}
	d, err := store.DetectDialect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if gone, err := store.New(crsql.Tables{}).ItemsAck(ctx, tx, d, []store.ClaimKey{{ID: got[0].ID, Session: got[0].Session, Token: got[0].Token}}); err != nil || len(gone) != 1 {
		t.Fatalf("the version-4 ack: %v, %v", gone, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := claimEvery(t, old, s.ID()); len(got) != 0 {
		t.Fatalf("claimed %d items before any release", len(got))
	}
	st, err := queuemaint.For(old).Reap(ctx)
	if err != nil || st.Unblocked != 1 {
		t.Fatalf("Reap: %+v, %v; want one unblocked", st, err)
	}
	if got := claimEvery(t, old, s.ID()); len(got) != 1 || got[0].ID != b {
		t.Fatalf("after Reap: claimed %d items, want b", len(got))
	}
}

// A prerequisite that dies ends its dependents, and theirs, dead with
// reason "dependency died: <id>"; so does a cancelled one.
func TestDependsDeathEndsDependentsTransitively(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"dead", "cancelled"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ctx := context.Background()
			q := newQueue(t, pool, claim.Options{Queue: "chain"})
			chain := []uuid.UUID{uuid.New(), uuid.New(), uuid.New(), uuid.New()}
			items := []claim.NewItem{{ID: chain[0], Payload: []byte("0"), MaxAttempts: 1}}
			for i := 1; i < len(chain); i++ {
				items = append(items, claim.NewItem{ID: chain[i], Payload: []byte{byte(i)}, After: []uuid.UUID{chain[i-1]}})
			}
			// A bystander waits for the first too, and for a healthy item.
			healthy, bystander := uuid.New(), uuid.New()
			items = append(items, claim.NewItem{ID: healthy, Payload: []byte("h")},
				claim.NewItem{ID: bystander, Payload: []byte("b"), After: []uuid.UUID{healthy, chain[0]}})
			if _, err := q.Enqueue(ctx, items...); err != nil {
				t.Fatal(err)
			}
			s := startSession(t, ctx, pool)
			if how == "dead" {
				var first claim.Item
				for _, it := range claimEvery(t, q, s.ID()) {
					if it.ID == chain[0] {
						first = it
					} else if err := q.Ack(ctx, it, nil); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := q.Nack(ctx, first, errors.New("boom")); err != nil {
					t.Fatal(err)
				}
			} else {
				if ok, err := cancelFound(q.CancelItem(ctx, chain[0], claim.CancelOptions{})); err != nil || !ok {
					t.Fatalf("Cancel: %v, %v", ok, err)
				}
				ackAll(t, q, claimEvery(t, q, s.ID())) // the healthy one
			}
			st, err := queuemaint.For(q).Reap(ctx)
			if err != nil || st.DependencyDead != len(chain) { // chain[1:] and the bystander
				t.Fatalf("Reap: %+v, %v; want %d dependency deaths", st, err, len(chain))
			}
			dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 100}))
			if err != nil {
				t.Fatal(err)
			}
			reasons := map[uuid.UUID]string{}
			for _, d := range dead {
				reasons[d.ID] = d.Reason
			}
			for i := 1; i < len(chain); i++ {
				if want := claim.ReasonDependencyDied + chain[i-1].String(); reasons[chain[i]] != want {
					t.Fatalf("item %d died with reason %q, want %q", i, reasons[chain[i]], want)
				}
			}
			if want := claim.ReasonDependencyDied + chain[0].String(); reasons[bystander] != want {
				t.Fatalf("the bystander died with reason %q, want %q", reasons[bystander], want)
			}
			if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue = 'chain' AND outcome = 'dead' AND id = ANY($1)`, append(chain[1:], bystander)); n != len(chain) {
				t.Fatalf("%d dependents recorded dead, want %d", n, len(chain))
			}
			if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting`) + countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_for`) +
				countRows(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
				t.Fatalf("%d rows left in the waiting, edge and item tables", n)
			}
			// Requeueing the dead prerequisite does not bring its dependents back.
			if how == "dead" {
				if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: chain[0]})); err != nil || !ok {
					t.Fatalf("Requeue: %v, %v", ok, err)
				}
				if got := claimEvery(t, q, s.ID()); len(got) != 1 || got[0].ID != chain[0] {
					t.Fatalf("after the requeue: claimed %d items, want the prerequisite alone", len(got))
				}
			}
		})
	}
}

// Bad prerequisites fail the whole call, and nothing of it is enqueued; a
// prerequisite acked already counts as satisfied; a retry adds nothing.
func TestDependsEnqueueErrorsLoseNothing(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "errs"})
	other := newQueue(t, pool, claim.Options{Queue: "other"})
	s := startSession(t, ctx, pool)
	acked, dead, foreign, queued := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: acked, Payload: []byte("a")}, claim.NewItem{ID: dead, Payload: []byte("d"), MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	for _, it := range claimEvery(t, q, s.ID()) {
		if it.ID == acked {
			ackAll(t, q, []claim.Item{it})
		} else if _, err := q.Nack(ctx, it, claim.Permanent(errors.New("no"))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.Enqueue(ctx, claim.NewItem{ID: foreign, Payload: []byte("f")}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: queued, Payload: []byte("q")}); err != nil {
		t.Fatal(err)
	}
	self := uuid.New()
	later := uuid.New()
	for _, tc := range []struct {
		name  string
		after []uuid.UUID
		want  error
	}{
		{"unknown", []uuid.UUID{queued, uuid.New()}, claim.ErrPrerequisiteUnknown},
		{"dead", []uuid.UUID{queued, dead}, claim.ErrPrerequisiteDied},
		{"other queue", []uuid.UUID{foreign}, claim.ErrPrerequisiteOtherQueue},
		{"zero", []uuid.UUID{{}}, nil},
		{"twice", []uuid.UUID{queued, queued}, nil},
		{"itself", []uuid.UUID{self}, nil},
		{"later in the call", []uuid.UUID{later}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := countRows(t, pool, `SELECT count(*) FROM crdbwork_items`) + countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting`)
			res, err := q.Enqueue(ctx,
				claim.NewItem{Payload: []byte("plain")},
				claim.NewItem{ID: self, Payload: []byte("x"), After: tc.after},
				claim.NewItem{ID: later, Payload: []byte("later")})
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || res.IDs != nil {
				t.Fatalf("Enqueue: %v (ids %v); want an error wrapping %v", err, res.IDs, tc.want)
			}
			after := countRows(t, pool, `SELECT count(*) FROM crdbwork_items`) + countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting`)
			if after != before || countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_for`) != 0 {
				t.Fatalf("a failed enqueue left rows: %d items and waiting items before, %d after", before, after)
			}
		})
	}
	// Acked already: straight into the items table.
	res, err := q.Enqueue(ctx, claim.NewItem{ID: self, Payload: []byte("x"), After: []uuid.UUID{acked}})
	if err != nil || !res.New[0] || res.Waiting[0] {
		t.Fatalf("after an acked prerequisite: %+v, %v; want new and not waiting", res, err)
	}
	// Waiting, then the same call again: a duplicate.
	w := uuid.New()
	for i, wantNew := range []bool{true, false} {
		res, err := q.Enqueue(ctx, claim.NewItem{ID: w, Payload: []byte("w"), After: []uuid.UUID{queued}})
		if err != nil || res.New[0] != wantNew || res.Waiting[0] != wantNew || res.Done[0] {
			t.Fatalf("enqueue %d of a waiting item: %+v, %v", i, res, err)
		}
	}
	// A plain enqueue of a waiting id is a duplicate too.
	res, err = q.Enqueue(ctx, claim.NewItem{ID: w, Payload: []byte("w")}, claim.NewItem{Payload: []byte("p"), After: []uuid.UUID{queued}})
	if err != nil || res.New[0] || !res.New[1] {
		t.Fatalf("plain enqueue of a waiting id: %+v, %v", res, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, w); n != 0 {
		t.Fatal("a waiting id was added to the items table")
	}
}

// Two queues in one database: each queue's dependencies are its own, and
// acks in one release nothing in the other.
func TestDependsTwoQueues(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	var qs []*claim.Queue
	var joins []uuid.UUID
	for _, name := range []string{"one", "two"} {
		q := newQueue(t, pool, claim.Options{Queue: name})
		a, j := uuid.New(), uuid.New()
		if _, err := q.Enqueue(ctx, claim.NewItem{ID: a, Payload: []byte(name)}, claim.NewItem{ID: j, Payload: []byte(name), After: []uuid.UUID{a}}); err != nil {
			t.Fatal(err)
		}
		qs, joins = append(qs, q), append(joins, j)
	}
	ackAll(t, qs[0], claimEvery(t, qs[0], s.ID()))
	if got := claimEvery(t, qs[0], s.ID()); len(got) != 1 || got[0].ID != joins[0] {
		t.Fatalf("queue one: claimed %d, want its join", len(got))
	}
	if n, err := waitingOf(qs[1].Inspect(ctx)); err != nil || n != 1 {
		t.Fatalf("queue two: %d waiting, %v; want 1", n, err)
	}
	if _, err := queuemaint.For(qs[1]).Reap(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := waitingOf(qs[1].Inspect(ctx)); err != nil || n != 1 {
		t.Fatalf("queue two after its Reap: %d waiting, %v; want 1", n, err)
	}
	// A prerequisite of another queue is refused.
	_, err := qs[1].Enqueue(ctx, claim.NewItem{Payload: []byte("x"), After: []uuid.UUID{joins[0]}})
	if !errors.Is(err, claim.ErrPrerequisiteOtherQueue) {
		t.Fatalf("prerequisite of another queue: %v", err)
	}
}

// Dependencies work with renamed tables (a prefix and a schema).
func TestDependsRenamedTables(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	tables := crsql.Tables{Schema: "deps", Prefix: "dq_"}
	if err := crsql.Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{Tables: tables})
	s := startSession(t, ctx, pool)
	prev := uuid.New()
	items := []claim.NewItem{{ID: prev, Payload: []byte("0")}}
	for i := 1; i < 5; i++ {
		id := uuid.New()
		items = append(items, claim.NewItem{ID: id, Payload: []byte(fmt.Sprint(i)), After: []uuid.UUID{prev}})
		prev = id
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	// A session of these tables.
	var sid uuid.UUID
	if err := pool.QueryRow(ctx, `INSERT INTO deps.dq_sessions (expiry) VALUES (INTERVAL '1 hour') RETURNING id`).Scan(&sid); err != nil {
		t.Fatal(err)
	}
	_ = s
	for i := range items {
		got := claimEvery(t, q, sid)
		if len(got) != 1 || got[0].ID != items[i].ID {
			t.Fatalf("step %d: claimed %d items, want item %d", i, len(got), i)
		}
		ackAll(t, q, got)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM deps.dq_waiting`) + countRows(t, pool, `SELECT count(*) FROM deps.dq_waits_for`); n != 0 {
		t.Fatalf("%d rows left", n)
	}
	// A cancelled prerequisite, the reaper's kill, a cancelled waiting
	// item, and the purge, on the renamed tables.
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: a, Payload: []byte("a")}, claim.NewItem{ID: b, Payload: []byte("b"), After: []uuid.UUID{a}},
		claim.NewItem{ID: c, Payload: []byte("c"), After: []uuid.UUID{a}}); err != nil {
		t.Fatal(err)
	}
	if ok, err := cancelFound(q.CancelItem(ctx, c, claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("Cancel of the waiting c: %v, %v", ok, err)
	}
	if ok, err := cancelFound(q.CancelItem(ctx, a, claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("Cancel of a: %v, %v", ok, err)
	}
	if st, err := queuemaint.For(q).Reap(ctx); err != nil || st.DependencyDead != 1 {
		t.Fatalf("Reap: %+v, %v; want b dead", st, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM deps.dq_dead_items WHERE id = $1 AND reason = $2`, b, claim.ReasonDependencyDied+a.String()); n != 1 {
		t.Fatalf("b died %d times with the reason", n)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: a, Payload: []byte("a")}); err != nil { // done: a duplicate
		t.Fatal(err)
	}
	d := uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: d, Payload: []byte("d"), After: []uuid.UUID{items[0].ID}}); err != nil {
		t.Fatal(err)
	}
	if done, err := q.Purge(ctx, claim.PurgeOptions{}); err != nil || done.Dead != 1 {
		t.Fatalf("Purge: %+v, %v", done, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM deps.dq_waiting`) + countRows(t, pool, `SELECT count(*) FROM deps.dq_waits_for`) +
		countRows(t, pool, `SELECT count(*) FROM deps.dq_items`); n != 0 {
		t.Fatalf("%d rows left after the purge", n)
	}
}

// A queue whose dedup window is zero refuses dependencies: it could not
// tell an acked prerequisite from a dead one.
func TestDependsNeedTheDedupWindow(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "forgetful"})
	st, err := q.Settings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.DedupWindow, st.DedupOff = 0, true
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &st.Policy}); err != nil {
		t.Fatal(err)
	}
	a := uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: a, Payload: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	_, err = q.Enqueue(ctx, claim.NewItem{Payload: []byte("b"), After: []uuid.UUID{a}})
	if !errors.Is(err, claim.ErrNoDedupWindow) {
		t.Fatalf("enqueue after an item of a queue without a dedup window: %v", err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 1 {
		t.Fatalf("%d items, want the first alone", n)
	}
}

// Purge deletes a queue's waiting items and edges with the rest.
func TestDependsPurge(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "gone"})
	a := uuid.New()
	items := []claim.NewItem{{ID: a, Payload: []byte("a")}}
	for range 3 {
		items = append(items, claim.NewItem{Payload: []byte("b"), After: []uuid.UUID{a}})
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	plan, err := q.Purge(ctx, claim.PurgeOptions{DryRun: true})
	if err != nil || plan.Waiting != 3 {
		t.Fatalf("PurgePlan: %+v, %v; want 3 waiting", plan, err)
	}
	done, err := q.Purge(ctx, claim.PurgeOptions{})
	if err != nil || done.Waiting != 3 || done.Items != 1 {
		t.Fatalf("Purge: %+v, %v", done, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting`) + countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_for`); n != 0 {
		t.Fatalf("%d waiting or edge rows left", n)
	}
}

// A waiting item can be cancelled: it is recorded as cancelled, and the
// items that wait for it end, dead, at the next Reap.
func TestDependsCancelWaiting(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "cw"})
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: a, Payload: []byte("a")}, claim.NewItem{ID: b, Payload: []byte("b"), After: []uuid.UUID{a}},
		claim.NewItem{ID: c, Payload: []byte("c"), After: []uuid.UUID{b}}); err != nil {
		t.Fatal(err)
	}
	if ok, err := cancelFound(q.CancelItem(ctx, b, claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("Cancel of a waiting item: %v, %v", ok, err)
	}
	if ok, err := cancelFound(q.CancelItem(ctx, b, claim.CancelOptions{})); err != nil || ok {
		t.Fatalf("Cancel again: %v, %v; want false", ok, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE id = $1 AND outcome = 'cancelled'`, b); n != 1 {
		t.Fatalf("%d cancelled records of b", n)
	}
	st, err := queuemaint.For(q).Reap(ctx)
	if err != nil || st.DependencyDead != 1 {
		t.Fatalf("Reap: %+v, %v; want c dead", st, err)
	}
	dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
	if err != nil || len(dead) != 1 || dead[0].ID != c || dead[0].Reason != claim.ReasonDependencyDied+b.String() {
		t.Fatalf("dead items: %+v, %v", dead, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting`) + countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_for`); n != 0 {
		t.Fatalf("%d rows left", n)
	}
}

// The retry of an enqueue whose outcome was unknown may come without
// After (or from other code): an id that is waiting is a duplicate, never a
// second, claimable copy; the waiting item is released once, when its
// prerequisite is acked.
func TestDependsWaitingIDIsADuplicate(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "dupwait"})
	s := startSession(t, ctx, pool)
	root, dep := uuid.New(), uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: root, Payload: []byte("root")}, claim.NewItem{ID: dep, Payload: []byte("dep"), After: []uuid.UUID{root}}); err != nil {
		t.Fatal(err)
	}
	res, err := q.Enqueue(ctx, claim.NewItem{ID: dep, Payload: []byte("again")})
	if err != nil {
		t.Fatal(err)
	}
	if res.New[0] {
		t.Fatal("enqueue of a waiting id without After: New[0] is true, want a duplicate")
	}
	other := newQueue(t, pool, claim.Options{Queue: "dupwait-other"})
	if _, err := other.Enqueue(ctx, claim.NewItem{ID: dep, Payload: []byte("x")}); !errors.Is(err, claim.ErrIDInOtherQueue) {
		t.Fatalf("enqueue of another queue's waiting id: %v; want ErrIDInOtherQueue", err)
	}
	got := claimEvery(t, q, s.ID())
	if len(got) != 1 || got[0].ID != root {
		t.Fatalf("first claim: %d items, want the root alone (a waiting id was made claimable)", len(got))
	}
	ackAll(t, q, got)
	got = claimEvery(t, q, s.ID())
	if len(got) != 1 || got[0].ID != dep || string(got[0].Payload) != "dep" {
		t.Fatalf("after the root's ack: claimed %d items, want the dependent once with its first payload", len(got))
	}
	ackAll(t, q, got)
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue = 'dupwait' AND outcome = 'acked'`); n != 2 {
		t.Fatalf("%d items acked, want 2", n)
	}
}
