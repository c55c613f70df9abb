// Command crdbwork is the operator's command for crdbwork queues: it
// creates and upgrades the schema, shows a queue's state, lists and
// requeues dead items, cancels items, pauses and resumes queues, sets their
// parts, limits, fairness and sequencing, and purges a queue. It writes no SQL of its
// own: every command calls the library (claim, session, partition, sql).
//
// Run `crdbwork -h` for the commands, `crdbwork <command> -h` for a
// command's flags. See docs/cli.md.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// prog is this binary for the shared command-line plumbing.
var prog = cli.Program{Name: "crdbwork", EnvPrefix: "CRDBWORK_", URLVars: []string{"CRDBWORK_DATABASE_URL", "DATABASE_URL"},
	ExplainPermission: explainPermission}

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, cmd string, args []string, out *cli.Console) error
}

var commands = []command{
	{"migrate", "create the crdbwork schema, or upgrade it in place (--dry-run: say what it would do)", cmdMigrate},
	{"status", "show every queue, or one (--queue): sessions, parts, backlog, dead items, settings (--watch)", cmdStatus},
	{"dead", "list a queue's dead items (filters, --limit, --after cursor, --count)", cmdDead},
	{"requeue", "move dead items back into their queue: one ID, --all, or by filter", cmdRequeue},
	{"cancel", "cancel items of a queue: unclaimed ones end at once, running ones are stopped (--reason, --wait)", cmdCancel},
	{"cancelled", "list a queue's cancelled items: who cancelled them, why, when, whether they were running", cmdCancelled},
	{"deps", "show what an item waits for, and which items wait for it", cmdDeps},
	{"item", "show one item wherever it is (queued, claimed, waiting, dead, cancelled, ended): payload, attempts, errors", cmdItem},
	{"audit", "list what operators did (the dashboard's and these commands' changes), newest first, with filters", cmdAudit},
	{"pause", "stop every claim of a queue (claimed items finish; enqueues go on)", cmdPause},
	{"resume", "let the workers claim from a paused queue again", cmdResume},
	{"parts", "show a queue's parts and their owners, or change their number (--set N)", cmdParts},
	{"limit", "set or show a queue's (or a tenant's) fleet-wide limits: --max-in-flight N, --rate R", cmdLimit},
	{"fair", "show or set whether a queue serves its tenants in turn (on, off)", cmdFair},
	{"retention", "show or set how long and how many dead items a queue keeps (--dead-max-age, --dead-max-count)", cmdRetention},

	{"sequence", "show or set whether a queue runs one item per key at a time, in order (on, off), what a death does (hold, advance), blocked keys, release", cmdSequence},
	{"schedules", "list, add, change, remove, pause or resume periodic schedules stored in the database", cmdSchedules},
	{"purge", "delete everything of a queue: items, dead items, parts, limits, settings, ended ids", cmdPurge},
	{"grants", "check that the database user has every privilege a worker needs on the crdbwork tables (exit 2 naming what it lacks)", cmdGrants},
	{"dashboard", "serve the live web dashboard (--addr, default 127.0.0.1 only; --read-only; basic auth)", cmdDashboard},
	{"version", "print the version", cmdVersion},
}

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	out := cli.NewConsole(stdout, stderr)
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" && len(args) == 1 {
		topUsage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args[0] = "version"
	}
	name := args[0]
	args = args[1:]
	if name == "help" {
		name, args = args[0], []string{"-h"}
	}
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
	if i < 0 {
		msg := fmt.Sprintf("unknown command %q (commands: %s)", name, commandNames())
		if s := suggest(name, commandList()); s != "" {
			msg += fmt.Sprintf("; did you mean %q?", s)
		}
		return prog.Report(out, &cli.ExitError{Code: 2, Msg: msg, Hint: "run `crdbwork -h` for help"})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return prog.Report(out, commands[i].run(ctx, name, args, out))
}

func commandList() []string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return names
}

func commandNames() string { return strings.Join(commandList(), ", ") }

func topUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: crdbwork <command> [flags]

The operator's command for crdbwork, a work queue in CockroachDB or PostgreSQL
tables. It calls the crdbwork library; it writes no SQL of its own.

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Flags of every command (but version):
  --database-url URL  the database (CRDBWORK_DATABASE_URL or DATABASE_URL)
  --schema NAME       the schema of the crdbwork tables (CRDBWORK_SCHEMA)
  --prefix PREFIX     the tables' prefix instead of crdbwork_ (CRDBWORK_PREFIX)
  --queue NAME        the queue (CRDBWORK_QUEUE); status without it shows every queue
  --json              print the result as one JSON object per line on stdout

Every flag can also be set in the environment: CRDBWORK_ and the flag's name in
capitals with _ for -. A flag on the command line wins over its variable. The
flags that move or delete data (--yes, --all, --set, --remove, --death,
--create, and requeue's filters) are read from the command line only.

A queue that is not in the database (no row in the queues table, no items, no
dead or waiting items, no ended ids, no schedules) is refused, with a suggestion when a known queue's name is close;
migrate and status without --queue excepted. To set a new queue up before its
first item, give --create to parts, limit, fair, sequence or pause. The commands that delete or move
many rows (requeue of more than one item, cancel, purge, parts --set) say what
they will do and need --yes; --dry-run shows it and changes nothing.

Exit status:
  0  success
  1  the operation failed, or the item is not there
  2  bad input (an unknown command, flag, value or queue), a refusal (a
     destructive command without --yes), an unreachable or missing database,
     a refused user (a wrong password, or a statement refused for lack of a
     privilege: one line names the table and the privileges), or a missing,
     incomplete, older or newer schema

Run "crdbwork <command> -h" for a command's flags. See docs/cli.md.
`)
}

// globals are the flags of every command.
type globals struct {
	databaseURL string
	schema      string
	prefix      string
	queue       string
	json        bool
	// create accepts a queue the database does not know yet (--create, on
	// the commands that set a queue up).
	create bool
}

func (g *globals) register(f *cli.FlagSet, queueUsage string) {
	f.StringVar(&g.databaseURL, "database-url", "", "URL", cli.URLUsage, nil)
	f.StringVar(&g.schema, "schema", "", "NAME", "schema of the crdbwork tables (default: the connection's search path)", nil)
	f.StringVar(&g.prefix, "prefix", "", "PREFIX", "prefix of the crdbwork tables, in place of crdbwork_", nil)
	f.StringVar(&g.queue, "queue", "", "NAME", queueUsage, nil)
	f.BoolVar(&g.json, "json", false, "print the result as JSON on stdout (one object per line)")
}

const queueRequired = "the queue; required"

// registerCreate adds --create, for the commands that set a queue up before
// its first item (its parts, limits, fairness, pause).
func (g *globals) registerCreate(f *cli.FlagSet) {
	f.BoolVar(&g.create, "create", false, "accept a queue that does not exist yet, and set it up (else an unknown queue is refused)")
	f.FlagOnly("create")
}

// tables returns the table names of --schema and --prefix.
func (g *globals) tables() crsql.Tables { return crsql.Tables{Schema: g.schema, Prefix: g.prefix} }

// open checks the flags, connects and checks the schema.
func (g *globals) open(ctx context.Context, f *cli.FlagSet) (*pgxpool.Pool, error) {
	if err := g.tables().Validate(); err != nil {
		return nil, f.UsageError("--schema or --prefix: %v", err)
	}
	opened.url, opened.tables = g.databaseURL, g.tables()
	return cli.OpenChecked(ctx, f, g.databaseURL, g.tables(), 2)
}

// openQueue is open for a command on one existing queue: --queue must be
// given and name a queue the database knows (or, with --create, any name).
func (g *globals) openQueue(ctx context.Context, f *cli.FlagSet) (*pgxpool.Pool, *claim.Queue, error) {
	if g.queue == "" {
		return nil, nil, f.UsageError("no queue given: pass --queue or set CRDBWORK_QUEUE")
	}
	pool, err := g.open(ctx, f)
	if err != nil {
		return nil, nil, err
	}
	if !g.create {
		if err := requireQueue(ctx, pool, g.tables(), g.queue); err != nil {
			pool.Close()
			return nil, nil, err
		}
	}
	q, err := claim.New(pool, claim.Options{Queue: g.queue, Tables: g.tables()})
	if err != nil {
		pool.Close()
		return nil, nil, cli.Failf(2, "%v", err)
	}
	return pool, q, nil
}

// requireQueue refuses a queue the database does not know, suggesting a
// known one with a close name.
func requireQueue(ctx context.Context, db claim.DB, t crsql.Tables, name string) error {
	names, err := claim.Queues(ctx, db, t)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	if slices.Contains(names, name) {
		return nil
	}
	msg := fmt.Sprintf("unknown queue %q: it has no row in the queues table, no items, no dead or waiting items, no ended ids and no schedules", name)
	if s := suggest(name, names); s != "" {
		msg += fmt.Sprintf("; did you mean %q?", s)
	} else if len(names) > 0 {
		shown := names
		if len(shown) > 10 {
			shown = shown[:10]
		}
		msg += fmt.Sprintf(" (queues: %s)", strings.Join(shown, ", "))
	}
	return &cli.ExitError{Code: 2, Msg: msg, Hint: "`crdbwork status` lists the queues"}
}

// suggest returns the name in names closest to name by edit distance, if
// it is close: at most 2 edits, and fewer than half of name's length.
func suggest(name string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		d := distance(name, n)
		if d < bestD && d*2 < max(len([]rune(name)), 2) {
			best, bestD = n, d
		}
	}
	return best
}

// distance is the Levenshtein distance of a and b, counting an adjacent
// transposition ("deom" for "demo") as one edit.
func distance(a, b string) int {
	x, y := []rune(a), []rune(b)
	d := make([][]int, len(x)+1)
	for i := range d {
		d[i] = make([]int, len(y)+1)
		d[i][0] = i
	}
	for j := range y {
		d[0][j+1] = j + 1
	}
	for i := 1; i <= len(x); i++ {
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(x)][len(y)]
}

// refuse is the exit-2 refusal of a destructive command without --yes:
// what it would do was printed.
func refuse(f *cli.FlagSet) error {
	return &cli.ExitError{Code: 2, Msg: "refused: nothing was changed; run it again with --yes to do it (or --dry-run to only show it)", Hint: f.HelpHint()}
}

// confirmFlags are --yes and --dry-run.
type confirmFlags struct{ yes, dryRun bool }

func (c *confirmFlags) register(f *cli.FlagSet) {
	f.BoolVar(&c.yes, "yes", false, "do it: needed to delete or move many rows")
	f.FlagOnly("yes")
	f.BoolVar(&c.dryRun, "dry-run", false, "only show what it would do; change nothing")
}

func (c *confirmFlags) check(f *cli.FlagSet) error {
	if c.yes && c.dryRun {
		return f.UsageError("--yes and --dry-run exclude each other")
	}
	return nil
}

func cmdVersion(_ context.Context, name string, args []string, out *cli.Console) error {
	var asJSON bool
	f := prog.NewFlagSet(name, "Prints the version of crdbwork this binary belongs to, and how it was built.")
	f.BoolVar(&asJSON, "json", false, "print the version as JSON")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if asJSON {
		return cli.PrintJSON(out, map[string]any{"version": cli.Version, "line": cli.VersionLine("crdbwork"), "schema_version": crsql.Version})
	}
	cli.PrintVersion(out.Stdout(), "crdbwork")
	return nil
}
