package claim_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
)

// Every way an item can be acked releases its dependents right after the
// ack commits, the same way: a chain of four links, each acked by the path
// under test, moves on without any Reap (none runs in this test, so the
// release after the ack is the only way forward). The paths: Ack; AckMany
// with a BatchRecord; AckMany with a BatchStatement alone (on PostgreSQL
// one pipelined round trip); a BatchStatement with a BatchRecord; an
// at-most-once chain (the claim deletes each link, the ack records its
// result) by Ack and by a BatchStatement; and a chain of one key in a
// sequenced queue. The queues share the database with a bystander queue
// whose dependent waits for an item nobody acks: it stays waiting.
//
// Before the fix, the pipelined BatchStatement ack and the acks of
// at-most-once items released nothing: the chain's second link stayed
// waiting until a reap.
func TestEveryAckPathReleasesDependents(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)

	// The bystander: a queue with plain items, a dead item and a dependent
	// whose prerequisite is never acked.
	by := newQueue(t, pool, claim.Options{Queue: "bystander"})
	held := uuid.New()
	if _, err := by.Enqueue(ctx, claim.NewItem{ID: held, Payload: []byte("held")},
		claim.NewItem{Payload: []byte("waits"), After: []uuid.UUID{held}}); err != nil {
		t.Fatal(err)
	}
	if _, err := by.Enqueue(ctx, payloads(50)...); err != nil {
		t.Fatal(err)
	}

	stmt := func(acked []claim.AckRequest) (string, []any) {
		ids := make([]uuid.UUID, len(acked))
		sessions := make([]uuid.UUID, len(acked))
		for i, r := range acked {
			ids[i], sessions[i] = r.Item.ID, r.Item.Session
		}
		return `INSERT INTO results (item_id, session_id) SELECT * FROM unnest($1::UUID[], $2::UUID[])`, []any{ids, sessions}
	}
	batch := func(ctx context.Context, tx pgx.Tx, acked []claim.AckRequest) error {
		for _, r := range acked {
			if _, err := tx.Exec(ctx, `INSERT INTO results (item_id, session_id) VALUES ($1, $2)`, r.Item.ID, r.Item.Session); err != nil {
				return err
			}
		}
		return nil
	}
	ackMany := func(opts claim.AckOptions) func(q *claim.Queue, it claim.Item) error {
		return func(q *claim.Queue, it claim.Item) error {
			return q.AckMany(ctx, []claim.AckRequest{{Item: it}}, opts)[0]
		}
	}
	ack := func(q *claim.Queue, it claim.Item) error { return q.Ack(ctx, it, record(it)) }

	for _, c := range []struct {
		name       string
		atMostOnce bool
		key        string // the chain's key, in a sequenced queue
		ack        func(q *claim.Queue, it claim.Item) error
	}{
		{name: "ack", ack: ack},
		{name: "batch-record", ack: ackMany(claim.AckOptions{Batch: batch})},
		{name: "batch-statement", ack: ackMany(claim.AckOptions{Statement: stmt})},
		{name: "statement-and-batch", ack: ackMany(claim.AckOptions{Statement: stmt, Batch: batch})},
		{name: "at-most-once", atMostOnce: true, ack: ack},
		{name: "at-most-once-statement", atMostOnce: true, ack: ackMany(claim.AckOptions{Statement: stmt})},
		{name: "sequenced", key: "k", ack: ackMany(claim.AckOptions{Statement: stmt})},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := "chain-" + c.name
			producer := newQueue(t, pool, claim.Options{Queue: name})
			if c.key != "" {
				if err := producer.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On}); err != nil {
					t.Fatal(err)
				}
			}
			const links = 4
			ids := make([]uuid.UUID, links)
			items := make([]claim.NewItem, links)
			for i := range ids {
				ids[i] = uuid.New()
				items[i] = claim.NewItem{ID: ids[i], Payload: []byte(fmt.Sprint(i)), Key: c.key, AtMostOnce: c.atMostOnce}
				if i > 0 {
					items[i].After = []uuid.UUID{ids[i-1]}
				}
			}
			if _, err := producer.Enqueue(ctx, items...); err != nil {
				t.Fatal(err)
			}
			// The worker's Queue is another value, as in another process:
			// it finds out about the dependencies by its own probe.
			w := newQueue(t, pool, claim.Options{Queue: name})
			for i, id := range ids {
				got := claimEvery(t, w, s.ID())
				if len(got) != 1 || got[0].ID != id {
					t.Fatalf("link %d: claimed %d items (%v), want link %d alone: the ack of link %d did not release it", i, len(got), idSet(got), i, i-1)
				}
				if err := c.ack(w, got[0]); err != nil {
					t.Fatalf("link %d: ack: %v", i, err)
				}
			}
			if n, err := waitingOf(w.Inspect(ctx)); err != nil || n != 0 {
				t.Fatalf("%d items still waiting (%v)", n, err)
			}
			if st := w.Stats(); st.Unblocked != links-1 {
				t.Fatalf("Stats.Unblocked = %d, want %d", st.Unblocked, links-1)
			}
			if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue = $1 AND id = ANY($2)`, name, ids); n != links {
				t.Fatalf("%d links ended, want %d", n, links)
			}
		})
	}
	if n, err := waitingOf(by.Inspect(ctx)); err != nil || n != 1 {
		t.Fatalf("the bystander queue has %d waiting items (%v), want its one dependent still waiting", n, err)
	}
}
