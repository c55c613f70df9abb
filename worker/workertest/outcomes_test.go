package workertest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
	"github.com/crdbwork/crdbwork/worker/workertest"
)

// Work reports every outcome a worker's attempt can end with, and where the
// item is afterwards: acked, retried, dead, snoozed, cancelled while the
// handler ran (the handler's context cancelled with the cancel's cause, as
// in a worker) or after it returned, and at-most-once items acked or
// dropped. Each case runs on its own queue of one database that also holds
// a bystander queue's backlog, which no case touches.
//
// Before the fix, a snooze, a cancel and a failing at-most-once item gave
// Outcome(0) and the error "neither acked nor nacked: %!w(<nil>)", and a
// cancel never reached the handler's context.
func TestWorkReportsEveryOutcome(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	by := bystander(t, pool)
	cancelSelf := func(ctx context.Context, it claim.Item) error {
		q, err := claim.New(pool, claim.Options{Queue: it.Queue})
		if err != nil {
			return err
		}
		res, err := q.CancelItem(ctx, it.ID, claim.CancelOptions{By: "ops", Reason: "changed our minds"})
		if err == nil && !res.Running {
			err = fmt.Errorf("cancel result %+v: want the running item asked to stop", res)
		}
		return err
	}
	for _, c := range []struct {
		name       string
		atMostOnce bool
		h          worker.Handler
		want       claim.Outcome
		check      func(t *testing.T, res workertest.Result)
	}{
		{name: "acked", want: claim.Acked, h: func(ctx context.Context, it claim.Item) (worker.Record, error) { return record(it), nil },
			check: func(t *testing.T, res workertest.Result) {
				wantState(t, res, workertest.State{Ended: "acked"})
				wantResults(t, pool, res, 1)
			}},
		{name: "retried", want: claim.Retried, h: func(ctx context.Context, it claim.Item) (worker.Record, error) {
			return nil, errors.New("try later")
		}, check: func(t *testing.T, res workertest.Result) {
			st := res.State
			if !st.Queued || st.Attempts != 1 || st.LastError != "try later" || !st.VestingAt.After(res.Item.VestingAt) {
				t.Fatalf("state %+v: want queued again, one attempt counted, its error, vesting after a backoff", st)
			}
		}},
		{name: "dead", want: claim.Dead, h: func(ctx context.Context, it claim.Item) (worker.Record, error) {
			return nil, claim.Permanent(errors.New("bad input"))
		}, check: func(t *testing.T, res workertest.Result) {
			wantState(t, res, workertest.State{Dead: true, Reason: claim.ReasonPermanent, LastError: "bad input", Attempts: 1, Ended: "dead"})
		}},
		{name: "snoozed", want: claim.Snoozed, h: func(ctx context.Context, it claim.Item) (worker.Record, error) {
			return record(it), worker.Snooze(time.Hour)
		}, check: func(t *testing.T, res workertest.Result) {
			st := res.State
			if !st.Queued || st.Attempts != 0 || st.Snoozes != 1 || st.VestingAt.Sub(res.Item.VestingAt) < 59*time.Minute {
				t.Fatalf("state %+v: want queued again in about an hour, its attempt not counted, one snooze", st)
			}
			var se *claim.SnoozeError
			if !errors.As(res.Err, &se) || se.Delay != time.Hour {
				t.Fatalf("err %v: want the snooze", res.Err)
			}
			wantResults(t, pool, res, 0)
		}},
		{name: "cancelled-while-running", want: claim.Cancelled, h: func(ctx context.Context, it claim.Item) (worker.Record, error) {
			if err := cancelSelf(ctx, it); err != nil {
				return nil, err
			}
			select { // as a worker, Work cancels the handler's context
			case <-ctx.Done():
			case <-time.After(await.Stretch(time.Minute)): // a bound for a broken cancel, stretched with the load
				return nil, errors.New("the handler's context was not cancelled within a minute (stretched) of the cancel")
			}
			ce, ok := worker.Cancelled(ctx)
			if !ok || ce.By != "ops" || ce.Reason != "changed our minds" {
				return nil, fmt.Errorf("the context's cause is %v, want the cancel's", context.Cause(ctx))
			}
			return record(it), ctx.Err()
		}, check: func(t *testing.T, res workertest.Result) {
			if !errors.Is(res.Err, claim.ErrCancelled) {
				t.Fatalf("err %v: want the cancel's cause", res.Err)
			}
			wantState(t, res, workertest.State{Ended: "cancelled"})
			wantResults(t, pool, res, 0)
		}},
		{name: "cancelled-after-return", want: claim.Cancelled, h: func(ctx context.Context, it claim.Item) (worker.Record, error) {
			// The cancel comes after the handler's work: its result
			// cannot be acked any more.
			return record(it), cancelSelf(ctx, it)
		}, check: func(t *testing.T, res workertest.Result) {
			wantState(t, res, workertest.State{Ended: "cancelled"})
			wantResults(t, pool, res, 0)
		}},
		{name: "at-most-once-acked", atMostOnce: true, want: claim.Acked, h: func(ctx context.Context, it claim.Item) (worker.Record, error) {
			return record(it), nil
		}, check: func(t *testing.T, res workertest.Result) {
			wantState(t, res, workertest.State{Ended: "taken"})
			wantResults(t, pool, res, 1)
		}},
		{name: "at-most-once-dropped", atMostOnce: true, want: claim.Dropped, h: func(ctx context.Context, it claim.Item) (worker.Record, error) {
			return record(it), errors.New("lost for good")
		}, check: func(t *testing.T, res workertest.Result) {
			if res.Err == nil || res.Err.Error() != "lost for good" {
				t.Fatalf("err %v: want the handler's", res.Err)
			}
			wantState(t, res, workertest.State{Ended: "taken"})
			wantResults(t, pool, res, 0)
		}},
		{name: "at-most-once-snooze-drops", atMostOnce: true, want: claim.Dropped, h: func(ctx context.Context, it claim.Item) (worker.Record, error) {
			return nil, worker.Snooze(time.Minute)
		}, check: func(t *testing.T, res workertest.Result) {
			wantState(t, res, workertest.State{Ended: "taken"})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := newQueue(t, pool, claim.Options{Queue: "outcome-" + c.name})
			res, err := workertest.Work(ctx, q, c.h, claim.NewItem{Payload: []byte(c.name), AtMostOnce: c.atMostOnce}, workertest.Options{})
			if err != nil {
				t.Fatalf("Work: %v", err)
			}
			if res.Outcome != c.want {
				t.Fatalf("outcome %v (err %v), want %v", res.Outcome, res.Err, c.want)
			}
			c.check(t, res)
		})
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND attempts = 0 AND claim IS NULL`, by); n != 50 {
		t.Errorf("the bystander queue holds %d untouched items, want its 50", n)
	}
	assertNoSession(t, pool)
}

// bystander fills a queue of its own with 50 items and returns its name.
func bystander(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	if err := crsql.Apply(context.Background(), pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{Queue: "bystander"})
	items := make([]claim.NewItem, 50)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(fmt.Sprint(i))}
	}
	if _, err := q.Enqueue(context.Background(), items...); err != nil {
		t.Fatal(err)
	}
	return q.Name()
}

// wantState checks the item's state after Work against want (VestingAt is
// not compared).
func wantState(t *testing.T, res workertest.Result, want workertest.State) {
	t.Helper()
	got := res.State
	got.VestingAt = time.Time{}
	if got != want {
		t.Fatalf("state %+v, want %+v", got, want)
	}
}

// wantResults checks that the handler's Record wrote n rows for the item.
func wantResults(t *testing.T, pool *pgxpool.Pool, res workertest.Result, n int) {
	t.Helper()
	if got := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, res.Item.ID); got != n {
		t.Fatalf("%d results for the item, want %d", got, n)
	}
}

// A settle that cannot happen (the item's claim lost other than by a
// cancel: here the queue is purged while the handler runs) is an error of
// Work that says why, not an outcome.
func TestWorkReportsAnUnsettledItem(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "purged"})
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		_, err := q.Purge(ctx, claim.PurgeOptions{})
		return record(it), err
	}
	res, err := workertest.Work(ctx, q, h, claim.NewItem{Payload: []byte("x")}, workertest.Options{})
	if err == nil || !errors.Is(err, claim.ErrClaimLost) || strings.Contains(err.Error(), "%!") {
		t.Fatalf("Work = (%v, %v); want an error wrapping ErrClaimLost", res.Outcome, err)
	}
	wantResults(t, pool, res, 0)
}
