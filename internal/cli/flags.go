package cli

import (
	"github.com/jackc/pgx/v5/pgconn"

	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Program names one binary for its messages and environment: the name
// printed before errors and in usage lines, the prefix of the variables its
// flags are read from, and the variables read for --database-url.
type Program struct {
	// Name is the binary's name, like "demo" or "crdbwork".
	Name string
	// EnvPrefix is put before a flag's name, in capitals with _ for -, to
	// name its variable: "DEMO_" makes --task-time DEMO_TASK_TIME.
	EnvPrefix string
	// URLVars are the variables read for --database-url, the first set
	// one wins (DATABASE_URL, say).
	URLVars []string
	// ExplainPermission, if not nil, writes the one line Report prints for
	// a refusal for lack of a privilege (SQLSTATE 42501): the table and the
	// privileges the user lacks (it may ask the database). Without it, or
	// when it returns "", Report prints the server's message.
	ExplainPermission func(*pgconn.PgError) string
}

// FlagSet wraps flag.FlagSet with environment variables (a flag given on the
// command line wins over its variable), one-line errors and our own usage.
type FlagSet struct {
	// Cmd is the command's name, for messages ("status").
	Cmd     string
	prog    Program
	summary string
	fs      *flag.FlagSet
	defs    []flagDef
	set     map[string]bool // given on the command line or in the environment
	// MaxArgs is how many positional arguments the command takes (flags
	// may come before, between and after them); Args holds them after
	// Parse.
	MaxArgs int
	// ArgName shows the positional arguments in the usage: like "[ID]".
	ArgName string
	// Args are the positional arguments Parse found.
	Args []string
}

type flagDef struct {
	name, metavar, usage, def string
	env                       []string // the variables read, in order; none for a flag-only flag
}

// NewFlagSet returns the flags of command cmd of p; summary is the
// command's description for its usage.
func (p Program) NewFlagSet(cmd, summary string) *FlagSet {
	fs := flag.NewFlagSet(p.Name+" "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &FlagSet{Cmd: cmd, prog: p, summary: summary, fs: fs, set: map[string]bool{}}
}

// EnvNames returns the environment variables read for a flag, in order.
func (p Program) EnvNames(name string) []string {
	if name == "database-url" {
		return append([]string(nil), p.URLVars...)
	}
	return []string{p.EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}
}

// Add defines a flag of any flag.Value; metavar names its value in the usage.
func (f *FlagSet) Add(v flag.Value, name, metavar, usage string) {
	def := v.String()
	f.fs.Var(v, name, usage)
	f.defs = append(f.defs, flagDef{name: name, metavar: metavar, usage: usage, env: f.prog.EnvNames(name), def: def})
}

// StringVar defines a string flag; check, if not nil, vets each value.
func (f *FlagSet) StringVar(p *string, name, def, metavar, usage string, check func(string) error) {
	*p = def
	f.Add(&stringValue{p: p, check: check}, name, metavar, usage)
}

// IntVar defines an integer flag taking values from lo to hi.
func (f *FlagSet) IntVar(p *int, name string, def, lo, hi int, usage string) {
	*p = def
	f.Add(&intValue{p: p, lo: lo, hi: hi}, name, "N", usage)
}

// DurationVar defines a duration flag; allowZero accepts 0.
func (f *FlagSet) DurationVar(p *time.Duration, name string, def time.Duration, allowZero bool, usage string) {
	*p = def
	f.Add(&durationValue{p: p, allowZero: allowZero}, name, "DURATION", usage)
}

// BoolVar defines a boolean flag.
func (f *FlagSet) BoolVar(p *bool, name string, def bool, usage string) {
	*p = def
	f.Add(&boolValue{p: p}, name, "", usage)
}

// FlagOnly makes a flag unreadable from the environment: for the flags
// that destroy or move data (requeue --all, parts --set, cleanup
// --drop-schema), which a variable left set in a shell must not turn on.
func (f *FlagSet) FlagOnly(name string) {
	for i := range f.defs {
		if f.defs[i].name == name {
			f.defs[i].env = nil
		}
	}
}

// IsSet reports whether the flag was given on the command line or in the
// environment (as opposed to left at its default).
func (f *FlagSet) IsSet(name string) bool { return f.set[name] }

// ErrHelp is returned by parse when -h was asked for; the usage is printed.
var ErrHelp = errors.New("help requested")

// Parse parses args, then fills the flags not given from the environment.
// It prints the usage to out and returns ErrHelp for -h/--help.
func (f *FlagSet) Parse(args []string, out io.Writer) error {
	for {
		if err := f.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				f.Usage(out)
				return ErrHelp
			}
			return f.UsageError("%s", flagMessage(err))
		}
		if f.fs.NArg() == 0 {
			break
		}
		if len(f.Args) >= f.MaxArgs {
			return f.UsageError("unexpected argument %q", f.fs.Arg(0))
		}
		f.Args = append(f.Args, f.fs.Arg(0))
		args = f.fs.Args()[1:]
	}
	f.fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	for _, d := range f.defs {
		if f.set[d.name] {
			continue
		}
		var env, val string
		for _, e := range d.env {
			if v, ok := os.LookupEnv(e); ok && v != "" {
				env, val = e, v
				break
			}
		}
		if env == "" {
			continue
		}
		if err := f.fs.Set(d.name, val); err != nil {
			shown := val
			if d.name == "database-url" {
				shown = RedactURL(val)
			}
			return f.UsageError("invalid value %q in %s (for --%s): %v", shown, env, d.name, unwrapSetError(err))
		}
		f.set[d.name] = true
	}
	return nil
}

// UsageError is an exit-2 error about the command line, with a hint to the
// command's help.
func (f *FlagSet) UsageError(format string, args ...any) error {
	return &ExitError{Code: 2, Msg: fmt.Sprintf(format, args...), Hint: f.HelpHint()}
}

// HelpHint is "run `PROG CMD -h` for help".
func (f *FlagSet) HelpHint() string {
	return fmt.Sprintf("run `%s %s -h` for help", f.prog.Name, f.Cmd)
}

// flagMessage rewrites the flag package's messages in the --flag spelling.
func flagMessage(err error) string {
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "flag provided but not defined: "):
		name := strings.TrimLeft(strings.TrimPrefix(msg, "flag provided but not defined: "), "-")
		return fmt.Sprintf("unknown flag --%s", name)
	case strings.HasPrefix(msg, "flag needs an argument: "):
		name := strings.TrimLeft(strings.TrimPrefix(msg, "flag needs an argument: "), "-")
		return fmt.Sprintf("flag --%s needs a value", name)
	case strings.HasPrefix(msg, "bad flag syntax: "):
		return msg
	}
	msg = strings.Replace(msg, "invalid boolean value", "invalid value", 1)
	msg = strings.Replace(msg, " for flag -", " for -", 1)
	return flagName.ReplaceAllString(msg, " for --$1")
}

var flagName = regexp.MustCompile(` for -+([a-z][a-z0-9-]*)`)

// unwrapSetError drops the flag package's prefix from an error of Set.
func unwrapSetError(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 && strings.HasPrefix(msg, "invalid ") {
		return msg[i+2:]
	}
	return msg
}

// Usage prints the command's usage, its flags and their variables.
func (f *FlagSet) Usage(out io.Writer) {
	fmt.Fprintf(out, "Usage: %s %s [flags]%s\n\n%s\n\n", f.prog.Name, f.Cmd, map[bool]string{true: " " + f.ArgName}[f.ArgName != ""], strings.TrimSpace(f.summary))
	fmt.Fprintln(out, "Flags (each one can also be set by the environment variable shown; a flag wins over its variable):")
	defs := append([]flagDef(nil), f.defs...)
	sort.SliceStable(defs, func(i, j int) bool { return defs[i].name < defs[j].name })
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, d := range defs {
		name := "--" + d.name
		if d.metavar != "" {
			name += " " + d.metavar
		}
		usage := d.usage
		if d.def != "" && d.def != "0" && d.def != "0s" && d.def != "false" {
			usage += fmt.Sprintf(" (default %s)", d.def)
		}
		env := strings.Join(d.env, " or ")
		if env == "" {
			env = "(flag only)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", name, env, usage)
	}
	tw.Flush()
}

type stringValue struct {
	p     *string
	check func(string) error
}

func (v *stringValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return *v.p
}

func (v *stringValue) Set(s string) error {
	if v.check != nil {
		if err := v.check(s); err != nil {
			return err
		}
	}
	*v.p = s
	return nil
}

type intValue struct {
	p      *int
	lo, hi int
}

func (v *intValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return strconv.Itoa(*v.p)
}

func (v *intValue) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	switch {
	case errors.Is(err, strconv.ErrRange):
		if strings.HasPrefix(strings.TrimSpace(s), "-") {
			return fmt.Errorf("too small (must be between %d and %d)", v.lo, v.hi)
		}
		return fmt.Errorf("too large (must be between %d and %d)", v.lo, v.hi)
	case err != nil:
		return errors.New("not an integer")
	case n < v.lo && v.lo == 1:
		return errors.New("must be a positive number")
	case n < v.lo || n > v.hi:
		return fmt.Errorf("must be between %d and %d", v.lo, v.hi)
	}
	*v.p = n
	return nil
}

type durationValue struct {
	p         *time.Duration
	allowZero bool
}

func (v *durationValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return v.p.String()
}

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	switch {
	case err != nil:
		return errors.New("not a duration (write a number with a unit, like 2ms, 1.5s or 1m)")
	case d < 0:
		return errors.New("must not be negative")
	case d == 0 && !v.allowZero:
		return errors.New("must be more than zero")
	}
	*v.p = d
	return nil
}

type boolValue struct{ p *bool }

func (v *boolValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return strconv.FormatBool(*v.p)
}

func (v *boolValue) Set(s string) error {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return errors.New("not a boolean (use true or false)")
	}
	*v.p = b
	return nil
}

func (v *boolValue) IsBoolFlag() bool { return true }

// URLUsage is the usage of a required --database-url flag.
const URLUsage = "PostgreSQL or CockroachDB URL (postgres://user:pass@host:port/db?sslmode=...); required"

// RequireURL reports a missing database URL (the value of --database-url
// after Parse) as an exit-2 error naming the flag and its variables.
func (f *FlagSet) RequireURL(url string) error {
	if url == "" {
		return &ExitError{Code: 2, Msg: "no database given: pass --database-url or set " + strings.Join(f.prog.URLVars, " or "),
			Hint: f.HelpHint()}
	}
	return nil
}

// floatValue is a flag holding a rate: a finite number, not negative.
type floatValue struct{ p *float64 }

func (v *floatValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return strconv.FormatFloat(*v.p, 'g', -1, 64)
}

func (v *floatValue) Set(s string) error {
	x, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	switch {
	case err != nil || math.IsNaN(x) || math.IsInf(x, 0):
		return errors.New("not a number")
	case x < 0:
		return errors.New("must not be negative (0: no limit)")
	}
	*v.p = x
	return nil
}

// FloatVar defines a flag holding a rate: a finite number, not negative.
func (f *FlagSet) FloatVar(p *float64, name, metavar, usage string) {
	f.Add(&floatValue{p: p}, name, metavar, usage)
}
