package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// flagSet wraps flag.FlagSet with environment variables (a flag given on the
// command line wins over its variable), one-line errors and our own usage.
type flagSet struct {
	cmd     string
	summary string
	fs      *flag.FlagSet
	defs    []flagDef
	set     map[string]bool // given on the command line or in the environment
	// maxArgs is how many positional arguments the command takes (flags
	// may come before, between and after them); args holds them.
	maxArgs int
	argName string // for usage: like "[ID]"
	args    []string
}

type flagDef struct {
	name, metavar, usage, env, def string
}

func newFlagSet(cmd, summary string) *flagSet {
	fs := flag.NewFlagSet("demo "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{cmd: cmd, summary: summary, fs: fs, set: map[string]bool{}}
}

// envName returns the environment variable read for a flag.
func envName(name string) string {
	if name == "database-url" {
		return "DATABASE_URL"
	}
	return "DEMO_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

func (f *flagSet) add(v flag.Value, name, metavar, usage string) {
	def := v.String()
	f.fs.Var(v, name, usage)
	f.defs = append(f.defs, flagDef{name: name, metavar: metavar, usage: usage, env: envName(name), def: def})
}

func (f *flagSet) stringVar(p *string, name, def, metavar, usage string, check func(string) error) {
	*p = def
	f.add(&stringValue{p: p, check: check}, name, metavar, usage)
}

func (f *flagSet) intVar(p *int, name string, def, lo, hi int, usage string) {
	*p = def
	f.add(&intValue{p: p, lo: lo, hi: hi}, name, "N", usage)
}

func (f *flagSet) durationVar(p *time.Duration, name string, def time.Duration, allowZero bool, usage string) {
	*p = def
	f.add(&durationValue{p: p, allowZero: allowZero}, name, "DURATION", usage)
}

func (f *flagSet) boolVar(p *bool, name string, def bool, usage string) {
	*p = def
	f.add(&boolValue{p: p}, name, "", usage)
}

// flagOnly makes a flag unreadable from the environment: for the flags
// that destroy or move data (requeue --all, parts --set, cleanup
// --drop-schema), which a variable left set in a shell must not turn on.
func (f *flagSet) flagOnly(name string) {
	for i := range f.defs {
		if f.defs[i].name == name {
			f.defs[i].env = ""
		}
	}
}

// isSet reports whether the flag was given on the command line or in the
// environment (as opposed to left at its default).
func (f *flagSet) isSet(name string) bool { return f.set[name] }

// errHelp is returned by parse when -h was asked for; the usage is printed.
var errHelp = errors.New("help requested")

// parse parses args, then fills the flags not given from the environment.
// It prints the usage to out and returns errHelp for -h/--help.
func (f *flagSet) parse(args []string, out io.Writer) error {
	for {
		if err := f.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				f.usage(out)
				return errHelp
			}
			return f.usageError("%s", flagMessage(err))
		}
		if f.fs.NArg() == 0 {
			break
		}
		if len(f.args) >= f.maxArgs {
			return f.usageError("unexpected argument %q", f.fs.Arg(0))
		}
		f.args = append(f.args, f.fs.Arg(0))
		args = f.fs.Args()[1:]
	}
	f.fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	for _, d := range f.defs {
		if f.set[d.name] || d.env == "" {
			continue
		}
		val, ok := os.LookupEnv(d.env)
		if !ok || val == "" {
			continue
		}
		if err := f.fs.Set(d.name, val); err != nil {
			shown := val
			if d.name == "database-url" {
				shown = redactURL(val)
			}
			return f.usageError("invalid value %q in %s (for --%s): %v", shown, d.env, d.name, unwrapSetError(err))
		}
		f.set[d.name] = true
	}
	return nil
}

func (f *flagSet) usageError(format string, args ...any) error {
	return &exitError{code: 2, msg: fmt.Sprintf(format, args...), hint: fmt.Sprintf("run `demo %s -h` for help", f.cmd)}
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

// usage prints the command's usage, its flags and their variables.
func (f *flagSet) usage(out io.Writer) {
	fmt.Fprintf(out, "Usage: demo %s [flags]%s\n\n%s\n\n", f.cmd, map[bool]string{true: " " + f.argName}[f.argName != ""], strings.TrimSpace(f.summary))
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
		env := d.env
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

// common are the flags of every subcommand.
type common struct {
	databaseURL string
	queue       string
	logLevel    string
	json        bool
}

func (c *common) register(f *flagSet, urlUsage string) {
	f.stringVar(&c.databaseURL, "database-url", "", "URL", urlUsage, nil)
	f.stringVar(&c.queue, "queue", "demo", "NAME", "queue to work on", func(s string) error {
		if s == "" {
			return errors.New("must not be empty")
		}
		return nil
	})
	f.stringVar(&c.logLevel, "log-level", "warn", "LEVEL", "log level of the library's logs on stderr: debug, info, warn or error", checkLevel)
	f.boolVar(&c.json, "json", false, "print the result as one JSON object on one line")
}

const urlRequired = "PostgreSQL or CockroachDB URL (postgres://user:pass@host:port/db?sslmode=...); required"

// requireURL reports a missing --database-url.
func (c *common) requireURL(f *flagSet) error {
	if c.databaseURL == "" {
		return &exitError{code: 2, msg: "no database given: pass --database-url or set DATABASE_URL",
			hint: fmt.Sprintf("run `demo %s -h` for help", f.cmd)}
	}
	return nil
}

func checkLevel(s string) error {
	switch strings.ToLower(s) {
	case "debug", "info", "warn", "error":
		return nil
	}
	return errors.New("must be debug, info, warn or error")
}
