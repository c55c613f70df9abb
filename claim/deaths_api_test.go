package claim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// Every death of an id is listed with its own Death key, DeadBefore pages
// on through every one of them, RequeueDeath takes a given death (not the
// newest), and a requeue refused because the id is live wraps ErrItemLive.
func TestDeathsAreListedAndRequeuedByKey(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	allowReuse(t, pool, q.Name())
	s := startSession(t, ctx, pool)
	id := uuid.New()
	dieOnce(t, q, s.ID(), id)
	for i := 2; i <= 3; i++ {
		if _, err := q.Enqueue(ctx, claim.NewItem{ID: id, Payload: []byte(fmt.Sprint("life ", i))}); err != nil {
			t.Fatal(err)
		}
		if _, err := q.Nack(ctx, claimOne(t, q, s.ID()), claim.Permanent(fmt.Errorf("death %d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// Other dead items, to page through.
	for range 4 {
		dieOnce(t, q, s.ID(), uuid.New())
	}
	all, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 100}))
	if err != nil || len(all) != 7 {
		t.Fatalf("Dead = %d items, %v; want 7", len(all), err)
	}
	deaths := map[uuid.UUID]claim.DeadItem{}
	for _, d := range all {
		if d.ID == id {
			deaths[d.Death] = d
		}
		if d.Death == uuid.Nil {
			t.Fatalf("dead item %s without a death key", d.ID)
		}
	}
	if len(deaths) != 3 {
		t.Fatalf("%d distinct deaths of %s listed, want 3", len(deaths), id)
	}
	// Pages of 2 list the same deaths in the same order.
	var paged []claim.DeadItem
	page, err := q.DeadItems(ctx, claim.DeadQuery{Limit: 2})
	for ; err == nil; page, err = q.DeadItems(ctx, claim.DeadQuery{Limit: 2, After: page.Next}) {
		paged = append(paged, page.Items...)
		if page.Next == "" {
			break
		}
	}
	if err != nil || len(paged) != len(all) {
		t.Fatalf("paged through %d dead items (%v), want %d", len(paged), err, len(all))
	}
	for i := range all {
		if paged[i].ID != all[i].ID || paged[i].Death != all[i].Death {
			t.Fatalf("page order differs at %d: %s/%s, want %s/%s", i, paged[i].ID, paged[i].Death, all[i].ID, all[i].Death)
		}
	}
	if _, err := q.DeadItems(ctx, claim.DeadQuery{Limit: -1}); err == nil {
		t.Fatal("DeadItems with a negative limit: no error")
	}

	// The middle death, by key.
	var middle claim.DeadItem
	for _, d := range deaths {
		if d.LastError == "death 2" {
			middle = d
		}
	}
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: id, Death: uuid.New()})); err != nil || ok {
		t.Fatalf("RequeueDeath of an unknown death = %v, %v; want false, nil", ok, err)
	}
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: id, Death: middle.Death})); err != nil || !ok {
		t.Fatalf("RequeueDeath = %v, %v", ok, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1 AND death = $2`, id, middle.Death); n != 0 {
		t.Fatal("the requeued death is still dead")
	}
	it := claimOne(t, q, s.ID())
	if string(it.Payload) != "life 2" {
		t.Fatalf("requeued %q, want life 2", it.Payload)
	}
	// Live: both forms refuse with ErrItemLive, and nothing moves.
	_, err = requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: id}))
	if !errors.Is(err, claim.ErrItemLive) {
		t.Fatalf("Requeue of a live id = %v, want ErrItemLive", err)
	}
	for _, d := range deaths {
		if d.Death == middle.Death {
			continue
		}
		if _, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: id, Death: d.Death})); !errors.Is(err, claim.ErrItemLive) {
			t.Fatalf("RequeueDeath of a live id = %v, want ErrItemLive", err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, id); n != 2 {
		t.Fatalf("%d deaths left after refused requeues, want 2", n)
	}
	if err := q.Ack(ctx, it, nil); err != nil {
		t.Fatal(err)
	}
}

// Nack's error wraps ErrDeadLetterFailed when the move is refused; Reap's
// error names, with its id, each item a step could not release or move, and
// every other item of those steps is reaped.
func TestReapErrorsNameStepsAndItems(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Lease: 50 * time.Millisecond})
	s := startSession(t, ctx, pool)
	bad := uuid.New()
	refuse(t, pool, bad)
	ids, err := q.Enqueue(ctx, claim.NewItem{ID: bad, Payload: []byte("bad"), Priority: -1},
		claim.NewItem{Payload: []byte("hung")}, claim.NewItem{Payload: []byte("hung too")})
	if err != nil {
		t.Fatal(err)
	}
	it := claimOne(t, q, s.ID())
	if _, err := q.Nack(ctx, it, claim.Permanent(errors.New("broken"))); !errors.Is(err, claim.ErrDeadLetterFailed) {
		t.Fatalf("Nack whose move is refused = %v, want ErrDeadLetterFailed", err)
	}
	// Two hung items; the database refuses to release the first one's claim.
	hung, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil || len(hung) != 2 {
		t.Fatalf("claimed %d, %v", len(hung), err)
	}
	held := ids.IDs[1]
	if _, err := pool.Exec(ctx, `ALTER TABLE crdbwork_items ADD CONSTRAINT test_hold CHECK (claim IS NOT NULL OR id <> '`+held.String()+`')`); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("expires"), Delay: time.Hour, TTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "the leases and the deadline to pass by the database's clock", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE lease_until < now() OR expires_at <= now()`)
		return n >= 3, fmt.Sprintf("%d of 3 passed", n)
	})
	st, err := queuemaint.For(q).Reap(ctx)
	if st != (queuemaint.ReapStats{Released: 1, Expired: 1, Refused: 1, Stuck: 1}) {
		t.Fatalf("Reap = %+v (%v); want 1 released, 1 expired, 1 refused (ended), 1 stuck", st, err)
	}
	list := claim.ReapErrors(err)
	if len(list) != 2 {
		t.Fatalf("ReapErrors = %v (from %v), want 2", list, err)
	}
	if e := list[0]; e.Step != claim.StepLeases || e.ID != held || e.Queue != q.Name() || e.Err == nil || !e.Ended {
		t.Errorf("first failure %+v: want item %s in the leases step, ended", e, held)
	}
	if e := list[1]; e.Step != claim.StepExhausted || e.ID != bad || e.Err == nil || e.Ended {
		t.Errorf("second failure %+v: want item %s in the exhausted step, not ended", e, bad)
	}
	// The item whose release was refused ended, dead as refused; the one
	// whose every move to the dead items is refused stays as it was.
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, held); n != 0 {
		t.Error("the item whose release was refused is still in the items table")
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1 AND reason = $2 AND last_error LIKE 'refused by the database (leases): %test_hold%'`,
		held, claim.ReasonRefused); n != 1 {
		t.Error("the item whose release was refused is not dead as refused, with the database's error")
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, bad); n != 1 {
		t.Error("the item whose every move to the dead items is refused is not in the items table")
	}
	if claim.ReapErrors(nil) != nil {
		t.Error("ReapErrors(nil) is not nil")
	}
}

// A step that fails as a whole (not for one item: here a trigger that
// fails every move to the dead items with a system error) is reported, and
// the other steps still run.
func TestReapStepFailureDoesNotStopTheOthers(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("the failure is injected with a PL/pgSQL trigger")
	}
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Lease: 50 * time.Millisecond})
	s := startSession(t, ctx, pool)
	if _, err := pool.Exec(ctx, `CREATE FUNCTION test_fail() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'disk on fire' USING ERRCODE = '58030'; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TRIGGER test_fail BEFORE INSERT ON crdbwork_dead_items FOR EACH ROW EXECUTE FUNCTION test_fail()`); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("hung")}); err != nil {
		t.Fatal(err)
	}
	claimOne(t, q, s.ID())
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("expires"), Delay: time.Hour, TTL: time.Millisecond},
		claim.NewItem{Payload: []byte("loops"), MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	crashClaim(t, pool, q, 1)
	await.Until(t, "the lease and the deadline to pass by the database's clock", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE lease_until < now() OR expires_at <= now()`)
		return n >= 2, fmt.Sprintf("%d of 2 passed", n)
	})
	st, err := queuemaint.For(q).Reap(ctx)
	if st != (queuemaint.ReapStats{Released: 1}) {
		t.Fatalf("Reap = %+v (%v); want the lease released", st, err)
	}
	list := claim.ReapErrors(err)
	if len(list) != 2 || list[0].Step != claim.StepExhausted || list[1].Step != claim.StepExpired ||
		list[0].ID != uuid.Nil || list[1].ID != uuid.Nil {
		t.Fatalf("ReapErrors = %v (from %v); want the exhausted and expired steps, each as a whole", list, err)
	}
	if _, err := pool.Exec(ctx, `DROP TRIGGER test_fail ON crdbwork_dead_items`); err != nil {
		t.Fatal(err)
	}
	if st, err := queuemaint.For(q).Reap(ctx); err != nil || st.Dead != 1 || st.Expired != 1 {
		t.Fatalf("Reap once the moves work = %+v, %v; want both moved", st, err)
	}
}
