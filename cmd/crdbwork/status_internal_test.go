package main

import (
	"testing"
)

func TestRanges(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   []int
		want string
	}{
		{nil, ""},
		{[]int{3}, "3"},
		{[]int{0, 1, 2, 3, 8}, "0-3,8"},
		{[]int{9, 1, 0, 5, 6, 12}, "0-1,5-6,9,12"},
	} {
		if got := ranges(c.in); got != c.want {
			t.Errorf("ranges(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestSuggest(t *testing.T) {
	t.Parallel()
	names := []string{"demo", "emails", "reports", "q"}
	for in, want := range map[string]string{"deom": "demo", "emials": "emails", "report": "reports", "email": "emails",
		"zzzzzz": "", "x": "", "q": "q", "qq": ""} {
		if got := suggest(in, names); got != want {
			t.Errorf("suggest(%q) = %q, want %q", in, got, want)
		}
	}
}
