package fleet_test

import (
	"math"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/fleet"
	"github.com/crdbwork/crdbwork/session"
)

// TestAckRate checks the rate over sessions that come and go: a killed
// session keeps the acks it reported, a new one counts from zero, and
// samples older than the window drop out; with no window, the rate is
// between the last two samples.
func TestAckRate(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	st := func(acked map[uuid.UUID]int64) []fleet.Session {
		var s []fleet.Session
		for id, n := range acked {
			s = append(s, fleet.Session{Info: session.Info{ID: id, Reported: session.Counters{Acked: n}}})
		}
		return s
	}
	tp := fleet.AckRate{Window: 10 * time.Second}
	if r := tp.Add(t0, st(map[uuid.UUID]int64{a: 100, b: 50})); r != -1 || tp.Span() != 0 {
		t.Fatalf("first sample: rate %v, span %v; want -1 (unknown), 0", r, tp.Span())
	}
	// 2 s later: a did 200 more; b was killed after 40 more (its last
	// report); c started and did 60.
	tp.Add(t0.Add(time.Second), st(map[uuid.UUID]int64{a: 200, b: 90}))
	r := tp.Add(t0.Add(2*time.Second), st(map[uuid.UUID]int64{a: 300, c: 60}))
	if want := (200.0 + 40 + 60) / 2; math.Abs(r-want) > 1e-9 || tp.Span() != 2*time.Second {
		t.Errorf("rate %v over %v, want %v over 2s", r, tp.Span(), want)
	}
	// Much later, only the last window counts: a did 100 in 10 s.
	tp.Add(t0.Add(20*time.Second), st(map[uuid.UUID]int64{a: 1000, c: 60}))
	r = tp.Add(t0.Add(30*time.Second), st(map[uuid.UUID]int64{a: 1100, c: 60}))
	if want := 10.0; math.Abs(r-want) > 1e-9 {
		t.Errorf("rate over the last window %v, want %v", r, want)
	}
	// No window: between the last two samples only.
	var last fleet.AckRate
	last.Add(t0, st(map[uuid.UUID]int64{a: 0}))
	last.Add(t0.Add(time.Second), st(map[uuid.UUID]int64{a: 100}))
	if r := last.Add(t0.Add(2*time.Second), st(map[uuid.UUID]int64{a: 110, b: 5})); math.Abs(r-15) > 1e-9 {
		t.Errorf("rate between the last two samples %v, want 15", r)
	}
}
