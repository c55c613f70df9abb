// Package examples holds the programs and tests that the README's code
// blocks mirror; this test keeps the two identical.
package examples

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// marker precedes each Go code block of the README and names the file the
// block mirrors, relative to the repository root.
var marker = regexp.MustCompile(`^<!-- mirrors (\S+) -->$`)

// TestREADMEMirrorsExamples checks that every Go code block of the README
// is preceded by a marker naming an example file, and is that file's text
// exactly: the README cannot show code that CI does not build and run.
func TestREADMEMirrorsExamples(t *testing.T) {
	root := ".."
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
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
			t.Fatalf("README line %d: unterminated code block", i+1)
		}
		block := strings.Join(lines[i+1:j], "\n") + "\n"
		var m []string
		if i > 0 {
			m = marker.FindStringSubmatch(lines[i-1])
		}
		if m == nil {
			t.Errorf("README line %d: a Go code block without a `<!-- mirrors FILE -->` line before it", i+1)
			i = j
			continue
		}
		want, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(m[1])))
		if err != nil {
			t.Errorf("README line %d: %v", i, err)
		} else if string(want) != block {
			t.Errorf("README line %d: the code block differs from %s; copy the file into the README", i+1, m[1])
		}
		i = j
	}
	if blocks < 3 {
		t.Errorf("found %d Go code blocks in the README, want at least 3 (quick start, handler test, metrics)", blocks)
	}
}
