package claim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
)

// Every death of an id is listed with its own Death key, DeadBefore pages
// on through every one of them, RequeueDeath takes a given death (not the
// newest), and a requeue refused because the id is live wraps ErrItemLive.
func TestDeathsAreListedAndRequeuedByKey(t *testing.T) {
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
	all, err := q.Dead(ctx, 100)
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
	page, err := q.Dead(ctx, 2)
	for ; err == nil && len(page) > 0; page, err = q.DeadBefore(ctx, page[len(page)-1], 2) {
		paged = append(paged, page...)
	}
	if err != nil || len(paged) != len(all) {
		t.Fatalf("paged through %d dead items (%v), want %d", len(paged), err, len(all))
	}
	for i := range all {
		if paged[i].ID != all[i].ID || paged[i].Death != all[i].Death {
			t.Fatalf("page order differs at %d: %s/%s, want %s/%s", i, paged[i].ID, paged[i].Death, all[i].ID, all[i].Death)
		}
	}
	if _, err := q.DeadBefore(ctx, all[0], 0); err == nil {
		t.Fatal("DeadBefore with limit 0: no error")
	}

	// The middle death, by key.
	var middle claim.DeadItem
	for _, d := range deaths {
		if d.LastError == "death 2" {
			middle = d
		}
	}
	if ok, err := q.RequeueDeath(ctx, id, uuid.New()); err != nil || ok {
		t.Fatalf("RequeueDeath of an unknown death = %v, %v; want false, nil", ok, err)
	}
	if ok, err := q.RequeueDeath(ctx, id, middle.Death); err != nil || !ok {
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
	_, err = q.Requeue(ctx, id)
	if !errors.Is(err, claim.ErrItemLive) {
		t.Fatalf("Requeue of a live id = %v, want ErrItemLive", err)
	}
	for _, d := range deaths {
		if d.Death == middle.Death {
			continue
		}
		if _, err := q.RequeueDeath(ctx, id, d.Death); !errors.Is(err, claim.ErrItemLive) {
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
// error lists the items it could not move, with their ids, and each failed
// step; the steps after a failed one still run.
func TestReapErrorsNameStepsAndItems(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Lease: 50 * time.Millisecond})
	s := startSession(t, ctx, pool)
	bad := uuid.New()
	refuse(t, pool, bad)
	ids, err := q.Enqueue(ctx, claim.NewItem{ID: bad, Payload: []byte("bad"), Priority: -1}, claim.NewItem{Payload: []byte("hung")})
	if err != nil {
		t.Fatal(err)
	}
	it := claimOne(t, q, s.ID())
	if _, err := q.Nack(ctx, it, claim.Permanent(errors.New("broken"))); !errors.Is(err, claim.ErrDeadLetterFailed) {
		t.Fatalf("Nack whose move is refused = %v, want ErrDeadLetterFailed", err)
	}
	// The leases step fails as a whole: the database refuses to release
	// the hung item's claim.
	hung := claimOne(t, q, s.ID())
	if hung.ID != ids[1] {
		t.Fatalf("claimed %s, want %s", hung.ID, ids[1])
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE crdbwork_items ADD CONSTRAINT test_hold CHECK (claim IS NOT NULL OR id <> '`+hung.ID.String()+`')`); err != nil {
		t.Fatal(err)
	}
	// An expired item the expiry step moves all the same.
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("expires"), Delay: time.Hour, TTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE lease_until < now() OR expires_at <= now()`) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the lease and the deadline never passed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, err := q.Reap(ctx)
	if st.Expired != 1 || st.Stuck != 1 || st.Released != 0 || st.Dead != 0 {
		t.Fatalf("Reap = %+v (%v); want 1 expired, 1 stuck", st, err)
	}
	list := claim.ReapErrors(err)
	if len(list) != 2 {
		t.Fatalf("ReapErrors = %v (from %v), want 2", list, err)
	}
	if e := list[0]; e.Step != claim.StepLeases || e.ID != uuid.Nil || e.Queue != q.Name() {
		t.Errorf("first failure %+v: want the leases step", e)
	}
	if e := list[1]; e.Step != claim.StepExhausted || e.ID != bad || e.Err == nil {
		t.Errorf("second failure %+v: want item %s in the exhausted step", e, bad)
	}
	if claim.ReapErrors(nil) != nil {
		t.Error("ReapErrors(nil) is not nil")
	}
}
