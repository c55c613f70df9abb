package wake

import (
	"slices"
	"testing"
)

// A payload names the distinct key hashes of at most MaxHints items, and
// parses back to them; more, or anything malformed, means any part.
func TestPayload(t *testing.T) {
	if p := Payload([]int64{7, 3, 7, 0}); p != "7,3,0" {
		t.Errorf("Payload = %q, want %q", p, "7,3,0")
	}
	if got := ParsePayload("7,3,0"); !slices.Equal(got, []int64{7, 3, 0}) {
		t.Errorf("ParsePayload = %v", got)
	}
	many := make([]int64, MaxHints+1)
	for i := range many {
		many[i] = int64(i)
	}
	if p := Payload(many); p != "" {
		t.Errorf("Payload of %d hashes = %q, want \"\" (any part)", len(many), p)
	}
	if p := Payload(append(many[:MaxHints:MaxHints], 0, 1)); p == "" {
		t.Errorf("Payload of %d distinct hashes (repeated) = \"\", want them", MaxHints)
	}
	for _, bad := range []string{"", "x", "1,,2", "-1", "1,2,3,4,5,6,7,8,9", "99999999999999999999"} {
		if got := ParsePayload(bad); got != nil {
			t.Errorf("ParsePayload(%q) = %v, want nil (any part)", bad, got)
		}
	}
}

// A subscription merges the hints of the signals since its last Hints,
// and one signal for any part (or too many hashes) makes them all any.
func TestHintsMerge(t *testing.T) {
	const ch = "crdbwork_test_hints"
	s := Subscribe(ch)
	defer s.Close()
	if _, ok := s.Hints(); ok {
		t.Error("hints before any signal")
	}
	SignalHashes(ch, []int64{1, 2})
	SignalHashes(ch, []int64{2, 3})
	<-s.C()
	got, ok := s.Hints()
	slices.Sort(got)
	if !ok || !slices.Equal(got, []int64{1, 2, 3}) {
		t.Errorf("Hints = %v, %v; want [1 2 3], true", got, ok)
	}
	if _, ok := s.Hints(); ok {
		t.Error("Hints did not forget what it returned")
	}
	SignalHashes(ch, []int64{4})
	Signal(ch)
	SignalHashes(ch, []int64{5})
	if _, ok := s.Hints(); ok {
		t.Error("a signal for any part was merged away")
	}
	for i := range MaxHints + 1 {
		SignalHashes(ch, []int64{int64(i)})
	}
	if _, ok := s.Hints(); ok {
		t.Errorf("more than %d hashes kept as hints", MaxHints)
	}
	// Other channels' signals are not this subscription's.
	SignalHashes("crdbwork_test_other", []int64{9})
	if _, ok := s.Hints(); ok {
		t.Error("another channel's hints")
	}
}
