// Command demo is the demo of crdbwork.
//
// With no command it runs the demo: it starts (or connects to) a database,
// enqueues items, works them off with several worker sessions (optionally
// killing worker processes as it goes), and proves that every item was
// acknowledged exactly once. Its other commands enqueue demo items, run one
// demo worker, verify and clean up. Operating a queue by hand (status, dead
// items, requeue, pause, limits, schema migrations) is the crdbwork
// command's job (cmd/crdbwork); the demo's old names for those commands
// say so and exit 2. Run `demo -h` for the list.
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

	"github.com/crdbwork/crdbwork/internal/cli"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, cmd string, args []string, out *cli.Console) error
}

var commands = []command{
	{"run", "start the demo: enqueue items, work them off with several workers, verify exactly-once (the default)", cmdRun},
	{"bench", "run the demo without progress and print only the JSON summary with its throughput", cmdRun},
	{"enqueue", "enqueue demo items (recorded for verify)", cmdEnqueue},
	{"work", "run one worker process until SIGINT or SIGTERM", cmdWork},
	{"verify", "check that every enqueued demo item was acknowledged exactly once", cmdVerify},
	{"cleanup", "remove the demo's queue and tables from a database (--drop-schema: the crdbwork tables too)", cmdCleanup},
}

// movedCommands are the operator commands that moved to the crdbwork
// command (cmd/crdbwork) in 0.4. For one version their old names stay, and
// say where they went.
var movedCommands = []string{"migrate", "status", "dead", "requeue", "cancel", "pause", "resume", "fair", "parts", "limit"}

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	out := cli.NewConsole(stdout, stderr)
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version" || args[0] == "version") {
		cli.PrintVersion(stdout, "crdbwork demo")
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
	if cmd == nil && slices.Contains(movedCommands, name) {
		// The arguments are not echoed: they may hold a database password.
		out.ErrorLine(fmt.Sprintf("demo %s moved to the crdbwork command: crdbwork %s ... (see `crdbwork %s -h`)", name, name, name))
		return 2
	}
	if cmd == nil {
		return prog.Report(out, &cli.ExitError{Code: 2, Msg: fmt.Sprintf("unknown command %q (commands: %s)", name, commandNames()),
			Hint: "run `demo -h` for help"})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return prog.Report(out, cmd.run(ctx, cmd.name, args, out))
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

The demo of crdbwork, a work queue in CockroachDB or PostgreSQL tables.
Without a command, demo runs "demo run". To operate a queue (status, dead
items, requeue, pause, limits, schema migrations), use the crdbwork command.

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Every flag can also be set in the environment: --items is DEMO_ITEMS, --task-time
is DEMO_TASK_TIME (DEMO_ and the flag's name in capitals with _ for -), and
--database-url is DATABASE_URL. A flag on the command line wins over its variable.
The flags that drop data (cleanup --drop-schema) are read from the command
line only.
Run "demo <command> -h" for a command's flags, "demo --version" for the version.

Exit status: 0 success; 1 the demo or verify found a problem (lost or duplicated
items, a timeout) or an operation failed; 2 bad input, an unreachable or missing
database, a refused user, a missing, incomplete, older or newer schema, or a
command that moved to crdbwork (migrate, status, dead, requeue, cancel, pause,
resume, fair, parts, limit).
`)
}
