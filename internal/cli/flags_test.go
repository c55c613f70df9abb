package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

var testProg = Program{Name: "tool", EnvPrefix: "TOOL_", URLVars: []string{"TOOL_DATABASE_URL", "DATABASE_URL"}}

type testFlags struct {
	url   string
	n     int
	d     time.Duration
	yes   bool
	rate  float64
	queue string
}

func parseTest(t *testing.T, args ...string) (*FlagSet, testFlags, error) {
	t.Helper()
	var v testFlags
	f := testProg.NewFlagSet("do", "Does things.")
	f.MaxArgs, f.ArgName = 1, "[ID]"
	f.StringVar(&v.url, "database-url", "", "URL", URLUsage, nil)
	f.StringVar(&v.queue, "queue", "q", "NAME", "the queue", func(s string) error {
		if s == "" {
			return errors.New("must not be empty")
		}
		return nil
	})
	f.IntVar(&v.n, "count", 3, 1, 10, "how many")
	f.DurationVar(&v.d, "every", time.Second, false, "how often")
	f.BoolVar(&v.yes, "yes", false, "do it")
	f.FlagOnly("yes")
	f.FloatVar(&v.rate, "rate", "R", "how fast")
	err := f.Parse(args, io.Discard)
	return f, v, err
}

// The environment prefix is the program's; --database-url reads its
// variables in order; a flag wins over its variable; flag-only flags are
// not read from the environment.
func TestFlagsEnvironment(t *testing.T) {
	t.Setenv("TOOL_COUNT", "7")
	t.Setenv("TOOL_YES", "true")
	t.Setenv("TOOL_RATE", "2.5")
	t.Setenv("DATABASE_URL", "postgres://generic/db")
	t.Setenv("DEMO_COUNT", "9") // another program's
	f, v, err := parseTest(t)
	if err != nil {
		t.Fatal(err)
	}
	if v.n != 7 || v.rate != 2.5 || v.url != "postgres://generic/db" || v.yes {
		t.Errorf("from the environment: %+v", v)
	}
	if !f.IsSet("count") || f.IsSet("every") || f.IsSet("yes") {
		t.Errorf("IsSet: count %v, every %v, yes %v", f.IsSet("count"), f.IsSet("every"), f.IsSet("yes"))
	}
	t.Setenv("TOOL_DATABASE_URL", "postgres://own/db")
	if _, v, _ = parseTest(t); v.url != "postgres://own/db" {
		t.Errorf("TOOL_DATABASE_URL does not win over DATABASE_URL: %q", v.url)
	}
	f, v, err = parseTest(t, "--count", "2", "ID1", "--yes")
	if err != nil || v.n != 2 || !v.yes || len(f.Args) != 1 || f.Args[0] != "ID1" {
		t.Errorf("flags and an argument: %+v, args %q, %v", v, f.Args, err)
	}
}

// Bad values are exit-2 errors that name the flag (or the variable) and
// point at the command's help.
func TestFlagsErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--count", "11"}, "--count: must be between 1 and 10"},
		{[]string{"--count", "x"}, "not an integer"},
		{[]string{"--every", "0s"}, "must be more than zero"},
		{[]string{"--rate", "-1"}, "must not be negative"},
		{[]string{"--rate", "NaN"}, "not a number"},
		{[]string{"--queue", ""}, "must not be empty"},
		{[]string{"--nope"}, "unknown flag --nope"},
		{[]string{"--count"}, "flag --count needs a value"},
		{[]string{"a", "b"}, `unexpected argument "b"`},
	} {
		_, _, err := parseTest(t, c.args...)
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Code != 2 || !strings.Contains(ee.Msg, c.want) || ee.Hint != "run `tool do -h` for help" {
			t.Errorf("%v: %#v, want exit 2 with %q", c.args, err, c.want)
		}
	}
	t.Setenv("TOOL_EVERY", "soon")
	if _, _, err := parseTest(t); err == nil || !strings.Contains(err.Error(), `invalid value "soon" in TOOL_EVERY (for --every)`) {
		t.Errorf("a bad variable: %v", err)
	}
	t.Setenv("TOOL_EVERY", "")
	f, _, _ := parseTest(t)
	if err := f.RequireURL(""); err == nil || !strings.Contains(err.Error(), "TOOL_DATABASE_URL or DATABASE_URL") {
		t.Errorf("RequireURL: %v", err)
	}
}

// Usage lists each flag with its variables, "(flag only)" for the others,
// and the defaults.
func TestFlagsUsage(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	f, _, _ := parseTest(t)
	f.Usage(&out)
	for _, want := range []string{"Usage: tool do [flags] [ID]", "Does things.", "--count N", "TOOL_COUNT", "(default 3)",
		"TOOL_DATABASE_URL or DATABASE_URL", "--yes", "(flag only)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, out.String())
		}
	}
	if _, _, err := parseTest(t, "-h"); !errors.Is(err, ErrHelp) {
		t.Errorf("-h: %v, want ErrHelp", err)
	}
}

// Report prints one line after the program's name and returns the status.
func TestReport(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		code int
		line string
	}{
		{nil, 0, ""},
		{ErrHelp, 0, ""},
		{ExitCode(3), 3, ""},
		{Failf(2, "bad %s", "input"), 2, "tool: bad input\n"},
		{&ExitError{Code: 1, Msg: "a\nb\na", Hint: "try again"}, 1, "tool: a b; try again\n"},
		{&ExitError{Code: 1, Msg: "a\nb", Raw: true}, 1, "tool: a\nb\n"},
		{fmt.Errorf("wrapped: %w", errors.New("plain")), 1, "tool: wrapped: plain\n"},
	} {
		var stderr bytes.Buffer
		if got := testProg.Report(NewConsole(io.Discard, &stderr), c.err); got != c.code || stderr.String() != c.line {
			t.Errorf("Report(%v) = %d, %q; want %d, %q", c.err, got, stderr.String(), c.code, c.line)
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	if got := RedactURL("postgres://u:secret@h:5432/db"); strings.Contains(got, "secret") || !strings.Contains(got, "u:xxxxx@h:5432") {
		t.Errorf("RedactURL = %q", got)
	}
	if got := VersionLine("tool"); !strings.HasPrefix(got, "tool "+Version+" (") {
		t.Errorf("VersionLine = %q", got)
	}
}
