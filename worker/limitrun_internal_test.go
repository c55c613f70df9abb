package worker

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

// TestLimitsAreDatedFromTheirRead has a read of the limits take half of
// StaleAfter (held up behind a lock, by retries, on a busy machine): the
// values it returns are those of its start, so they are stale StaleAfter
// after the read started, not after it ended. They used to be dated from
// the read's end, which stretched the time a session went on with a limit
// lowered meanwhile by however long its reads took.
func TestLimitsAreDatedFromTheirRead(t *testing.T) {
	t.Parallel()
	pool := testschema.New(t)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const staleAfter = time.Second
	w, err := New(q, func(context.Context, claim.Item) (Record, error) { return nil, nil },
		Options{Parts: 4, Limits: LimitOptions{Refresh: 100 * time.Millisecond, Grace: 200 * time.Millisecond, StaleAfter: staleAfter}})
	if err != nil {
		t.Fatal(err)
	}
	var started time.Time
	w.limitSource = func(ctx context.Context) (Limits, time.Time, error) {
		started = time.Now()
		// The read returns once half of StaleAfter has passed: a
		// condition on the clock, which a busy machine only makes later.
		for time.Since(started) < staleAfter/2 {
			select {
			case <-ctx.Done():
				return Limits{}, time.Time{}, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		return Limits{Queue: claim.Limit{MaxInFlight: 4}}, time.Time{}, nil
	}
	lim := newLimiter(w.opts.Limits)
	w.refreshLimits(ctx, nil, lim, zap.NewNop())
	// The session owns every part: past Grace its share is the whole limit
	// while the limits are fresh.
	all := []int{0, 1, 2, 3}
	lim.plan(started, 8, all)
	fresh := started.Add(staleAfter / 2) // when the read returned
	if p := lim.plan(fresh, 8, all); p.n != 4 {
		t.Fatalf("plan %+v as the read returned: want the share of 4", p)
	}
	if st := lim.stats(fresh); st.Stale || st.FailedReads != 0 || st.Limits.Queue.MaxInFlight != 4 {
		t.Fatalf("limit stats %+v as the read returned: want the limit of 4, fresh", st)
	}
	past := started.Add(staleAfter + time.Millisecond)
	if st := lim.stats(past); !st.Stale {
		t.Errorf("limit stats %+v StaleAfter after the read started: want stale", st)
	}
	if p := lim.plan(past, 8, all); p.n != 0 || !p.full {
		t.Errorf("plan %+v StaleAfter after the read started: want nothing claimed until a read succeeds", p)
	}
}
