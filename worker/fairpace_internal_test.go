package worker

import (
	"context"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
)

// paceAt returns a fairPace whose head reads come from heads (one per read,
// the last repeated; each in part 7) and whose queue is fair, after a claim
// of 100 items at turns base+0..99 µs (density 1 item per µs).
func paceAt(t *testing.T, base time.Time, heads ...time.Duration) *fairPace {
	t.Helper()
	p := &fairPace{
		readFront: func(_ context.Context, priority int64, skip int) (time.Time, int, bool, error) {
			if priority != 0 || skip < 0 || skip > paceSkip {
				t.Errorf("head read at priority %d past %d items; want priority 0, 0 to %d", priority, skip, paceSkip)
			}
			h := heads[0]
			if len(heads) > 1 {
				heads = heads[1:]
			}
			return base.Add(h), 7, true, nil
		},
		isFairNow: func(context.Context) (bool, error) { return true, nil },
	}
	items := make([]claim.Item, 100)
	for i := range items {
		items[i] = claim.Item{Tenant: "t", TurnAt: base.Add(time.Duration(i) * time.Microsecond)}
	}
	p.claimed(items)
	if !p.known || !p.front.Equal(base.Add(99*time.Microsecond)) || p.density != 1 {
		t.Fatalf("after a claim of turns 0..99 µs: known %v, front %v, density %v; want the last turn and 1 item per µs", p.known, p.front.Sub(base), p.density)
	}
	return p
}

// The pacing bounds how far ahead of the queue's head a session's claims
// reach, without shrinking them: a session within paceClaims claims of the
// head claims at once (and reads nothing while the last head it read says
// so), one further ahead waits until the head comes within reach, unless
// the head is in its own parts, does not move, or the queue is not fair.
func TestFairPaceBoundsTheLead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	other := func() []int { return []int{0, 1, 2, 3} }
	us := time.Microsecond

	// Front at 99 µs, a claim of 100 reaches 199 µs; the slack of
	// paceClaims (2) such claims is 200 µs: a head at 0 is within it.
	p := paceAt(t, base, 0)
	p.wait(ctx, 100, other)
	if p.reads != 1 || p.waits != 0 {
		t.Errorf("head within reach: %d reads, %d waits; want 1 read, no wait", p.reads, p.waits)
	}
	// The same claim again: the head read before still says it is within
	// reach, so nothing is read.
	p.wait(ctx, 100, other)
	if p.reads != 1 {
		t.Errorf("head read before within reach: %d reads; want no new one", p.reads)
	}

	// A claim of 10 reaches 109 µs, with a slack of 20 µs: a head at 50 µs
	// is too far behind; it moves to 60, then 90 µs, within reach.
	p = paceAt(t, base, 50*us, 60*us, 90*us)
	p.wait(ctx, 10, other)
	if p.reads != 3 || p.waits != 1 || !p.head.Equal(base.Add(90*us)) {
		t.Errorf("session ahead: %d reads, %d waits, head at %v; want 3 reads, one wait, until the head reached 90µs", p.reads, p.waits, p.head.Sub(base))
	}

	// The head in the session's own parts: its claim takes it.
	p = paceAt(t, base, 10*us)
	p.wait(ctx, 10, func() []int { return []int{6, 7} })
	if p.reads != 1 || p.waits != 0 {
		t.Errorf("head in the session's parts: %d reads, %d waits; want 1 read, no wait", p.reads, p.waits)
	}

	// A head that does not move: the wait ends, and the next one does not
	// wait for that head again.
	p = paceAt(t, base, 10*us)
	p.wait(ctx, 10, other)
	if p.waits != 1 || !p.stuck.Equal(base.Add(10*us)) {
		t.Errorf("stuck head: %d waits, stuck at %v; want one wait, then stuck at 10µs", p.waits, p.stuck.Sub(base))
	}
	reads := p.reads
	p.wait(ctx, 10, other)
	if p.waits != 1 || p.reads != reads+1 {
		t.Errorf("stuck head again: %d waits, %d reads; want no new wait, one read", p.waits, p.reads-reads)
	}

	// Not a fair queue: no read, no wait.
	p = paceAt(t, base, 10*us)
	p.isFairNow = func(context.Context) (bool, error) { return false, nil }
	p.wait(ctx, 10, other)
	if p.reads != 0 || p.waits != 0 {
		t.Errorf("plain queue: %d reads, %d waits; want none", p.reads, p.waits)
	}

	// A claim with an item behind the front (a newcomer at the head) does
	// not move the front back; items without a tenant leave it alone.
	p = paceAt(t, base, 0)
	p.claimed([]claim.Item{{Tenant: "new", TurnAt: base.Add(3 * us)}})
	p.claimed([]claim.Item{{TurnAt: base.Add(500 * us)}})
	if !p.front.Equal(base.Add(99 * us)) {
		t.Errorf("front at %v after a straggler and an item without a tenant; want 99µs", p.front.Sub(base))
	}
}
