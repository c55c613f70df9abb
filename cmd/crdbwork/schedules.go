package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/schedule"
)

type scheduleJSON struct {
	Queue      string     `json:"queue"`
	Name       string     `json:"name"`
	Stored     bool       `json:"stored"`
	Every      string     `json:"every,omitempty"`
	Cron       string     `json:"cron,omitempty"`
	Missed     string     `json:"missed,omitempty"`
	Payload    []byte     `json:"payload,omitempty"` // base64 in JSON
	Key        string     `json:"key,omitempty"`
	Priority   int        `json:"priority,omitempty"`
	Timeout    string     `json:"timeout,omitempty"`
	Paused     bool       `json:"paused"`
	LastPeriod *time.Time `json:"last_period,omitempty"`
	Next       *time.Time `json:"next,omitempty"`
	Error      string     `json:"error,omitempty"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

func cmdSchedules(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var every, ttl, timeout, delay time.Duration
	var cron, payload, payloadFile, key, tenant string
	var priority, maxAttempts, limit int
	var skip bool
	f := prog.NewFlagSet(name, `Lists, adds, changes, removes, pauses and resumes periodic schedules
(docs/periodic.md). A schedule stored in the database runs on every
schedule.Runner of its queue (unless it was started with NoStored), which
picks up an added, changed, paused or removed schedule without a restart:
a change takes effect at the schedule's next period, an added schedule
within the runners' reload interval (default 10 s). Each period gets one
item however many runners run it.

  list                 the schedules of --queue (all queues without it):
                       stored ones, and those defined in code that fired
  add NAME             store a schedule in --queue, or change the stored one
                       of that name: --every D or --cron EXPR, and the item
                       (--payload, --key, --priority, --timeout...)
  remove NAME          delete a stored schedule (one in code is removed from
                       its code; pause it meanwhile)
  pause NAME           stop a schedule, stored or in code, on every runner of
                       crdbwork 0.6 or newer (older runners do not know
                       pauses)
  resume NAME          let it go on from its current period`)
	f.MaxArgs, f.ArgName = 2, "[list|add|remove|pause|resume] [NAME]"
	g.register(f, "the queue (required but for list)")
	g.registerCreate(f)
	f.DurationVar(&every, "every", 0, false, `the schedule's interval (add): periods are its multiples since the Unix epoch`)
	f.StringVar(&cron, "cron", "", "EXPR", `the schedule's cron expression (add), in UTC unless it starts with CRON_TZ=Zone`, nil)
	f.BoolVar(&skip, "skip-missed", false, `enqueue nothing for periods missed while no runner ran (add; default: the latest missed one)`)
	f.StringVar(&payload, "payload", "", "TEXT", `each period's item's payload (add)`, nil)
	f.StringVar(&payloadFile, "payload-file", "", "FILE", `read the payload from FILE (add; - for stdin)`, nil)
	f.StringVar(&key, "key", "", "KEY", `the item's key (add)`, nil)
	f.StringVar(&tenant, "tenant", "", "NAME", `the item's tenant (add)`, nil)
	f.IntVar(&priority, "priority", 0, -1<<31, 1<<31-1, `the item's priority (add; lower runs first)`)
	f.IntVar(&maxAttempts, "max-attempts", 0, 0, 1<<31-1, `the item's attempts (add; 0: the queue's default)`)
	f.DurationVar(&timeout, "timeout", 0, true, `the item's own handler timeout (add; 0: the workers' ItemTimeout)`)
	f.DurationVar(&ttl, "ttl", 0, true, `the item's time to live (add; 0: none)`)
	f.DurationVar(&delay, "delay", 0, true, `delay each period's item by this much (add)`)
	f.IntVar(&limit, "limit", 1000, 1, schedule.MaxList, `the most schedules to list`)
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	verb, sched := "list", ""
	if len(f.Args) > 0 {
		verb = strings.ToLower(f.Args[0])
	}
	if len(f.Args) > 1 {
		sched = f.Args[1]
	}
	addFlags := []string{"every", "cron", "skip-missed", "payload", "payload-file", "key", "tenant", "priority", "max-attempts", "timeout", "ttl", "delay"}
	if verb != "add" {
		for _, fl := range addFlags {
			if f.IsSet(fl) {
				return f.UsageError("--%s is for add", fl)
			}
		}
	}
	switch verb {
	case "list":
		if sched != "" {
			return f.UsageError("list takes no name (--queue chooses the queue)")
		}
		return schedulesList(ctx, f, &g, limit, out)
	case "add", "remove", "pause", "resume":
		if sched == "" {
			return f.UsageError("%s needs the schedule's name", verb)
		}
	default:
		return f.UsageError("unexpected argument %q: say list, add, remove, pause or resume", f.Args[0])
	}
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch verb {
	case "add":
		if payloadFile != "" && payload != "" {
			return f.UsageError("give --payload or --payload-file, not both")
		}
		body := []byte(payload)
		if payloadFile != "" {
			var err error
			if payloadFile == "-" {
				body, err = io.ReadAll(os.Stdin)
			} else {
				body, err = os.ReadFile(payloadFile)
			}
			if err != nil {
				return cli.Failf(2, "--payload-file: %v", err)
			}
		}
		missed := schedule.CatchUp
		if skip {
			missed = schedule.Skip
		}
		s := schedule.Schedule{Name: sched, Every: every, Cron: cron, Missed: missed, Item: claim.NewItem{
			Payload: body, Key: key, Tenant: tenant, Priority: priority, MaxAttempts: maxAttempts, Timeout: timeout, TTL: ttl, Delay: delay}}
		if err := schedule.Put(ctx, q, s); err != nil {
			if errors.Is(err, schedule.ErrBadSchedule) {
				return cli.Failf(2, "%v", err)
			}
			return cli.Failf(1, "%v", err)
		}
		if g.json {
			return cli.PrintJSON(out, map[string]any{"queue": g.queue, "schedule": sched, "stored": true})
		}
		out.Printf("schedule %q of queue %q stored: every runner of the queue runs it from its next reload\n", sched, g.queue)
	case "remove":
		if err := schedule.Delete(ctx, q, sched); err != nil {
			return cli.Failf(1, "%v", err)
		}
		if g.json {
			return cli.PrintJSON(out, map[string]any{"queue": g.queue, "schedule": sched, "removed": true})
		}
		out.Printf("schedule %q of queue %q removed: no runner enqueues its periods any more\n", sched, g.queue)
	case "pause", "resume":
		if err := schedule.Pause(ctx, q, sched, verb == "pause"); err != nil {
			return cli.Failf(1, "%v", err)
		}
		if g.json {
			return cli.PrintJSON(out, map[string]any{"queue": g.queue, "schedule": sched, "paused": verb == "pause"})
		}
		if verb == "pause" {
			out.Printf("schedule %q of queue %q paused: no runner of crdbwork 0.6 or newer enqueues its periods\n", sched, g.queue)
		} else {
			out.Printf("schedule %q of queue %q resumed\n", sched, g.queue)
		}
	}
	return nil
}

// schedulesList prints the schedules of --queue (or every queue).
func schedulesList(ctx context.Context, f *cli.FlagSet, g *globals, limit int, out *cli.Console) error {
	pool, err := g.open(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	list, err := schedule.List(ctx, pool, g.tables(), g.queue, limit)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	if g.json {
		for _, s := range list {
			if err := cli.PrintJSON(out, scheduleOf(s)); err != nil {
				return err
			}
		}
		return nil
	}
	if len(list) == 0 {
		out.Printf("no schedules\n")
		return nil
	}
	tw := tabwriter.NewWriter(out.Stdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tNAME\tKIND\tPERIODS\tSTATE\tLAST PERIOD\tNEXT")
	for _, s := range list {
		j := scheduleOf(s)
		kind, periods := "in code", "-"
		if s.Stored {
			kind = "stored"
			periods = j.Every
			if j.Cron != "" {
				periods = "cron " + j.Cron
			}
			if s.Err != nil {
				periods = "(cannot run: see --json)"
			}
		}
		state := "running"
		if s.Paused {
			state = "paused"
		}
		last, next := "-", "-"
		if j.LastPeriod != nil {
			last = j.LastPeriod.Format(time.RFC3339)
		}
		if j.Next != nil {
			next = j.Next.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Queue, s.Name, kind, periods, state, last, next)
	}
	return tw.Flush()
}

// scheduleOf returns the JSON form of s.
func scheduleOf(s schedule.Info) scheduleJSON {
	j := scheduleJSON{Queue: s.Queue, Name: s.Name, Stored: s.Stored, Paused: s.Paused, UpdatedAt: s.UpdatedAt}
	if !s.LastPeriod.IsZero() {
		t := s.LastPeriod
		j.LastPeriod = &t
	}
	if !s.Next.IsZero() {
		t := s.Next
		j.Next = &t
	}
	if s.Err != nil {
		j.Error = s.Err.Error()
	}
	if s.Stored && s.Err == nil {
		sc := s.Schedule
		if sc.Every != 0 {
			j.Every = sc.Every.String()
		}
		j.Cron, j.Missed = sc.Cron, sc.Missed.String()
		j.Payload, j.Key, j.Priority = sc.Item.Payload, sc.Item.Key, sc.Item.Priority
		if sc.Item.Timeout != 0 {
			j.Timeout = sc.Item.Timeout.String()
		}
	}
	return j
}
