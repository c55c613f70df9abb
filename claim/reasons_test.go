package claim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
)

// Every reason an item can end with is a filter of DeadItems, its count and
// Requeue: the fixed reasons exactly, "dependency died" every dependency
// death, "dependency died: <id or its start>" one prerequisite's; anything
// else is refused with ErrUnknownReason (before, only four reasons matched
// and "dependency died: …" matched nothing).
func TestDeadFilterEveryReason(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	base := time.Now().UTC().Truncate(time.Microsecond).Add(-time.Hour)
	p1, p2 := uuid.MustParse("aaaaaaaa-0000-4000-8000-000000000001"), uuid.MustParse("bbbbbbbb-0000-4000-8000-000000000002")
	reasons := []string{claim.ReasonFailed, claim.ReasonPermanent, claim.ReasonCrashLoop, claim.ReasonExpired,
		claim.ReasonSnoozedTooOften, claim.ReasonCancelled, claim.ReasonRefused,
		claim.ReasonDependencyDied + p1.String(), claim.ReasonDependencyDied + p1.String(), claim.ReasonDependencyDied + p2.String()}
	var deaths []adminDeath
	for i, r := range reasons {
		deaths = append(deaths, adminDeath{id: uuid.New(), death: uuid.New(), queue: "q", reason: r, lastError: "e", diedAt: base.Add(time.Duration(i) * time.Second)})
	}
	// Another queue's dependency death never shows.
	deaths = append(deaths, adminDeath{id: uuid.New(), death: uuid.New(), queue: "other", reason: claim.ReasonDependencyDied + p1.String(), diedAt: base})
	seedDeaths(t, pool, deaths)
	q := newQueue(t, pool, claim.Options{Queue: "q"})

	for _, c := range []struct {
		filter string
		want   int
	}{
		{claim.ReasonFailed, 1}, {claim.ReasonPermanent, 1}, {claim.ReasonCrashLoop, 1}, {claim.ReasonExpired, 1},
		{claim.ReasonSnoozedTooOften, 1}, {claim.ReasonCancelled, 1}, {claim.ReasonRefused, 1},
		{"dependency died", 3}, {"dependency died: ", 3}, {"dependency died: " + p1.String(), 2},
		{"dependency died: aaaaaaaa", 2}, {"dependency died: BBBBBBBB", 1}, {"dependency died: cc", 0},
	} {
		f := claim.DeadFilter{Reason: c.filter}
		page, err := q.DeadItems(ctx, claim.DeadQuery{DeadFilter: f, Count: true})
		if err != nil {
			t.Errorf("reason %q: %v", c.filter, err)
			continue
		}
		if len(page.Items) != c.want || page.Count != int64(c.want) {
			t.Errorf("reason %q: %d items, count %d; want %d", c.filter, len(page.Items), page.Count, c.want)
		}
		for _, d := range page.Items {
			if !claim.MatchReason(c.filter, d.Reason) {
				t.Errorf("reason %q listed a death of reason %q, which MatchReason does not match", c.filter, d.Reason)
			}
		}
	}
	for _, bad := range []string{"fail", "Failed", "dependency died: …", "dependency died: not-an-id", "snoozed"} {
		if _, err := q.DeadItems(ctx, claim.DeadQuery{DeadFilter: claim.DeadFilter{Reason: bad}}); !errors.Is(err, claim.ErrUnknownReason) {
			t.Errorf("reason %q: %v, want ErrUnknownReason", bad, err)
		}
		if _, err := q.Requeue(ctx, claim.RequeueOptions{Filter: claim.DeadFilter{Reason: bad}}); !errors.Is(err, claim.ErrUnknownReason) {
			t.Errorf("requeue by reason %q: %v, want ErrUnknownReason", bad, err)
		}
	}

	// Requeue by a prerequisite's deaths moves those two, and only those.
	res, err := q.Requeue(ctx, claim.RequeueOptions{Filter: claim.DeadFilter{Reason: "dependency died: " + p1.String()}})
	if err != nil || res.Requeued != 2 {
		t.Fatalf("requeue of p1's dependents: %+v, %v; want 2 requeued", res, err)
	}
	page, err := q.DeadItems(ctx, claim.DeadQuery{Count: true})
	if err != nil || page.Count != int64(len(reasons)-2) {
		t.Fatalf("after the requeue: %d deaths, %v; want %d", page.Count, err, len(reasons)-2)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'other'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the other queue's dead items: %d, %v; want 1 (untouched)", n, err)
	}
}
