// Command demo is the demo and operator binary of crdbwork.
//
// With no command it runs the demo: it starts (or connects to) a database,
// enqueues items, works them off with several worker sessions (optionally
// killing worker processes as it goes), and proves that every item was
// acknowledged exactly once. The other commands operate a queue by hand:
// migrate, enqueue, work, status, verify, dead, requeue, cancel, parts,
// pause, resume, fair, cleanup and limit. Run `demo -h` for the list.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, cmd string, args []string, out *console) error
}

var commands = []command{
	{"run", "start the demo: enqueue items, work them off with several workers, verify exactly-once (the default)", cmdRun},
	{"bench", "run the demo without progress and print only the JSON summary with its throughput", cmdRun},
	{"migrate", "create the crdbwork schema, or upgrade it in place, and the demo tables", cmdMigrate},
	{"enqueue", "enqueue demo items (recorded for verify)", cmdEnqueue},
	{"work", "run one worker process until SIGINT or SIGTERM", cmdWork},
	{"status", "show sessions, part owners, backlog and dead items (--watch: keep it on screen)", cmdStatus},
	{"verify", "check that every enqueued demo item was acknowledged exactly once", cmdVerify},
	{"dead", "list the dead items of a queue", cmdDead},
	{"requeue", "move a dead item (or --all) back into its queue", cmdRequeue},
	{"cancel", "delete an item from its queue, claimed or not", cmdCancel},
	{"pause", "stop every claim of a queue (claimed items finish; enqueues go on)", cmdPause},
	{"resume", "let the workers claim from a paused queue again", cmdResume},
	{"fair", "show or set whether a queue serves its tenants in turn (on, off)", cmdFair},
	{"cleanup", "remove the demo's queue and tables from a database (--drop-schema: the crdbwork tables too)", cmdCleanup},
	{"parts", "show a queue's parts and their owners, or change their number (--set N)", cmdParts},
	{"limit", "set or show a queue's (or a tenant's) fleet-wide limits: --max-in-flight N, --rate R", cmdLimit},
}

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	out := newConsole(stdout, stderr)
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version" || args[0] == "version") {
		printVersion(stdout)
		return 0
	}
	name, explicit := "run", false
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, explicit, args = args[0], true, args[1:]
	}
	if name == "help" {
		if len(args) == 0 {
			topUsage(stdout)
			return 0
		}
		name, args = args[0], []string{"-h"}
	}
	if !explicit && len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		topUsage(stdout)
		fmt.Fprintln(stdout)
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == name {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		return report(out, &exitError{code: 2, msg: fmt.Sprintf("unknown command %q (commands: %s)", name, commandNames()),
			hint: "run `demo -h` for help"})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return report(out, cmd.run(ctx, cmd.name, args, out))
}

func commandNames() string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

func topUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: demo [command] [flags]

The demo and operator binary of crdbwork, a work queue in CockroachDB or
PostgreSQL tables. Without a command, demo runs "demo run".

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Every flag can also be set in the environment: --items is DEMO_ITEMS, --task-time
is DEMO_TASK_TIME (DEMO_ and the flag's name in capitals with _ for -), and
--database-url is DATABASE_URL. A flag on the command line wins over its variable.
The flags that move or drop data (requeue --all, parts --set, cleanup
--drop-schema) are read from the command line only.
Run "demo <command> -h" for a command's flags, "demo --version" for the version.

Exit status: 0 success; 1 the demo or verify found a problem (lost or duplicated
items, a timeout), an operation failed, or an item id is not there; 2 bad input,
an unreachable or missing database, a refused user, or a missing, incomplete,
older or newer schema.
`)
}

// exitError is an error with an exit status and a one-line message.
type exitError struct {
	code int
	msg  string
	hint string // printed after the message, like "run `demo run -h` for help"
	raw  bool   // print msg as is (it may span lines on purpose)
}

func (e *exitError) Error() string { return e.msg }

func failf(code int, format string, args ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

// exitCode is a result that is not an error: the command already printed
// what it had to say (for example a summary showing lost items).
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

// report prints err on one line and returns the exit status.
func report(out *console, err error) int {
	if err == nil || errors.Is(err, errHelp) {
		return 0
	}
	var code exitCode
	if errors.As(err, &code) {
		return int(code)
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		ee = &exitError{code: 1, msg: err.Error()}
	}
	msg := ee.msg
	if !ee.raw {
		msg = oneLine(msg)
	}
	if ee.hint != "" {
		msg += "; " + ee.hint
	}
	out.errorLine("demo: " + msg)
	return ee.code
}

// oneLine folds a multi-line message onto one line, dropping repeated
// lines (pgx repeats one error per connection attempt).
func oneLine(s string) string {
	var out []string
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || seen[l] {
			continue
		}
		seen[l] = true
		out = append(out, l)
	}
	return strings.Join(out, " ")
}
