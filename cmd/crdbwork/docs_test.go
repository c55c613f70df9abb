package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsCommandLines runs every crdbwork command line in the code blocks
// of README.md and docs/*.md, and in their inline code (`crdbwork dead
// --reason "snoozed too often"`; synopses with [, < or | excepted), with
// -h appended: each command, flag and value
// must parse (an unknown one exits 2), so the docs cannot drift from the
// binary. docs/cli.md, the reference, must have a section for every command
// and name every flag each command's -h shows.
func TestDocsCommandLines(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md")
	checked := 0
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, cl := range commandLines(string(raw)) {
			args := cl.args
			if last := args[len(args)-1]; cl.inline && len(args) > 1 && strings.HasPrefix(last, "--") {
				// A flag named in prose (`crdbwork parts --set`): the
				// command must have it.
				args = args[:len(args)-1]
				if r := run(t, nil, append(args, "-h")...); !strings.Contains(r.stdout, "  "+last+" ") && !strings.Contains(r.stdout, "  "+last+"\n") {
					t.Errorf("%s:%d: crdbwork %s has no flag %s: %s", file, cl.line, strings.Join(args, " "), last, r)
				}
			}
			r := run(t, nil, append(args, "-h")...)
			if r.code != 0 || !strings.Contains(r.stdout, "Usage: crdbwork "+cl.args[0]) {
				t.Errorf("%s:%d: crdbwork %s -h: %s", file, cl.line, strings.Join(cl.args, " "), r)
			}
			checked++
		}
	}
	if checked < 30 {
		t.Errorf("checked %d crdbwork command lines in the docs, want at least 30 (docs/cli.md alone has more)", checked)
	}

	ref, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	flag := regexp.MustCompile(`(?m)^  (--[a-z][a-z0-9-]*)`)
	for _, c := range commands {
		if !strings.Contains(string(ref), "\n## crdbwork "+c.name) && !strings.Contains(string(ref), " and crdbwork "+c.name+"\n") {
			t.Errorf("docs/cli.md has no section for crdbwork %s", c.name)
		}
		for _, m := range flag.FindAllStringSubmatch(must(t, nil, c.name, "-h").stdout, -1) {
			if !strings.Contains(string(ref), "`"+m[1]) {
				t.Errorf("docs/cli.md does not name %s of crdbwork %s", m[1], c.name)
			}
		}
	}
}

// commandLine is one crdbwork command line of a document.
type commandLine struct {
	line int      // 1-based, where it starts
	args []string // after "crdbwork"
	// inline is set for a command line in inline code (in prose).
	inline bool
}

// commandLines finds the crdbwork command lines of a Markdown text's code
// blocks: lines that start (after an optional "$ ") with "crdbwork " or
// "go run ./cmd/crdbwork " and a command word, joined with the lines a trailing backslash
// continues, without a trailing "# comment", split like a shell would
// split them (quotes kept together, $VARIABLES left as they are).
func commandLines(text string) []commandLine {
	var out []commandLine
	lines := strings.Split(text, "\n")
	inCode := false
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			for _, m := range inlineCommand.FindAllStringSubmatch(lines[i], -1) {
				if strings.ContainsAny(m[1], "[<|") {
					continue // a synopsis, not a command line
				}
				if args := shellWords(m[1]); len(args) > 0 && commandWord.MatchString(args[0]) {
					out = append(out, commandLine{line: i + 1, args: args, inline: true})
				}
			}
			continue
		}
		start := i
		for strings.HasSuffix(l, `\`) && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
		}
		l = strings.TrimPrefix(l, "$ ")
		var rest string
		switch {
		case strings.HasPrefix(l, "crdbwork "):
			rest = strings.TrimPrefix(l, "crdbwork ")
		case strings.HasPrefix(l, "go run ./cmd/crdbwork "):
			rest = strings.TrimPrefix(l, "go run ./cmd/crdbwork ")
		default:
			continue
		}
		args := shellWords(rest)
		// Program output that starts with the name ("crdbwork demo: PASS")
		// is not a command line: a command is a plain word.
		if len(args) > 0 && commandWord.MatchString(args[0]) {
			out = append(out, commandLine{line: start + 1, args: args})
		}
	}
	return out
}

// inlineCommand is a crdbwork command line in inline code.
var inlineCommand = regexp.MustCompile("`crdbwork ([^`]+)`")

var commandWord = regexp.MustCompile(`^[a-z][a-z-]*$`)

// shellWords splits s into words as a shell would for these docs: quotes
// group, a # after a space starts a comment.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	var quote rune
	inWord := false
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '#' && !inWord:
			return words
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

func TestShellWords(t *testing.T) {
	t.Parallel()
	got := shellWords(`dead --queue emails --error "disk full" --reason 'crash loop' $X # a comment`)
	want := []string{"dead", "--queue", "emails", "--error", "disk full", "--reason", "crash loop", "$X"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("shellWords = %q, want %q", got, want)
	}
	cls := commandLines("text crdbwork status\n```sh\n$ crdbwork status \\\n  --queue q\ngo run ./cmd/crdbwork dead --queue q\necho crdbwork x\ncrdbwork demo: PASS\n```\ncrdbwork pause\n")
	if len(cls) != 2 || cls[0].line != 3 || strings.Join(cls[0].args, " ") != "status --queue q" || cls[1].args[0] != "dead" {
		t.Errorf("commandLines = %+v", cls)
	}
}
