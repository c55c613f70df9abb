package worker

import (
	"strings"
	"testing"
	"time"
)

// The probe's options: defaults, ProbePoll never below Poll, and the
// values refused.
func TestWakeOptions(t *testing.T) {
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
