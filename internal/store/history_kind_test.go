package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/store"
)

// TestEndedRecordsKeepTheKind: the ended record of an acked item and of a
// taken (at-most-once) item keeps the item's kind, written by the ack's
// and the take's own statement on both dialects' texts (and by the
// pipelined ack), and the history reads (EndedOfID, the ended list) give
// it back; an item without a kind reads as none, and so does an ended row
// written without the column, as code of versions 3 to 5 writes it.
func TestEndedRecordsKeepTheKind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := applied(t)
	session, err := st.SessionsCreate(ctx, pool, time.Hour, "h", 1, "w")
	if err != nil {
		t.Fatal(err)
	}
	// claimOne adds one unclaimed item of queue q (kind "": none) and
	// claims it for session.
	claimOne := func(q, kind string, atMostOnce bool) store.ClaimKey {
		t.Helper()
		var k *string
		if kind != "" {
			k = &kind
		}
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, part, payload, kind, at_most_once)
			VALUES (gen_random_uuid(), $1, 0, '\x00'::BYTEA, $2, $3)`, q, k, atMostOnce); err != nil {
			t.Fatal(err)
		}
		rows, err := st.ItemsClaimAny(ctx, pool, store.Postgres, store.ClaimArgs{Session: session, Queue: q, Limit: 1, Lease: time.Hour})
		if err != nil || len(rows) != 1 {
			t.Fatalf("claiming the item of %s: %d rows, %v", q, len(rows), err)
		}
		return store.ClaimKey{ID: rows[0].ID, Session: session, Token: rows[0].Token}
	}
	ack := func(d store.Dialect, key store.ClaimKey) {
		t.Helper()
		tx, err := pool.BeginTx(ctx, store.AckTxOptions(d))
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if ids, err := st.ItemsAck(ctx, tx, d, []store.ClaimKey{key}); err != nil || len(ids) != 1 {
			t.Fatalf("ack: %v, %v", ids, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	type ended struct {
		queue, outcome, kind string
		id                   uuid.UUID
	}
	var want []ended
	for _, c := range []struct {
		name string
		d    store.Dialect
	}{{"cockroach", store.Cockroach}, {"postgres", store.Postgres}} {
		for _, kind := range []string{"send_mail", ""} {
			q := "acked-" + c.name + "-" + kind
			key := claimOne(q, kind, false)
			ack(c.d, key)
			want = append(want, ended{q, store.OutcomeAcked, kind, key.ID})

			q = "taken-" + c.name + "-" + kind
			key = claimOne(q, kind, true)
			if ids, err := st.ItemsTakeAtMostOnce(ctx, pool, c.d, []store.ClaimKey{key}); err != nil || len(ids) != 1 {
				t.Fatalf("take (%s): %v, %v", c.name, ids, err)
			}
			want = append(want, ended{q, store.OutcomeTaken, kind, key.ID})
		}
	}
	// The pipelined ack (PostgreSQL): the same statement with its guard.
	key := claimOne("acked-pipeline", "resize", false)
	pipelined(t, pool, st, key)
	want = append(want, ended{"acked-pipeline", store.OutcomeAcked, "resize", key.ID})
	// An ended row of code older than version 6: no kind, no history.
	old := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_ended (queue, id, ended_at, outcome) VALUES ('old', $1, now(), 'acked')`, old); err != nil {
		t.Fatal(err)
	}
	want = append(want, ended{"old", store.OutcomeAcked, "", old})

	for _, w := range want {
		rows, err := st.EndedOfID(ctx, pool, []string{w.queue}, w.id)
		if err != nil || len(rows) != 1 {
			t.Fatalf("EndedOfID of the %s item of %s: %+v, %v", w.outcome, w.queue, rows, err)
		}
		if r := rows[0]; r.Outcome != w.outcome || r.Kind != w.kind {
			t.Errorf("EndedOfID of the %s item of %s: outcome %q kind %q; want %q, %q", w.outcome, w.queue, r.Outcome, r.Kind, w.outcome, w.kind)
		}
		list, err := st.ItemsList(ctx, pool, store.ListEnded, w.queue, store.ListFilter{}, []string{store.OutcomeAcked, store.OutcomeTaken},
			store.ListStart(store.ListEnded), 10)
		if err != nil || len(list) != 1 {
			t.Fatalf("the ended list of %s: %+v, %v", w.queue, list, err)
		}
		if r := list[0]; r.ID != w.id || r.Outcome != w.outcome || r.Kind != w.kind {
			t.Errorf("the ended list of %s: %s %q kind %q; want %s %q kind %q", w.queue, r.ID, r.Outcome, r.Kind, w.id, w.outcome, w.kind)
		}
	}
}

// pipelined acks key with the pipelined ack transaction (ItemsAckPipeline).
func pipelined(t *testing.T, pool *pgxpool.Pool, st *store.Store, key store.ClaimKey) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	b := st.ItemsAckPipeline([]store.ClaimKey{key}, nil)
	br := conn.SendBatch(ctx, b)
	_, err = store.ReadAckPipeline(br, b)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("the pipelined ack: %v", err)
	}
}
