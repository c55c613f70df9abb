package worker

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
)

// TestSpreadAddsUpToTheLimit checks that the slots' units add up to the
// limit exactly, each slot getting the limit over the slots rounded down or
// up, whatever the offset, and that a run of consecutive slots gets its
// proportional share within one.
func TestSpreadAddsUpToTheLimit(t *testing.T) {
	t.Parallel()
	for total := int64(0); total <= 70; total++ {
		for n := 1; n <= 40; n++ {
			for _, off := range []int{0, 1, n / 2, n - 1, n + 3, -2} {
				var sum int64
				for s := range n {
					u := spread(total, n, []int{s}, off)
					if u != total/int64(n) && u != total/int64(n)+1 {
						t.Fatalf("total %d, n %d, offset %d: slot %d gets %d", total, n, off, s, u)
					}
					sum += u
				}
				if sum != total {
					t.Fatalf("total %d, n %d, offset %d: slots add up to %d", total, n, off, sum)
				}
				for a := 0; a < n; a++ {
					for b := a + 1; b <= n; b++ {
						run := make([]int, 0, b-a)
						for s := a; s < b; s++ {
							run = append(run, (s+off+n)%n)
						}
						got := float64(spread(total, n, run, off))
						want := float64(total) * float64(b-a) / float64(n)
						if math.Abs(got-want) >= 1 {
							t.Fatalf("total %d, n %d, offset %d: run [%d,%d) gets %v, proportional %v", total, n, off, a, b, got, want)
						}
					}
				}
			}
		}
	}
}

// TestRotationVisitsEverySlot checks that a limit smaller than the number
// of slots gives every slot a unit within n epochs, and that shares add up
// to the limit in every epoch.
func TestRotationVisitsEverySlot(t *testing.T) {
	t.Parallel()
	const n = 16
	for _, total := range []int{1, 3, 15} {
		got := make([]bool, n)
		for epoch := range int64(n) {
			var sum int64
			for s := range n {
				v := view{ok: true, n: n, slots: []int{s}, epoch: epoch}
				c, _ := v.queueShare(claim.Limit{MaxInFlight: total})
				sum += c
				got[s] = got[s] || c > 0
			}
			if sum != int64(total) {
				t.Fatalf("limit %d, epoch %d: shares add up to %d", total, epoch, sum)
			}
		}
		for s, ok := range got {
			if !ok {
				t.Errorf("limit %d: slot %d never got a unit in %d epochs", total, s, n)
			}
		}
	}
}

// TestShareGrowsAfterGraceShrinksAtOnce checks the limiter's window: a new
// session claims nothing for Grace, a share that grows is used only after
// Grace, and a share that shrinks is used at once.
func TestShareGrowsAfterGraceShrinksAtOnce(t *testing.T) {
	t.Parallel()
	opts, err := LimitOptions{Refresh: 100 * time.Millisecond, Grace: time.Second, Rotate: time.Hour}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	l := newLimiter(opts)
	t0 := time.Unix(1000, 0)
	lims := Limits{Queue: claim.Limit{MaxInFlight: 16}}
	l.set(t0, lims, time.Time{}, 16, -1, 0)
	half := []int{0, 1, 2, 3, 4, 5, 6, 7}
	if p := l.plan(t0, 100, half); p.n != 0 || !p.full {
		t.Fatalf("new session: plan %+v, want nothing", p)
	}
	if p := l.plan(t0.Add(999*time.Millisecond), 100, half); p.n != 0 {
		t.Fatalf("before Grace: plan %+v, want nothing", p)
	}
	if p := l.plan(t0.Add(time.Second), 100, half); p.n != 8 {
		t.Fatalf("after Grace: plan %+v, want 8 (8 of 16 parts of 16)", p)
	}
	for range 5 {
		if !l.admit(t0.Add(time.Second), "") {
			t.Fatal("an item without tenant was refused")
		}
	}
	all := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	t1 := t0.Add(2 * time.Second)
	if p := l.plan(t1, 100, all); p.n != 3 {
		t.Fatalf("share just grew: plan %+v, want 3 (old share 8, 5 in flight)", p)
	}
	if p := l.plan(t1.Add(time.Second+time.Millisecond), 100, all); p.n != 11 {
		t.Fatalf("share grew Grace ago: plan %+v, want 11 (16, 5 in flight)", p)
	}
	if p := l.plan(t1.Add(time.Second+2*time.Millisecond), 100, []int{0, 1}); p.n != 0 || !p.full {
		t.Fatalf("share shrank to 2 with 5 in flight: plan %+v, want nothing", p)
	}
	for range 4 {
		l.done("")
	}
	if p := l.plan(t1.Add(time.Second+3*time.Millisecond), 100, []int{0, 1}); p.n != 1 {
		t.Fatalf("share 2 with 1 in flight: plan %+v, want 1", p)
	}
}

// TestRateBucket checks that a session's token bucket allows at most its
// share of the rate plus one bucket over a window, starting empty.
func TestRateBucket(t *testing.T) {
	t.Parallel()
	// Read once: the limits must not go stale during the 11 s simulated.
	opts, _ := LimitOptions{Grace: time.Second, Refresh: 100 * time.Millisecond, Burst: 100 * time.Millisecond, StaleAfter: time.Hour}.withDefaults()
	l := newLimiter(opts)
	t0 := time.Unix(1000, 0)
	l.set(t0, Limits{Queue: claim.Limit{Rate: 100}}, time.Time{}, 0, 1, 4) // rank 1 of 4: 25 items/s
	l.plan(t0, 100, nil)
	started := 0
	start := t0.Add(time.Second)
	for at := start; at.Before(start.Add(10 * time.Second)); at = at.Add(time.Millisecond) {
		p := l.plan(at, 1000, nil)
		for range p.n {
			if l.admit(at, "") {
				started++
				l.done("")
			}
		}
	}
	// 25 items/s over 10 s, plus a bucket of max(1, 2.5) tokens.
	if started > 250+2 || started < 245 {
		t.Fatalf("%d items started in 10 s at a share of 25/s", started)
	}
}

// TestTenantShares checks that without parts a tenant's limit is spread over
// the sessions (adding up to the limit), that in parts mode the tenant's
// whole limit applies, and that a tenant at its share is skipped and its
// items refused.
func TestTenantShares(t *testing.T) {
	t.Parallel()
	lim := claim.Limit{MaxInFlight: 5}
	for _, tenant := range []string{"a", "b", "tenant-42"} {
		h := newLimiter(LimitOptions{}).tenant(tenant, time.Time{}).salt
		var sum int64
		for r := range 3 {
			c, _ := view{ok: true, ranks: true, n: 3, slots: []int{r}}.tenantShare(lim, h)
			sum += c
		}
		if sum != 5 {
			t.Errorf("tenant %q: shares add up to %d, want 5", tenant, sum)
		}
	}
	if c, r := (view{ok: true, n: 16, slots: []int{3}}).tenantShare(claim.Limit{MaxInFlight: 5, Rate: 7}, 1); c != 5 || r != 7 {
		t.Errorf("parts mode: tenant share %d, %v, want the whole limit 5, 7", c, r)
	}
	opts, _ := LimitOptions{Grace: time.Second, Refresh: 100 * time.Millisecond}.withDefaults()
	l := newLimiter(opts)
	t0 := time.Unix(1000, 0)
	l.set(t0, Limits{Tenants: map[string]claim.Limit{"slow": {MaxInFlight: 2}}}, time.Time{}, 4, -1, 0)
	l.plan(t0, 10, []int{0})
	at := t0.Add(2 * time.Second)
	if p := l.plan(at, 10, []int{0}); p.n != 10 || len(p.skip) != 0 {
		t.Fatalf("plan %+v, want 10 and no tenant skipped", p)
	}
	if !l.admit(at, "slow") || !l.admit(at, "slow") || !l.admit(at, "other") {
		t.Fatal("items under the tenant's limit refused")
	}
	if l.admit(at, "slow") {
		t.Fatal("a third item of a tenant limited to 2 admitted")
	}
	if p := l.plan(at, 10, []int{0}); len(p.skip) != 1 || p.skip[0] != "slow" {
		t.Fatalf("plan %+v, want tenant slow skipped", p)
	}
	l.done("slow")
	if p := l.plan(at, 10, []int{0}); len(p.skip) != 0 {
		t.Fatalf("plan %+v after an item of slow ended, want no tenant skipped", p)
	}
}

// TestStaleLimitsFailSafe checks what a session claims once its last
// successful read of the limits is StaleAfter old: nothing while the queue
// or every tenant is limited; nothing of the limited tenants while only
// some are (they are skipped and their items refused); everything while
// nothing is limited; and its shares again after a successful read.
func TestStaleLimitsFailSafe(t *testing.T) {
	t.Parallel()
	opts, err := LimitOptions{Refresh: 100 * time.Millisecond, Grace: 200 * time.Millisecond, StaleAfter: time.Second}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	fresh, stale := t0.Add(500*time.Millisecond), t0.Add(1001*time.Millisecond)
	all := []int{0, 1, 2, 3}
	for _, c := range []struct {
		name       string
		lims       Limits
		fresh      int      // items a plan allows while fresh
		stale      int      // and once stale
		staleSkip  []string // tenants skipped once stale
		refuseSlow bool     // an item of tenant "slow" a claim returns is refused once stale
	}{
		// (No claim runs: the plan allows none. Tenants are not limited.)
		{"queue", Limits{Queue: claim.Limit{MaxInFlight: 8}}, 8, 0, nil, false},
		{"queue rate", Limits{Queue: claim.Limit{Rate: 1000}}, 10, 0, nil, false},
		{"every tenant", Limits{Tenant: claim.Limit{MaxInFlight: 3}}, 10, 0, nil, true},
		{"one tenant", Limits{Tenants: map[string]claim.Limit{"slow": {MaxInFlight: 3}}}, 10, 10, []string{"slow"}, true},
		{"nothing", Limits{}, 10, 10, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l := newLimiter(opts)
			l.set(t0, c.lims, time.Time{}, 4, -1, 0)
			l.plan(t0, 10, all)
			if p := l.plan(fresh, 10, all); p.n != c.fresh || len(p.skip) != 0 {
				t.Fatalf("fresh: plan %+v, want %d items and no tenant skipped", p, c.fresh)
			}
			l.failed()
			p := l.plan(stale, 10, all)
			if p.n != c.stale || !slices.Equal(p.skip, c.staleSkip) {
				t.Fatalf("stale: plan %+v, want %d items, tenants %v skipped", p, c.stale, c.staleSkip)
			}
			if c.stale == 0 && !p.full {
				t.Errorf("stale: plan %+v does not wait for a read (full)", p)
			}
			if admitted := l.admit(stale, "slow"); admitted == c.refuseSlow {
				t.Errorf("stale: an item of tenant slow admitted: %v", admitted)
			}
			if st := l.stats(stale); !st.Stale || st.FailedReads != 1 {
				t.Errorf("stale: stats %+v, want Stale and 1 failed read", st)
			}
			again := stale.Add(time.Millisecond)
			l.set(again, c.lims, time.Time{}, 4, -1, 0)
			if p := l.plan(again, 10, all); p.n < c.fresh-1 || len(p.skip) != 0 {
				t.Fatalf("read again: plan %+v, want the fresh share back", p)
			}
			if st := l.stats(again); st.Stale {
				t.Errorf("read again: stats %+v still stale", st)
			}
		})
	}
}
