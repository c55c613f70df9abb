package worker

import (
	"strings"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/internal/store"
)

// The probe's options: defaults, ProbePoll never below Poll, and the
// values refused.
func TestWakeOptions(t *testing.T) {
	t.Parallel()
	zero, err := Options{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if zero.Wake != WakeAuto || zero.ProbeEvery != DefaultProbeEvery || zero.ProbePoll != DefaultProbePoll {
		t.Errorf("zero Options: Wake %v, ProbeEvery %v, ProbePoll %v; want auto, %v, %v", zero.Wake, zero.ProbeEvery, zero.ProbePoll,
			DefaultProbeEvery, DefaultProbePoll)
	}
	slow, err := Options{Poll: 5 * time.Second, ProbePoll: time.Second, ProbeEvery: time.Millisecond, Wake: WakeProbe}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if slow.ProbePoll != 5*time.Second || slow.ProbeEvery != time.Millisecond || slow.Wake != WakeProbe {
		t.Errorf("ProbePoll %v (want Poll, 5s), ProbeEvery %v, Wake %v", slow.ProbePoll, slow.ProbeEvery, slow.Wake)
	}
	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{Wake: WakeProbe + 1}, "is not a WakeMode"},
		{Options{Wake: -1}, "is not a WakeMode"},
		{Options{ProbeEvery: -time.Millisecond}, "ProbeEvery -1ms is negative"},
		{Options{ProbePoll: MaxDuration + 1}, "ProbePoll"},
	} {
		if _, err := c.opts.withDefaults(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("withDefaults(%+v) = %v, want an error containing %q", c.opts, err, c.want)
		}
	}
	for m, s := range map[WakeMode]string{WakeAuto: "auto", WakeListen: "listen", WakeProbe: "probe"} {
		if m.String() != s {
			t.Errorf("%d.String() = %q, want %q", int(m), m.String(), s)
		}
	}
}

// The parts that several pauses before one claim named add up (the claim
// loop kept only the last wake-up's before partHints, so the items of an
// earlier one were left to the poll), and one that stands for every part
// makes the claim read every part.
func TestPartHintsAddUp(t *testing.T) {
	t.Parallel()
	set := func(ps ...int) map[int]bool {
		m := map[int]bool{}
		for _, p := range ps {
			m[p] = true
		}
		return m
	}
	same := func(got, want map[int]bool) bool {
		if (got == nil) != (want == nil) || len(got) != len(want) {
			return false
		}
		for p := range want {
			if !got[p] {
				return false
			}
		}
		return true
	}
	for _, c := range []struct {
		name  string
		pause []map[int]bool
		want  map[int]bool
	}{
		{"none", nil, nil},
		{"one wake-up", []map[int]bool{set(1, 2)}, set(1, 2)},
		{"two wake-ups", []map[int]bool{set(1), set(3)}, set(1, 3)},
		{"a wake-up, then the poll", []map[int]bool{set(1), nil}, nil},
		{"the poll, then a wake-up", []map[int]bool{nil, set(1)}, nil},
	} {
		var h partHints
		for _, p := range c.pause {
			h.add(p)
		}
		if got := h.take(); !same(got, c.want) {
			t.Errorf("%s: parts %v, want %v (nil: every part)", c.name, got, c.want)
		}
		if got := h.take(); got != nil {
			t.Errorf("%s: a second take returned %v, want every part", c.name, got)
		}
	}
}

// The waits before claiming again after failed claims grow from
// claimRetryMin and never exceed one and a half claimRetryMax.
func TestClaimRetryWaitIsBounded(t *testing.T) {
	t.Parallel()
	for n := 1; n < 100; n++ {
		d := claimRetryWait(n)
		if d < claimRetryMin/2 || d > claimRetryMax*3/2 {
			t.Fatalf("after %d failures: %v, want within [%v, %v]", n, d, claimRetryMin/2, claimRetryMax*3/2)
		}
	}
	if d := claimRetryWait(1); d > claimRetryMin*3/2 {
		t.Errorf("after one failure: %v, want at most %v", d, claimRetryMin*3/2)
	}
}

// ListenPoll: 10 s by default, never below Poll, negative for Poll.
func TestListenPollDefaults(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   Options
		want time.Duration
	}{
		{Options{}, DefaultListenPoll},
		{Options{ListenPoll: -1}, DefaultPoll},
		{Options{Poll: time.Minute}, time.Minute},
		{Options{Poll: time.Second, ListenPoll: 3 * time.Second}, 3 * time.Second},
	} {
		o, err := c.in.withDefaults()
		if err != nil || o.ListenPoll != c.want {
			t.Errorf("%+v: ListenPoll %v, %v; want %v", c.in.ListenPoll, o.ListenPoll, err, c.want)
		}
	}
	if _, err := (Options{ListenPoll: MaxDuration + 1}).withDefaults(); err == nil {
		t.Error("ListenPoll beyond MaxDuration accepted")
	}
}

// An idle look lets the loop wait ListenPoll only when it read every
// unclaimed item and none had vested: until the first vests, or the whole
// ListenPoll when there is none; otherwise the loop polls.
func TestIdleLookWait(t *testing.T) {
	t.Parallel()
	long := 10 * time.Second
	now := time.Now()
	for _, c := range []struct {
		name string
		l    idleLook
		ok   bool
		max  time.Duration
	}{
		{"no look", idleLook{}, false, 0},
		{"failed", idleLook{at: now}, false, 0},
		{"empty", idleLook{at: now, ok: true}, true, long},
		{"one due in 2 s", idleLook{at: now, ok: true, res: store.IdleLook{Read: 1, Until: 2 * time.Second}}, true, 2*time.Second + idleLookSlack},
		{"vested but not claimed", idleLook{at: now, ok: true, res: store.IdleLook{Read: 1, Vested: 1}}, false, 0},
		{"too many to tell", idleLook{at: now, ok: true, res: store.IdleLook{Read: store.IdleLookLimit, Until: time.Second}}, false, 0},
	} {
		d, ok := c.l.wait(long)
		if ok != c.ok || d > c.max || (ok && d <= 0) {
			t.Errorf("%s: wait %v, %v; want ok %v, at most %v", c.name, d, ok, c.ok, c.max)
		}
	}
	stale := idleLook{at: now, ok: true, stale: true}
	if !stale.needed(long) {
		t.Error("a stale look is not read again")
	}
	fresh := idleLook{at: now, ok: true}
	if fresh.needed(long) {
		t.Error("a fresh exact look is read again")
	}
	unsure := idleLook{at: now.Add(-2 * long), ok: true, res: store.IdleLook{Read: 1, Vested: 1}}
	if !unsure.needed(long) {
		t.Error("an old look that could not tell is not read again")
	}
}
