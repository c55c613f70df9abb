package worker_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/worker"
)

// The checkpoint test's helper process: a worker whose handler runs steps,
// checkpointing every ten, and which blocks, holding its item, once the
// step named by checkpointStopVar is checkpointed, until it is killed.
const (
	checkpointURLVar  = "CRDBWORK_CHECKPOINT_TEST_URL"
	checkpointStopVar = "CRDBWORK_CHECKPOINT_TEST_STOP"
	checkpointSteps   = 1000
)

// stepHandler runs checkpointSteps steps of its item, resuming from its
// checkpoint: it records where each attempt started (table resumes) and
// each step (table steps, outside any transaction: a side effect a crash
// does not undo), saves a checkpoint and reports progress every ten steps,
// and, if stop > 0, blocks once step stop is checkpointed.
func stepHandler(pool *pgxpool.Pool, stop int) worker.Handler {
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		start := 0
		if len(it.Checkpoint) == 8 {
			start = int(binary.BigEndian.Uint64(it.Checkpoint))
		}
		if _, err := pool.Exec(ctx, `INSERT INTO resumes (item_id, attempt, start, progress_done) VALUES ($1, $2, $3, $4)`,
			it.ID, it.Attempt, start, it.Progress.Done); err != nil {
			return nil, err
		}
		for i := start; i < checkpointSteps; i++ {
			if _, err := pool.Exec(ctx, `INSERT INTO steps (item_id, attempt, step) VALUES ($1, $2, $3)`, it.ID, it.Attempt, i); err != nil {
				return nil, err
			}
			if (i+1)%10 != 0 {
				continue
			}
			if err := worker.SaveCheckpoint(ctx, binary.BigEndian.AppendUint64(nil, uint64(i+1))); err != nil {
				return nil, err
			}
			if err := worker.ReportProgress(ctx, int64(i+1), checkpointSteps); err != nil {
				return nil, err
			}
			if i+1 == stop {
				<-ctx.Done() // held until the process is killed
				return nil, ctx.Err()
			}
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO results (item_id, session_id) VALUES ($1, $2)`, it.ID, it.Session)
			return err
		}, nil
	}
}

// TestCheckpointHelperProcess is the worker process TestCheckpointSurvivesSIGKILL
// kills; it does nothing unless that test starts it.
func TestCheckpointHelperProcess(t *testing.T) {
	u := os.Getenv(checkpointURLVar)
	if u == "" {
		t.Skip("the helper process of TestCheckpointSurvivesSIGKILL")
	}
	var stop int
	fmt.Sscan(os.Getenv(checkpointStopVar), &stop)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(q, stepHandler(pool, stop), worker.Options{Session: fastSession(), Poll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Fatal(w.Run(ctx)) // killed before it returns
}

// TestCheckpointSurvivesSIGKILL runs an item's first attempt in a worker
// process that checkpoints every ten steps of a thousand; once step 500 is
// checkpointed (its progress shows in Progressing), the process is killed
// with SIGKILL while it holds the item. A worker in this process then gets
// the item once the dead session expires, and its attempt starts at step
// 500 with the progress of 500: no step below 500 runs twice, every step
// runs, and the item is acked once.
func TestCheckpointSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	u := testschema.NewURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, ddl := range []string{
		`CREATE TABLE results (item_id UUID NOT NULL, session_id UUID NOT NULL, row_id UUID NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY)`,
		`CREATE TABLE resumes (item_id UUID NOT NULL, attempt INT NOT NULL, start INT NOT NULL, progress_done BIGINT NOT NULL)`,
		`CREATE TABLE steps (item_id UUID NOT NULL, attempt INT NOT NULL, step INT NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	q, err := claim.New(pool, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("steps")})
	if err != nil {
		t.Fatal(err)
	}
	id := ids.IDs[0]

	helper := exec.Command(os.Args[0], "-test.run=^TestCheckpointHelperProcess$", "-test.count=1")
	helper.Env = append(os.Environ(), checkpointURLVar+"="+u, checkpointStopVar+"=500")
	helper.Stdout, helper.Stderr = os.Stderr, os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { helper.Process.Kill(); helper.Wait() })
	// Its progress shows while it runs.
	waitFor(t, "the first attempt's progress to reach 500", 60*time.Second, func() bool {
		list, err := q.Progressing(ctx, 10)
		return err == nil && len(list) == 1 && list[0].Running && list[0].Progress == (claim.Progress{Done: 500, Total: checkpointSteps})
	})
	if err := helper.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	helper.Wait()

	w, err := worker.New(q, stepHandler(pool, 0), worker.Options{Session: fastSession(), Poll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	waitFor(t, "the item to be acked by the second attempt", 60*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, id) == 1
	})
	stopRun()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}

	var attempt, start int
	var progress int64
	if err := pool.QueryRow(ctx, `SELECT attempt, start, progress_done FROM resumes WHERE item_id = $1 ORDER BY attempt DESC LIMIT 1`, id).Scan(&attempt, &start, &progress); err != nil {
		t.Fatal(err)
	}
	if attempt != 2 || start != 500 || progress != 500 {
		t.Fatalf("the second attempt: attempt %d, started at step %d with progress %d; want attempt 2 resuming at 500 with progress 500", attempt, start, progress)
	}
	if n := count(t, pool, `SELECT count(*) FROM steps WHERE item_id = $1 AND attempt = 2 AND step < 500`, id); n != 0 {
		t.Fatalf("%d steps below the checkpoint ran again", n)
	}
	if n := count(t, pool, `SELECT count(DISTINCT step) FROM steps WHERE item_id = $1`, id); n != checkpointSteps {
		t.Fatalf("%d distinct steps ran, want %d", n, checkpointSteps)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 1 {
		t.Fatalf("%d results, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items left", n)
	}
	// Outside a handler there is no item to checkpoint.
	if err := worker.SaveCheckpoint(ctx, []byte("x")); err == nil {
		t.Fatal("SaveCheckpoint outside a handler's context succeeded")
	}
	if err := worker.ReportProgress(ctx, 1, 2); err == nil {
		t.Fatal("ReportProgress outside a handler's context succeeded")
	}
	if st := w.Stats(); st.Checkpoints != 50 || st.ProgressReports != 50 {
		t.Fatalf("the second worker's stats: %d checkpoints, %d progress reports; want 50 each", st.Checkpoints, st.ProgressReports)
	}
}
