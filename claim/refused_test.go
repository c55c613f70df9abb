package claim_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
)

// incompressible returns n bytes of text that PostgreSQL's compression
// cannot shrink (random letters and digits), so that an index entry holds
// all of them.
func incompressible(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	r := rand.New(rand.NewSource(int64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.Intn(len(alphabet))]
	}
	return string(b)
}

// tooLongTenant is a tenant that the items table's tenant index refuses
// (its entry would exceed PostgreSQL's 2,704 bytes) but that the waiting
// and dead-items tables, which have no such index, accept: as written by
// raw SQL or by a version that allowed tenants of 4,096 bytes.
var tooLongTenant = incompressible(3000)

// insertRefusedWaiting adds, by raw SQL that bypasses the enqueue's bounds,
// a waiting item id of queue that waits for prereq and has tooLongTenant.
func insertRefusedWaiting(t *testing.T, pool *pgxpool.Pool, queue string, id, prereq uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_waiting (id, queue, hash, payload, tenant, remaining) VALUES ($1, $2, 7, 'raw', $3, 1)`,
		id, queue, tooLongTenant); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_waits_for (queue, prereq, dependent) VALUES ($1, $2, $3)`, queue, prereq, id); err != nil {
		t.Fatal(err)
	}
}

// One waiting row that the items table refuses (issue 29, item 3): its 20
// siblings, released by the same prerequisite, run; an unrelated dead
// prerequisite's dependent, swept in the same batch, ends; the refused row
// ends dead with reason "refused by the database" and the database's error,
// and its own dependent ends after it; nothing is left waiting, and a
// second queue's dependencies settle all along (invariant 12). On the code
// before the fix, the sweep retried the same failing batch at every Reap:
// nothing of the queue's dependencies moved again.
func TestRefusedWaitingRowNeverStallsTheSweep(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "deps"})
	other := newQueue(t, pool, claim.Options{Queue: "other"})
	s := startSession(t, ctx, pool)

	p1, p2, d2 := uuid.New(), uuid.New(), uuid.New()
	items := []claim.NewItem{{ID: p1, Payload: []byte("p1")}, {ID: p2, Payload: []byte("p2"), MaxAttempts: 1}}
	var siblings []uuid.UUID
	for range 20 {
		id := uuid.New()
		siblings = append(siblings, id)
		items = append(items, claim.NewItem{ID: id, Payload: []byte("sibling"), Tenant: "t", After: []uuid.UUID{p1}})
	}
	items = append(items, claim.NewItem{ID: d2, Payload: []byte("d2"), After: []uuid.UUID{p2}})
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	bad, afterBad := uuid.New(), uuid.New()
	insertRefusedWaiting(t, pool, "deps", bad, p1)
	if res, err := q.Enqueue(ctx, claim.NewItem{ID: afterBad, Payload: []byte("after bad"), After: []uuid.UUID{bad}}); err != nil || !res.Waiting[0] {
		t.Fatalf("enqueue after the refused row: %+v, %v; want waiting", res, err)
	}
	// The other queue: one prerequisite acked, one that dies.
	x1, y1, x2, y2 := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	if _, err := other.Enqueue(ctx, claim.NewItem{ID: x1, Payload: []byte("x1")}, claim.NewItem{ID: x2, Payload: []byte("x2"), MaxAttempts: 1},
		claim.NewItem{ID: y1, Payload: []byte("y1"), After: []uuid.UUID{x1}}, claim.NewItem{ID: y2, Payload: []byte("y2"), After: []uuid.UUID{x2}}); err != nil {
		t.Fatal(err)
	}

	// p1 acked (its own release is refused: the move of its 21 dependents
	// includes the refused row), p2 dead.
	for _, it := range claimEvery(t, q, s.ID()) {
		switch it.ID {
		case p1:
			if err := q.Ack(ctx, it, nil); err != nil {
				t.Fatal(err)
			}
		case p2:
			if _, err := q.Nack(ctx, it, errors.New("boom")); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("claimed %s, which waits", it.ID)
		}
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'deps'`); n != 0 {
		t.Fatalf("%d items released by the ack, whose move the database refuses: the test does not exercise the sweep", n)
	}

	st, err := queuemaint.For(q).Reap(ctx)
	if st.Unblocked != len(siblings) || st.DependencyDead != 2 || st.Refused != 1 || st.Stuck != 0 {
		t.Fatalf("Reap = %+v (%v); want %d released, 2 dependency deaths (d2 and the refused row's dependent), 1 refused", st, err, len(siblings))
	}
	list := claim.ReapErrors(err)
	if len(list) != 1 || list[0].ID != bad || list[0].Step != claim.StepDependencies || !list[0].Ended ||
		!strings.Contains(list[0].Err.Error(), "index row size") {
		t.Fatalf("ReapErrors = %v; want the refused row %s, ended, with the database's error", list, bad)
	}
	reasons := map[uuid.UUID]claim.DeadItem{}
	dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 100}))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dead {
		reasons[d.ID] = d
	}
	if d := reasons[bad]; d.Reason != claim.ReasonRefused || !strings.HasPrefix(d.LastError, "refused by the database (dependencies): ") ||
		!strings.Contains(d.LastError, "index row size") || d.Tenant != tooLongTenant || string(d.Payload) != "raw" {
		t.Fatalf("the refused row is dead as %+v; want reason %q, the database's error, its tenant and payload", d, claim.ReasonRefused)
	}
	if want := claim.ReasonDependencyDied + bad.String(); reasons[afterBad].Reason != want {
		t.Fatalf("the refused row's dependent died with reason %q, want %q", reasons[afterBad].Reason, want)
	}
	if want := claim.ReasonDependencyDied + p2.String(); reasons[d2].Reason != want {
		t.Fatalf("the dead prerequisite's dependent died with reason %q, want %q", reasons[d2].Reason, want)
	}
	got := idSet(claimEvery(t, q, s.ID()))
	for _, id := range siblings {
		if !got[id] {
			t.Fatalf("sibling %s was not released", id)
		}
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting WHERE queue = 'deps'`) +
		countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_for WHERE queue = 'deps'`); n != 0 {
		t.Fatalf("%d waiting rows or edges left in the queue", n)
	}
	// Settled: the next Reap has nothing to report.
	if st, err := queuemaint.For(q).Reap(ctx); err != nil || st.Refused != 0 || st.Stuck != 0 {
		t.Fatalf("second Reap = %+v, %v; want nothing left", st, err)
	}

	// The other queue settled as usual, alone.
	for _, it := range claimEvery(t, other, s.ID()) {
		switch it.ID {
		case x1:
			if err := other.Ack(ctx, it, nil); err != nil {
				t.Fatal(err)
			}
		case x2:
			if _, err := other.Nack(ctx, it, errors.New("boom")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st, err := queuemaint.For(other).Reap(ctx); err != nil || st.DependencyDead != 1 {
		t.Fatalf("the other queue's Reap = %+v, %v; want y2 dead", st, err)
	}
	if got := claimEvery(t, other, s.ID()); len(got) != 1 || got[0].ID != y1 {
		t.Fatalf("the other queue's claimable items: %d, want y1 alone", len(got))
	}
}

// A claimed item that the database refuses to release when its lease ends
// (its tenant, written by raw SQL, is too long for the index of unclaimed
// items) ends dead with reason "refused by the database" at the next Reap;
// the other expired leases of the batch are released.
func TestRefusedLeaseReleaseEndsDead(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "leases", Lease: 50 * time.Millisecond})
	s := startSession(t, ctx, pool)
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("a")}, claim.NewItem{Payload: []byte("b")})
	if err != nil {
		t.Fatal(err)
	}
	if got := claimEvery(t, q, s.ID()); len(got) != 2 {
		t.Fatalf("claimed %d, want 2", len(got))
	}
	// Claimed rows are not in the index of unclaimed items: the table
	// takes the tenant; releasing the claim would put it there.
	bad := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, payload, tenant, claim, claimed_at, lease_until, attempts)
		VALUES ($1, 'leases', 'raw', $2, $3, now(), now() - INTERVAL '1 second', 1)`, bad, tooLongTenant, s.ID()); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "the three leases to end by the database's clock", func() (bool, string) {
		n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE lease_until < now()`)
		return n >= 3, fmt.Sprintf("%d of 3 ended", n)
	})
	st, err := queuemaint.For(q).Reap(ctx)
	if st.Released != 2 || st.Refused != 1 || st.Stuck != 0 {
		t.Fatalf("Reap = %+v (%v); want 2 released, 1 refused", st, err)
	}
	if list := claim.ReapErrors(err); len(list) != 1 || list[0].ID != bad || list[0].Step != claim.StepLeases || !list[0].Ended {
		t.Fatalf("ReapErrors = %v; want %s, ended, in the leases step", list, bad)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1 AND reason = $2 AND last_error LIKE '%index row size%'`,
		bad, claim.ReasonRefused); n != 1 {
		t.Fatal("the refused item is not dead as refused, with the database's error")
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE id = $1 AND outcome = 'dead'`, bad); n != 1 {
		t.Fatal("the refused item is not recorded as ended")
	}
	got := idSet(claimEvery(t, q, s.ID()))
	if len(got) != 2 || !got[res.IDs[0]] || !got[res.IDs[1]] {
		t.Fatalf("claimable after the Reap: %v, want the two released items", got)
	}
}

// A bulk requeue goes on past a dead item that the items table refuses (a
// tenant too long for its index, written by raw SQL into the dead items,
// which have no such index): every other dead item is requeued, the
// refused one stays dead and is counted. On the code before the fix, the
// requeue stopped at that row with an error.
func TestRequeueWhereGoesOnPastRefusedRows(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "rq"})
	s := startSession(t, ctx, pool)
	var ids []uuid.UUID
	for i := range 6 {
		res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte{byte(i)}, MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.IDs[0])
	}
	for _, it := range claimEvery(t, q, s.ID()) {
		if _, err := q.Nack(ctx, it, errors.New("boom")); err != nil {
			t.Fatal(err)
		}
	}
	// The refused row dies among the others (newest first, it is in the
	// middle of the page).
	bad := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, tenant, reason, died_at, enqueued_at)
		SELECT $1, 'rq', 0, 0, 1, 1, 'raw', $2, 'failed', d.died_at, d.enqueued_at FROM crdbwork_dead_items AS d WHERE d.id = $3`,
		bad, tooLongTenant, ids[3]); err != nil {
		t.Fatal(err)
	}
	var calls int
	res, err := q.Requeue(ctx, claim.RequeueOptions{All: true, Progress: func(claim.RequeueResult) { calls++ }})
	if err != nil || res.Requeued != len(ids) || res.Refused != 1 || len(res.RefusedIDs) != 1 || res.RefusedIDs[0] != bad {
		t.Fatalf("RequeueWhere = %+v, %v; want %d requeued, the refused row counted", res, err, len(ids))
	}
	if calls == 0 {
		t.Fatal("progress was never called")
	}
	if got := claimEvery(t, q, s.ID()); len(got) != len(ids) {
		t.Fatalf("claimable after the requeue: %d, want %d", len(got), len(ids))
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, bad); n != 1 {
		t.Fatal("the refused dead item did not stay dead")
	}
	// Alone, its requeue fails with the database's error.
	if _, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: bad})); err == nil || !strings.Contains(err.Error(), "index row size") {
		t.Fatalf("Requeue of the refused row: %v; want the database's error", err)
	}
}

// The reaper's cancel step ends every cancelled item whose handler is gone
// but one whose end the database refuses (here a constraint on the ended
// ids, which its move to the dead items meets too): that one stays,
// reported with its id, and the step goes on without it. On the code before
// the fix, the step failed as a whole at every Reap and ended none.
func TestRefusedCancelDoesNotHoldUpOthers(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "cancels"})
	s := startSession(t, ctx, pool)
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("a")}, claim.NewItem{Payload: []byte("b")}, claim.NewItem{Payload: []byte("c")})
	if err != nil {
		t.Fatal(err)
	}
	items := claimEvery(t, q, s.ID())
	if len(items) != 3 {
		t.Fatalf("claimed %d, want 3", len(items))
	}
	for _, it := range items {
		if r, err := q.CancelItem(ctx, it.ID, claim.CancelOptions{By: "test"}); err != nil || !r.Running {
			t.Fatalf("CancelItem: %+v, %v; want running", r, err)
		}
	}
	held := res.IDs[1]
	if _, err := pool.Exec(ctx, `ALTER TABLE crdbwork_ended ADD CONSTRAINT test_hold CHECK (id <> '`+held.String()+`')`); err != nil {
		t.Fatal(err)
	}
	// Their handlers are gone: the claims released (as the session's
	// expiry releases them).
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET claim = NULL, claim_queue = NULL, claim_part = NULL, claimed_at = NULL, lease_until = NULL
		WHERE queue = 'cancels'`); err != nil {
		t.Fatal(err)
	}
	st, err := queuemaint.For(q).Reap(ctx)
	if st.Cancelled != 2 || st.Stuck != 1 || st.Refused != 0 {
		t.Fatalf("Reap = %+v (%v); want 2 cancelled, 1 stuck", st, err)
	}
	if list := claim.ReapErrors(err); len(list) != 1 || list[0].ID != held || list[0].Step != claim.StepCancelled || list[0].Ended {
		t.Fatalf("ReapErrors = %v; want %s in the cancel step, not ended", list, held)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'cancels'`); n != 1 {
		t.Fatalf("%d items left, want the refused one alone", n)
	}
}

// Pruning goes on past a row whose delete the database refuses (here a
// trigger, as a user may add one; a foreign key that references the table
// does the same): the ended ids past the dedup window and the dead items
// past the retention are deleted but that one, which stays, reported with
// its id. On the code before the fix, the oldest-first batch failed at
// every Reap and nothing of the queue was pruned again.
func TestRefusedPruneDoesNotHoldUpOthers(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "prune"})
	held := uuid.New()
	if _, err := pool.Exec(ctx, `CREATE FUNCTION test_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'held by a test'; END $$`); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"crdbwork_ended", "crdbwork_dead_items"} {
		if _, err := pool.Exec(ctx, `CREATE TRIGGER test_hold BEFORE DELETE ON `+table+`
FOR EACH ROW WHEN (OLD.id = '`+held.String()+`') EXECUTE FUNCTION test_hold()`); err != nil {
			t.Fatal(err)
		}
	}
	// The held row is the oldest of each table: every batch meets it.
	ids := []uuid.UUID{held}
	for range 5 {
		ids = append(ids, uuid.New())
	}
	for i, id := range ids {
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_ended (queue, id, ended_at, outcome) VALUES ('prune', $1, now() - INTERVAL '48 hours' + $2 * INTERVAL '1 second', 'acked')`, id, i); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason)
			VALUES ($1, 'prune', 0, 0, 1, 1, 'x', now() - INTERVAL '61 days', now() - INTERVAL '60 days' + $2 * INTERVAL '1 second', 'failed')`, id, i); err != nil {
			t.Fatal(err)
		}
	}
	st, err := queuemaint.For(q).Reap(ctx)
	if st.Pruned != len(ids)-1 || st.DeadPruned != len(ids)-1 || st.Stuck != 2 {
		t.Fatalf("Reap = %+v (%v); want %d ended ids and %d dead items pruned, 2 rows stuck", st, err, len(ids)-1, len(ids)-1)
	}
	list := claim.ReapErrors(err)
	if len(list) != 2 || list[0].ID != held || list[0].Step != claim.StepPruneEnded || list[1].ID != held || list[1].Step != claim.StepPruneDead ||
		!strings.Contains(list[0].Err.Error(), "held by a test") {
		t.Fatalf("ReapErrors = %v; want the held row in both pruning steps", list)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue = 'prune'`) +
		countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'prune'`); n != 2 {
		t.Fatalf("%d rows left, want the held ones alone", n)
	}
	// The public forms report it too.
	if _, err := queuemaint.For(q).PruneEnded(ctx); len(claim.ReapErrors(err)) != 1 || claim.ReapErrors(err)[0].ID != held {
		t.Fatalf("PruneEnded: %v; want the held row reported", err)
	}
}
