package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// Workers whose acks go through Options.BatchStatement (on PostgreSQL one
// pipelined round trip per ack transaction) release the dependents of what
// they ack at once, as the ordinary ack does: two chains of four links, in
// two queues of one database (beside a third queue's backlog), each worked
// by its own worker, end without any reap. The sessions' heartbeat is ten
// minutes, so a worker's first queue reap (every five heartbeats, jittered)
// comes 25 minutes or more after its start, far past the wait below: the
// release after each ack is the only way forward.
//
// Before the fix the pipelined ack returned before the release, and each
// link waited for a reap.
func TestBatchStatementAcksReleaseDependents(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	enqueue(t, pool, "bystander", 200, true)
	stmt := func(acked []claim.AckRequest) (string, []any) {
		ids := make([]uuid.UUID, len(acked))
		sessions := make([]uuid.UUID, len(acked))
		for i, r := range acked {
			ids[i], sessions[i] = r.Item.ID, r.Item.Session
		}
		return `INSERT INTO results (item_id, session_id, part, owned)
			SELECT i, s, 0, true FROM unnest($1::UUID[], $2::UUID[]) AS u(i, s)`, []any{ids, sessions}
	}
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) { return nil, nil }
	slow := session.Tuning{Heartbeat: 10 * time.Minute, Expiry: 30 * time.Minute}
	const links = 4
	queues := []string{"chain-a", "chain-b"}
	chains := map[string][]uuid.UUID{}
	for _, name := range queues {
		q := newQueue(t, pool, claim.Options{Queue: name})
		ids := make([]uuid.UUID, links)
		items := make([]claim.NewItem, links)
		for i := range ids {
			ids[i] = uuid.New()
			items[i] = claim.NewItem{ID: ids[i], Payload: []byte(fmt.Sprint(i))}
			if i > 0 {
				items[i].After = []uuid.UUID{ids[i-1]}
			}
		}
		if _, err := q.Enqueue(ctx, items...); err != nil {
			t.Fatal(err)
		}
		chains[name] = ids
		startOn(t, newQueue(t, pool, claim.Options{Queue: name}), h, worker.Options{BatchStatement: stmt, Session: slow})
	}
	waitFor(t, "both chains to end", 2*time.Minute, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue = ANY($1) AND outcome = 'acked'`, queues) == 2*links
	})
	for _, name := range queues {
		ids := chains[name]
		// Each link was acked (its result written) once, in chain order.
		var ordered bool
		if err := pool.QueryRow(ctx, `SELECT bool_and(prev.tx_at < next.tx_at) FROM
			unnest($1::UUID[], $2::UUID[]) AS u (a, b)
			JOIN results AS prev ON prev.item_id = u.a
			JOIN results AS next ON next.item_id = u.b`, ids[:links-1], ids[1:]).Scan(&ordered); err != nil {
			t.Fatal(err)
		}
		if !ordered {
			t.Errorf("queue %s: the links were not acked in chain order", name)
		}
		if n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = ANY($1)`, ids); n != links {
			t.Errorf("queue %s: %d results, want %d", name, n, links)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_waiting`) + count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`); n != 0 {
		t.Errorf("%d waiting or dead items left", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'bystander'`); n != 200 {
		t.Errorf("the bystander queue holds %d items, want its 200", n)
	}
}
