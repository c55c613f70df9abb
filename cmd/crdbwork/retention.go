package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
)

// retentionJSON is a queue's retention of dead items, as `crdbwork
// retention` and `crdbwork status` show it: 0 is no bound.
type retentionJSON struct {
	DeadMaxAgeSeconds float64 `json:"dead_max_age_seconds"`
	DeadMaxCount      int64   `json:"dead_max_count"`
	// HistorySeconds is how long ended items are kept with their history
	// (0: for the dedup window only).
	HistorySeconds float64 `json:"history_seconds"`
}

func retentionOf(r claim.Retention) retentionJSON {
	return retentionJSON{DeadMaxAgeSeconds: r.DeadMaxAge.Seconds(), DeadMaxCount: r.DeadMaxCount, HistorySeconds: r.HistoryWindow.Seconds()}
}

// format renders r for people.
func (r retentionJSON) format() string {
	age, count := "any age", "any number"
	if d := secs(r.DeadMaxAgeSeconds); d > 0 && d%(24*time.Hour) == 0 {
		age = fmt.Sprintf("at most %d days old", d/(24*time.Hour))
	} else if d > 0 {
		age = "at most " + d.String() + " old"
	}
	if r.DeadMaxCount > 0 {
		count = fmt.Sprintf("at most %d", r.DeadMaxCount)
	}
	hist := "for the dedup window only"
	if d := secs(r.HistorySeconds); d > 0 && d%(24*time.Hour) == 0 {
		hist = fmt.Sprintf("for %d days", d/(24*time.Hour))
	} else if d > 0 {
		hist = "for " + d.String()
	}
	if secs(r.HistorySeconds) == 24*time.Hour {
		hist = "for a day"
	}
	return fmt.Sprintf("keeps dead items %s, %s; ended items with their history %s", age, count, hist)
}

// progressRow is one item with a reported progress, for `crdbwork status`.
type progressRow struct {
	ID          string  `json:"id"`
	Part        int     `json:"part"`
	Running     bool    `json:"running"`
	Attempt     int     `json:"attempt"`
	MaxAttempts int     `json:"max_attempts"`
	Done        int64   `json:"done"`
	Total       int64   `json:"total"`
	AgeSeconds  float64 `json:"age_seconds"`
	// CheckpointBytes is the size of its checkpoint (0: none).
	CheckpointBytes int64 `json:"checkpoint_bytes"`
}

// readProgress lists q's items with a reported progress (at most
// claim.DefaultProgressing).
func readProgress(ctx context.Context, q *claim.Queue) ([]progressRow, error) {
	list, err := q.Progressing(ctx, claim.DefaultProgressing)
	if err != nil {
		return nil, err
	}
	out := make([]progressRow, len(list))
	for i, p := range list {
		out[i] = progressRow{ID: p.ID.String(), Part: p.Part, Running: p.Running, Attempt: p.Attempt, MaxAttempts: p.MaxAttempts,
			Done: p.Progress.Done, Total: p.Progress.Total, AgeSeconds: p.Age.Seconds(), CheckpointBytes: p.CheckpointBytes}
	}
	return out, nil
}

// writeProgress writes the items with a reported progress (nothing if none).
func writeProgress(b *strings.Builder, rows []progressRow, compact bool) {
	if len(rows) == 0 {
		return
	}
	running := 0
	for _, r := range rows {
		if r.Running {
			running++
		}
	}
	fmt.Fprintf(b, "\nprogress: %s one (%d running; the latest %d reports shown first)\n", verb(len(rows), "item reported", "items reported"), running, claim.DefaultProgressing)
	if compact {
		return
	}
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ITEM\tPART\tSTATE\tATTEMPT\tPROGRESS\tREPORTED\tCHECKPOINT")
	for _, r := range rows {
		state := "waiting"
		if r.Running {
			state = "running"
		}
		ckpt := "-"
		if r.CheckpointBytes > 0 {
			ckpt = fmt.Sprintf("%d B", r.CheckpointBytes)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d/%d\t%s\t%s ago\t%s\n", r.ID, r.Part, state, r.Attempt, r.MaxAttempts,
			claim.Progress{Done: r.Done, Total: r.Total}, round(secs(r.AgeSeconds)), ckpt)
	}
	tw.Flush()
}

// parseBound reads a retention flag's value: "off" (no bound), "default"
// (the default bound), or a value parse accepts.
func parseBound[T any](s string, parse func(string) (T, error)) (v T, off, def bool, err error) {
	switch strings.ToLower(s) {
	case "off", "none":
		return v, true, false, nil
	case "default":
		return v, false, true, nil
	}
	v, err = parse(s)
	return v, false, false, err
}

// parseAge reads a Go duration, or a number of days ("30d").
func parseAge(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(d, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("bad number of days %q", s)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("bad duration %q (like 720h or 30d; off: no age bound)", s)
	}
	return d, nil
}

func parseCount(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("bad count %q (a positive number; off: no count bound)", s)
	}
	return n, nil
}

// tighter reports whether next deletes dead items that cur keeps: a bound
// turned on or lowered.
func tighter(cur, next claim.Retention) bool {
	return (cur.NoDeadMaxAge && !next.NoDeadMaxAge) || (!next.NoDeadMaxAge && next.DeadMaxAge < cur.DeadMaxAge) ||
		(cur.NoDeadMaxCount && !next.NoDeadMaxCount) || (!next.NoDeadMaxCount && next.DeadMaxCount < cur.DeadMaxCount) ||
		next.HistoryWindow < cur.HistoryWindow
}

func cmdRetention(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var cf confirmFlags
	var ageFlag, countFlag, histFlag string
	f := prog.NewFlagSet(name, fmt.Sprintf(`Shows or sets how long and how many dead items --queue keeps. Every worker
session's reaper deletes the dead items older than --dead-max-age and the
oldest beyond the newest --dead-max-count, in batches (see docs/retention.md).
A queue never set keeps %s and %d. "off" removes a bound, "default"
restores the default. --history is how long the queue keeps ended items (acked,
dead, cancelled) with their attempts' history, for "crdbwork item" and the
dashboard (default a day; they stay at least the dedup window; off: the dedup
window only). The flags not given keep their stored values. A change
that deletes more (a bound lowered or turned on) says so and needs --yes
(--dry-run only shows it). Without a flag it shows the retention.`, claim.DefaultDeadMaxAge, claim.DefaultDeadMaxCount))
	g.register(f, queueRequired)
	g.registerCreate(f)
	cf.register(f)
	f.StringVar(&ageFlag, "dead-max-age", "", "DURATION", "delete dead items older than this (like 720h or 30d; off: any age; default: 30d)", func(s string) error {
		_, _, _, err := parseBound(s, parseAge)
		return err
	})
	f.StringVar(&countFlag, "dead-max-count", "", "N", "keep at most the newest N dead items (off: any number; default: 100000)", func(s string) error {
		_, _, _, err := parseBound(s, parseCount)
		return err
	})
	f.StringVar(&histFlag, "history", "", "DURATION", "keep ended items with their history this long (like 24h or 7d; off: the dedup window only; default: 1d)", func(s string) error {
		_, _, _, err := parseBound(s, parseAge)
		return err
	})
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if err := cf.check(f); err != nil {
		return err
	}
	setting := f.IsSet("dead-max-age") || f.IsSet("dead-max-count") || f.IsSet("history")
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	set, err := q.Settings(ctx)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	cur := set.Retention
	if !setting {
		return report(out, &g, map[string]any{"queue": g.queue, "retention": retentionOf(cur)},
			fmt.Sprintf("queue %q %s\n", g.queue, retentionOf(cur).format()))
	}
	next := cur
	if f.IsSet("dead-max-age") {
		age, off, def, _ := parseBound(ageFlag, parseAge)
		next.DeadMaxAge, next.NoDeadMaxAge = age, off
		if def {
			next.DeadMaxAge = claim.DefaultDeadMaxAge
		}
	}
	if f.IsSet("dead-max-count") {
		n, off, def, _ := parseBound(countFlag, parseCount)
		next.DeadMaxCount, next.NoDeadMaxCount = n, off
		if def {
			next.DeadMaxCount = claim.DefaultDeadMaxCount
		}
	}
	if f.IsSet("history") {
		d, off, def, _ := parseBound(histFlag, parseAge)
		next.HistoryWindow, next.NoHistory = d, off
		if def {
			next.HistoryWindow = claim.DefaultHistoryWindow
		}
	}
	if next.NoHistory {
		next.HistoryWindow = 0
	}
	if next.NoDeadMaxAge {
		next.DeadMaxAge = 0
	}
	if next.NoDeadMaxCount {
		next.DeadMaxCount = 0
	}
	if err := next.Validate(); err != nil {
		return f.UsageError("%v", err)
	}
	what := fmt.Sprintf("queue %q %s (was: %s)", g.queue, retentionOf(next).format(), strings.TrimPrefix(retentionOf(cur).format(), "keeps dead items "))
	if tighter(cur, next) && (cf.dryRun || !cf.yes) {
		info, err := q.Inspect(ctx)
		if err != nil {
			return cli.Failf(1, "%v", err)
		}
		switch {
		case cf.dryRun && g.json:
			return cli.PrintJSON(out, map[string]any{"queue": g.queue, "dry_run": true, "retention": retentionOf(next), "was": retentionOf(cur), "dead": info.Dead})
		case cf.dryRun:
			out.Printf("would set: %s; the reapers would then delete the dead items beyond it (the queue holds %d)\n", what, info.Dead)
			return nil
		}
		out.Errorf("crdbwork retention: this would set %s, and the reapers would delete the dead items beyond it (the queue holds %d)", what, info.Dead)
		return refuse(f)
	}
	if cf.dryRun {
		return report(out, &g, map[string]any{"queue": g.queue, "dry_run": true, "retention": retentionOf(next), "was": retentionOf(cur)},
			"would set: "+what+"\n")
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Retention: &next}); err != nil {
		return cli.Failf(1, "%v", err)
	}
	return report(out, &g, map[string]any{"queue": g.queue, "retention": retentionOf(next), "was": retentionOf(cur)}, what+"\n")
}
