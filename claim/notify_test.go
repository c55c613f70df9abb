package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/wake"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Every enqueue path sends one notification on its queue's channel per
// transaction that added items (due at once or later: a worker waiting on
// its listener looks up when a delayed item vests), delivered at commit;
// none for a rollback, for duplicates only, or with NoNotify. Enqueue, Buffer and Requeue also wake the process's
// subscribers after their commit; EnqueueTx does not (the caller commits).
func TestEveryEnqueuePathNotifiesOncePerTransaction(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("notifications are PostgreSQL's only")
	}
	pool := setup(t)
	testdb.Quiet(t, pool) // the test's own transactions are committed once, not retried
	ctx := context.Background()
	stmts := store.New(crsql.Tables{})
	q := newQueue(t, pool, claim.Options{Queue: "n"})
	quiet := newQueue(t, pool, claim.Options{Queue: "n", NoNotify: true})
	barrierQ := newQueue(t, pool, claim.Options{Queue: "barrier"})
	channel, barrier := stmts.NotifyChannel("n"), stmts.NotifyChannel("barrier")
	conn, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, ch := range []string{channel, barrier} {
		if err := stmts.NotifyListen(ctx, conn, ch); err != nil {
			t.Fatal(err)
		}
	}
	sub := wake.Subscribe(channel)
	defer sub.Close()
	// notified returns the notifications of channel received before the
	// barrier's, which it sends, and the wake-ups pending for sub.
	notified := func() (n int, woke bool) {
		select {
		case <-sub.C():
			woke = true
		default:
		}
		if _, err := barrierQ.Enqueue(ctx, claim.NewItem{Payload: []byte("barrier")}); err != nil {
			t.Fatal(err)
		}
		for {
			wctx, cancel := context.WithTimeout(ctx, await.Stretch(time.Minute))
			got, err := conn.WaitForNotification(wctx)
			cancel()
			if err != nil {
				t.Fatalf("waiting for the barrier's notification: %v", err)
			}
			switch got.Channel {
			case barrier:
				return n, woke
			case channel:
				n++
			default:
				t.Fatalf("a notification on %q", got.Channel)
			}
		}
	}
	check := func(what string, wantN int, wantWoke bool) {
		t.Helper()
		if n, woke := notified(); n != wantN || woke != wantWoke {
			t.Errorf("%s: %d notifications, woke %v; want %d, %v", what, n, woke, wantN, wantWoke)
		}
	}
	enqueue := func(q *claim.Queue, items ...claim.NewItem) claim.Enqueued {
		t.Helper()
		res, err := q.Enqueue(ctx, items...)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	enqueue(q, claim.NewItem{Payload: []byte("one")})
	check("Enqueue of one item (one statement)", 1, true)
	enqueue(q, payloads(200)...)
	check("Enqueue of 200 items (COPY, one transaction)", 1, true)
	given := []claim.NewItem{{ID: uuid.New(), Payload: []byte("a")}, {ID: uuid.New(), Payload: []byte("b")}}
	enqueue(q, given...)
	check("Enqueue of caller-given ids (one transaction)", 1, true)
	enqueue(q, given...)
	check("Enqueue of duplicates only", 0, false)
	enqueue(q, claim.NewItem{Payload: []byte("later"), Delay: time.Hour})
	check("Enqueue of a delayed item", 1, true)
	enqueue(quiet, claim.NewItem{Payload: []byte("quiet")})
	check("Enqueue with NoNotify", 0, true)

	for _, commit := range []bool{true, false} {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if _, err := q.EnqueueTx(ctx, tx, claim.NewItem{Payload: []byte(fmt.Sprint("tx ", i))}); err != nil {
				t.Fatal(err)
			}
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			check("two EnqueueTx in a transaction that commits", 1, false)
		} else {
			check("two EnqueueTx in a transaction that rolls back", 0, false)
		}
	}

	// 20 items through a Buffer that waits for all of them: one flush.
	buf, err := claim.NewBuffer(q, claim.BufferOptions{MaxItems: 20, MaxWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := buf.Enqueue(ctx, claim.NewItem{Payload: []byte(fmt.Sprint("buffered ", i))}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := buf.Close(ctx); err != nil {
		t.Fatal(err)
	}
	check("a Buffer flush of 20 items", 1, true)

	// A dead item requeued.
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_items`); err != nil {
		t.Fatal(err)
	}
	res := enqueue(quiet, claim.NewItem{Payload: []byte("doomed")})
	notified() // quiet's in-process wake-up
	s := startSession(t, ctx, pool)
	items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(items) != 1 {
		t.Fatalf("claim: %v, %v", items, err)
	}
	if _, err := q.Nack(ctx, items[0], claim.Permanent(errors.New("broken"))); err != nil {
		t.Fatal(err)
	}
	check("a claim and a nack to the dead items", 0, false)
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: res.IDs[0]})); err != nil || !ok {
		t.Fatalf("Requeue: %v, %v", ok, err)
	}
	check("Requeue", 1, true)
}
