package main

import (
	"strings"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

func TestTenantFlagsBadInput(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		// The measurements moved to the bench module (go -C bench run . fairness, order).
		{[]string{"run", "--database-url", url, "--tenants", "10"}, "unknown flag --tenants"},
		{[]string{"run", "--database-url", url, "--measure-order"}, "unknown flag --measure-order"},
		{[]string{"run", "--database-url", url, "--any-part"}, "unknown flag --any-part"},
		// --record-runs is in the demotest build only.
		{[]string{"work", "--database-url", url, "--record-runs"}, "unknown flag --record-runs"},
	} {
		r := demo(t, time.Minute, nil, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("demo %s: exit status %d, stderr %q; want 2 and %q", strings.Join(c.args, " "), r.code, r.stderr, c.want)
		}
	}
	// fair moved to crdbwork, with its checks.
	wantExit(t, op(t, time.Minute, nil, "fair", "--database-url", url, "maybe"), 2, `unexpected argument "maybe"`)
}

// crdbwork fair shows and changes the queue's setting, keeping the others.
func TestFairCommand(t *testing.T) {
	t.Parallel()
	url := testschema.NewURL(t)
	state := func(args ...string) map[string]any {
		t.Helper()
		r := op(t, time.Minute, nil, append([]string{"fair", "--database-url", url, "--queue", "q1", "--create", "--json"}, args...)...)
		if r.code != 0 {
			t.Fatalf("crdbwork fair %v: exit status %d\n%s", args, r.code, r.stderr)
		}
		return lastJSON(t, r)
	}
	if s := state(); s["fair"] != false {
		t.Fatalf("a new queue: %v, want not fair", s)
	}
	if s := state("on"); s["fair"] != true || s["was_fair"] != false {
		t.Fatalf("fair on: %v", s)
	}
	if s := state(); s["fair"] != true {
		t.Fatalf("after on: %v", s)
	}
	// The other queue is untouched (still unknown); the queue got the
	// default parts.
	wantExit(t, op(t, time.Minute, nil, "fair", "--database-url", url, "--queue", "q2"), 2, `unknown queue "q2"`)
	r := op(t, time.Minute, nil, "parts", "--database-url", url, "--queue", "q1", "--json")
	if r.code != 0 || num(t, lastJSON(t, r), "parts") != defaultParts {
		t.Fatalf("parts of q1 after fair on: %d %s", r.code, r.stdout)
	}
	if s := state("off"); s["fair"] != false || s["was_fair"] != true {
		t.Fatalf("fair off: %v", s)
	}
}
