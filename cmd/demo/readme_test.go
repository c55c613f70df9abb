package main

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// operatorCommands are the demo's former operator commands. They are the
// operator CLI's now (cmd/crdbwork, documented in docs/cli.md and checked by
// its own test), so the demo's command table in docs/demo.md need not list
// them while the demo still has them.
var operatorCommands = map[string]bool{
	"migrate": true, "status": true, "dead": true, "requeue": true, "cancel": true,
	"pause": true, "resume": true, "fair": true, "parts": true, "limit": true,
}

// demoLine finds a demo command line: `go run ./cmd/demo` and its arguments
// (`go test ./cmd/demo/` and the like are not demo command lines).
var demoLine = regexp.MustCompile(`go run \./cmd/demo(\s|$)`)

// TestREADMECommands runs every demo command line of the shell blocks of
// README.md and docs/*.md with -h appended: each command and flag must exist
// (an unknown one exits 2), so the documentation cannot drift from the
// binary. It also checks that docs/demo.md's command table lists every demo
// command.
func TestREADMECommands(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(docs)
	checked := 0
	for _, doc := range append([]string{"../../README.md"}, docs...) {
		checked += checkDemoLines(t, doc)
	}
	if checked < 5 {
		t.Errorf("checked %d demo command lines in README.md and docs/, want at least 5", checked)
	}
	raw, err := os.ReadFile("../../docs/demo.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range commands {
		if !operatorCommands[c.name] && !strings.Contains(string(raw), "| `demo "+c.name) {
			t.Errorf("the command table of docs/demo.md has no row for demo %s", c.name)
		}
	}
}

// checkDemoLines runs the `go run ./cmd/demo ...` lines of one Markdown
// file's shell blocks with -h and returns how many it checked.
func checkDemoLines(t *testing.T, doc string) int {
	t.Helper()
	raw, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(doc, "../../")
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
		m := demoLine.FindStringSubmatchIndex(line)
		if !inSh || m == nil {
			continue
		}
		rest := line[m[1]:]
		rest, _, _ = strings.Cut(rest, " #")
		var args []string
		for _, a := range strings.Fields(rest) {
			args = append(args, strings.Trim(a, `"'`))
		}
		r := demo(t, time.Minute, nil, append(args, "-h")...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage: demo") {
			t.Errorf("%s line %d: demo %s: exit status %d\n%s", name, i+1, strings.Join(args, " "), r.code, r.stderr)
		}
		checked++
	}
	return checked
}
