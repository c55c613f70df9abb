package worker_test

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
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/worker"
)

// The documented recovery from an unknown enqueue, with real workers: a
// buffered enqueue of caller-given ids commits but its COMMIT's answer is
// lost; a worker handles and acks every item; the producer then enqueues
// the same ids again, as the docs say. The retry adds nothing and reports
// every id done: each handler ran exactly once and wrote one result. An
// at-most-once item (whose claim deletes it) is never started twice either.
func TestRetryAfterUnknownBufferedEnqueueRunsOnce(t *testing.T) {
	t.Parallel()
	for _, atMostOnce := range []bool{false, true} {
		t.Run(fmt.Sprintf("at-most-once=%v", atMostOnce), func(t *testing.T) {
			t.Parallel()
			direct := setup(t)
			ctx := context.Background()
			pool, proxy := proxied(t, direct, 4)
			testdb.Quiet(t, direct) // the COMMIT whose answer is dropped commits (no injected 40001)
			q, err := claim.New(pool, claim.Options{Queue: "dedup"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("warm-up"), Priority: -1}); err != nil {
				t.Fatal(err) // the schema check runs before the fault
			}
			const n = 4
			buf, err := claim.NewBuffer(q, claim.BufferOptions{MaxItems: n, MaxWait: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = buf.Close(ctx) }()
			ids := make([]uuid.UUID, n)
			for i := range ids {
				ids[i] = uuid.New()
			}
			item := func(i int) claim.NewItem {
				return claim.NewItem{ID: ids[i], Payload: []byte(fmt.Sprint(i)), AtMostOnce: atMostOnce}
			}
			proxy.Arm(faultproxy.Rule{Match: faultproxy.IsCommit, Action: faultproxy.DropAnswer})
			errs := make(chan error, n)
			for i := range n {
				go func() {
					res, err := buf.Enqueue(ctx, item(i))
					if err == nil || len(res.IDs) != 1 || res.IDs[0] != ids[i] {
						err = fmt.Errorf("item %d: ids %v, %v; want its id and an unknown outcome", i, res.IDs, err)
					} else if !errors.Is(err, claim.ErrOutcomeUnknown) {
						err = fmt.Errorf("item %d: %w; want an unknown outcome", i, err)
					} else {
						err = nil
					}
					errs <- err
				}()
			}
			for range n {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if proxy.Fired() != 1 {
				t.Fatalf("the fault fired %d times, want 1", proxy.Fired())
			}

			var mu sync.Mutex
			runs := map[uuid.UUID]int{}
			h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
				mu.Lock()
				runs[it.ID]++
				mu.Unlock()
				return func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO results (item_id, session_id, part, owned) VALUES ($1, $2, 0, false)`, it.ID, it.Session)
					return err
				}, nil
			}
			// One handler at a time: items are handled in claim order, so
			// once the sentinel (a later priority) is handled, every item
			// enqueued before it has been.
			w := startOn(t, newQueue(t, direct, claim.Options{Queue: "dedup"}), h, worker.Options{Concurrency: 1, Poll: 50 * time.Millisecond})
			waitFor(t, "the first copies to be handled", time.Minute, func() bool {
				return count(t, direct, `SELECT count(*) FROM results WHERE item_id = ANY($1)`, ids) == n
			})

			// The documented recovery: enqueue again with the same ids.
			for i := range n {
				go func() {
					res, err := buf.Enqueue(ctx, item(i))
					switch {
					case err != nil || len(res.IDs) != 1 || res.IDs[0] != ids[i]:
						err = fmt.Errorf("retry of item %d: %+v, %v", i, res, err)
					case res.New[0] || !res.Done[0]:
						err = fmt.Errorf("retry of item %d: new %v, done %v; its first copy was already handled", i, res.New[0], res.Done[0])
					}
					errs <- err
				}()
			}
			for range n {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
			res, err := q.Enqueue(ctx, item(0), item(1))
			if err != nil {
				t.Fatal(err)
			}
			for i, done := range res.Done {
				if res.New[i] || !done {
					t.Errorf("Enqueue of handled item %d: new %v, done %v; want done", i, res.New[i], done)
				}
			}
			sentinel, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("sentinel"), Priority: 1})
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the sentinel to be handled", time.Minute, func() bool {
				return count(t, direct, `SELECT count(*) FROM results WHERE item_id = $1`, sentinel.IDs[0]) == 1
			})
			w.Stop(t)
			mu.Lock()
			defer mu.Unlock()
			for i, id := range ids {
				if runs[id] != 1 {
					t.Errorf("item %d: its handler ran %d times, want 1", i, runs[id])
				}
			}
			if c := count(t, direct, `SELECT count(*) FROM results WHERE item_id = ANY($1)`, ids); c != n {
				t.Errorf("%d results for %d items", c, n)
			}
		})
	}
}
