// Package examples holds the programs and tests that the Go code blocks of
// the README and of docs/*.md mirror; this test keeps them identical.
package examples

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// marker precedes each Go code block of the README and of docs/*.md. It
// names the file the block mirrors, relative to the repository root, and
// optionally a region of it: "(region)" for the lines between the file's
// `// README:begin` and `// README:end` lines, "(region NAME)" for those
// between `// README:begin NAME` and `// README:end NAME`.
var marker = regexp.MustCompile(`^<!-- mirrors (\S+)(?: \(region(?: (\S+))?\))? -->$`)

// regionLine is a region's begin or end line in an example file.
var regionLine = regexp.MustCompile(`^\s*// README:(begin|end)(?: (\S+))?$`)

// root is the repository root, relative to this package.
const root = ".."

// TestREADMEMirrorsExamples checks that every Go code block of the README
// and of the pages in docs/ is preceded by a marker naming an example file
// (or a region of one) and is that text exactly: the documentation cannot
// show code that CI does not build and run. It also checks that every
// region of the example files is shown somewhere, and that the README's
// quick start is one.
func TestREADMEMirrorsExamples(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(docs)
	shown := map[string]bool{} // "FILE" or "FILE (region NAME)"
	blocks := 0
	for _, doc := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		blocks += checkBlocks(t, doc, shown)
	}
	if blocks < 3 {
		t.Errorf("found %d Go code blocks in README.md and docs/, want at least 3 (quick start, handler test, metrics)", blocks)
	}
	if !shown["examples/quickstart/main.go (region )"] {
		t.Errorf("no Go code block shows the quick start's region of examples/quickstart/main.go")
	}
	for _, r := range exampleRegions(t) {
		if !shown[r] {
			t.Errorf("%s is shown by no Go code block of README.md or docs/: remove its markers or show it", r)
		}
	}
}

// checkBlocks checks the Go code blocks of one Markdown file against the
// example files their markers name, records what they show in shown, and
// returns how many blocks it found.
func checkBlocks(t *testing.T, doc string, shown map[string]bool) int {
	t.Helper()
	raw, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	name, _ := filepath.Rel(root, doc)
	lines := strings.Split(string(raw), "\n")
	blocks := 0
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "```go") {
			continue
		}
		blocks++
		j := i + 1
		for j < len(lines) && lines[j] != "```" {
			j++
		}
		if j == len(lines) {
			t.Errorf("%s line %d: unterminated code block", name, i+1)
			return blocks
		}
		block := strings.Join(lines[i+1:j], "\n") + "\n"
		var m []string
		if i > 0 {
			m = marker.FindStringSubmatch(lines[i-1])
		}
		if m == nil {
			t.Errorf("%s line %d: a Go code block without a `<!-- mirrors FILE -->` or `<!-- mirrors FILE (region NAME) -->` line before it", name, i+1)
			i = j
			continue
		}
		file, isRegion, region := m[1], strings.Contains(lines[i-1], "(region"), m[2]
		want, err := mirrored(file, isRegion, region)
		switch {
		case err != nil:
			t.Errorf("%s line %d: %v", name, i+1, err)
		case want != block:
			t.Errorf("%s line %d: the code block differs from %s; copy it into %s", name, i+1, what(file, isRegion, region), name)
		default:
			key := file
			if isRegion {
				key = file + " (region " + region + ")"
			}
			shown[key] = true
		}
		i = j
	}
	return blocks
}

// mirrored returns the text a block mirroring file (or its region) must
// have: the whole file, or the region's lines without their common leading
// tabs.
func mirrored(file string, isRegion bool, region string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
	if err != nil {
		return "", err
	}
	if !isRegion {
		return string(raw), nil
	}
	var body []string
	in, found := false, false
	for _, l := range strings.Split(string(raw), "\n") {
		m := regionLine.FindStringSubmatch(l)
		switch {
		case m != nil && m[2] == region && m[1] == "begin":
			if in || found {
				return "", fmt.Errorf("%s: a second begin line", what(file, true, region))
			}
			in = true
		case m != nil && m[2] == region && m[1] == "end":
			if !in {
				return "", fmt.Errorf("%s: an end line without a begin line", what(file, true, region))
			}
			in, found = false, true
		case in:
			body = append(body, l)
		}
	}
	if in {
		return "", fmt.Errorf("%s: no end line", what(file, true, region))
	}
	if !found {
		return "", fmt.Errorf("%s: no such region (`// README:begin %s` … `// README:end %s`)", what(file, true, region), region, region)
	}
	for len(body) > 0 && strings.TrimSpace(body[0]) == "" {
		body = body[1:]
	}
	for len(body) > 0 && strings.TrimSpace(body[len(body)-1]) == "" {
		body = body[:len(body)-1]
	}
	indent := -1
	for _, l := range body {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if n := len(l) - len(strings.TrimLeft(l, "\t")); indent < 0 || n < indent {
			indent = n
		}
	}
	for k, l := range body {
		if len(l) >= indent && indent > 0 {
			body[k] = l[indent:]
		}
	}
	return strings.Join(body, "\n") + "\n", nil
}

// exampleRegions lists every region of the Go files under examples/, as
// "FILE (region NAME)".
func exampleRegions(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, l := range strings.Split(string(raw), "\n") {
			if m := regionLine.FindStringSubmatch(l); m != nil && m[1] == "begin" {
				out = append(out, "examples/"+filepath.ToSlash(path)+" (region "+m[2]+")")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// what names a file or one of its regions in messages.
func what(file string, isRegion bool, region string) string {
	switch {
	case !isRegion:
		return file
	case region == "":
		return file + "'s region"
	default:
		return file + "'s region " + region
	}
}
