package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// A long handler that saves where it is every few steps: when its attempt
// fails (here the first one, on purpose, half-way), the next attempt
// resumes from the checkpoint instead of starting again. Its progress
// shows in `crdbwork status` while it runs.
func ExampleSaveCheckpoint() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE sums (id UUID PRIMARY KEY, total BIGINT NOT NULL, resumed_at BIGINT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	// README:begin checkpoint
	type state struct {
		Next  int   `json:"next"`  // the first step not done
		Total int64 `json:"total"` // the sum so far
	}
	const steps = 100
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		var st state
		if it.Checkpoint != nil { // a retry: resume where the last attempt saved
			if err := json.Unmarshal(it.Checkpoint, &st); err != nil {
				return nil, claim.Permanent(err)
			}
		}
		resumedAt := st.Next
		for ; st.Next < steps; st.Next++ {
			st.Total += int64(st.Next) // one step of the long work
			if st.Next%10 != 9 {
				continue
			}
			cp, _ := json.Marshal(state{Next: st.Next + 1, Total: st.Total})
			if err := worker.SaveCheckpoint(ctx, cp); err != nil {
				return nil, err // the claim was lost: another attempt has the item
			}
			if err := worker.ReportProgress(ctx, int64(st.Next+1), steps); err != nil {
				return nil, err
			}
			if it.Attempt == 1 && st.Next == 49 {
				return nil, errors.New("the first attempt fails half-way")
			}
		}
		return worker.Exec(`INSERT INTO sums (id, total, resumed_at) VALUES ($1, $2, $3)`, it.ID, st.Total, resumedAt), nil
	}
	// README:end checkpoint

	q, err := claim.New(pool, claim.Options{Queue: "sums", BackoffBase: 10 * time.Millisecond, BackoffMax: 10 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(q, handle, worker.Options{
		Poll:    20 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("sum 0..99")}); err != nil {
		log.Fatal(err)
	}
	runUntil(ctx, w, pool, `SELECT count(*) FROM sums`, 1)

	var total, resumedAt int64
	if err := pool.QueryRow(ctx, `SELECT total, resumed_at FROM sums`).Scan(&total, &resumedAt); err != nil {
		log.Fatal(err)
	}
	fmt.Println("total:", total)
	fmt.Println("the second attempt resumed at step", resumedAt)
	fmt.Println("checkpoints saved:", w.Stats().Checkpoints)
	// Output:
	// total: 4950
	// the second attempt resumed at step 50
	// checkpoints saved: 10
}
