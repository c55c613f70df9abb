package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestREADMECommands runs every demo command line of the README's shell
// blocks with -h appended: each command and flag must exist (an unknown one
// exits 2), so the README cannot drift from the binary. It also checks that
// the README's command table lists every command.
func TestREADMECommands(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	inSh, checked := false, 0
	for i, line := range strings.Split(string(raw), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			inSh = true
			continue
		case strings.HasPrefix(line, "```"):
			inSh = false
			continue
		}
		_, rest, ok := strings.Cut(line, "./cmd/demo")
		if !inSh || !ok {
			continue
		}
		rest, _, _ = strings.Cut(rest, " #")
		var args []string
		for _, a := range strings.Fields(rest) {
			args = append(args, strings.Trim(a, `"'`))
		}
		r := demo(t, time.Minute, nil, append(args, "-h")...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage: demo") {
			t.Errorf("README line %d: demo %s: exit status %d\n%s", i+1, strings.Join(args, " "), r.code, r.stderr)
		}
		checked++
	}
	if checked < 5 {
		t.Errorf("checked %d demo command lines in the README, want at least 5", checked)
	}
	for _, c := range commands {
		if !strings.Contains(string(raw), "| `demo "+c.name) {
			t.Errorf("the README's command table has no row for demo %s", c.name)
		}
	}
}
