package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// recordAudit adds what a command did to the audit list the dashboard
// shows (crdbwork_audit), as the operating system's user on this host.
// A failure to record is a warning: the command itself succeeded.
func recordAudit(ctx context.Context, db crsql.DB, g *globals, out *cli.Console, action, detail string) {
	actor := os.Getenv("USER")
	if u, err := user.Current(); err == nil {
		actor = u.Username
	}
	if host, err := os.Hostname(); err == nil {
		actor += "@" + host
	}
	stmts := store.New(g.tables())
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		return store.Classify(stmts.AuditRecord(ctx, db, store.AuditRow{Actor: actor, Source: "cli", Action: action, Queue: g.queue, Detail: detail}))
	})
	if err != nil {
		msg := err.Error()
		if pgErr, ok := cli.Permission(err); ok {
			if m := explainPermission(pgErr); m != "" {
				msg = m
			}
		}
		out.Errorf("crdbwork %s: warning: not recorded in the audit list: %s", action, cli.OneLine(msg))
	}
}

// auditJSON is one audit row of `crdbwork audit --json`.
type auditJSON struct {
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Source string    `json:"source"`
	Action string    `json:"action"`
	Queue  string    `json:"queue"`
	Detail string    `json:"detail"`
}

func cmdAudit(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var actor, action, after string
	var since time.Duration
	var limit int
	f := prog.NewFlagSet(name, `Lists the audit rows, newest first: what operators changed, from the dashboard
or with these commands (requeue, cancel, pause, resume, parts, limits,
purge…), who did it and when. --actor, --action, --queue and --since filter
them. A page holds --limit rows; when more follow, it ends with the cursor of
the next page, for --after. Reads only.`)
	g.register(f, "only the rows of this queue")
	f.StringVar(&actor, "actor", "", "WHO", "only the rows of this actor (user@host for commands, the dashboard's user)", nil)
	f.StringVar(&action, "action", "", "ACTION", "only the rows of this action (requeue, cancel, pause, resume, parts, purge, …)", nil)
	f.DurationVar(&since, "since", 0, false, "only the rows of the last DURATION (e.g. 24h)")
	f.IntVar(&limit, "limit", 50, 1, 100_000, "most rows to list")
	f.StringVar(&after, "after", "", "CURSOR", "list the page after this cursor (printed at the end of the previous page)", nil)
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	var pos *store.AuditRow
	if after != "" {
		p, err := decodeAuditCursor(after)
		if err != nil {
			return f.UsageError("--after %q is not a cursor printed by crdbwork audit", after)
		}
		pos = &p
	}
	pool, err := g.open(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	filter := store.AuditFilter{Actor: actor, Action: action, Queue: g.queue, Within: since}
	st := store.New(g.tables())
	var rows []store.AuditRow
	err = retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		rows, err = st.AuditPageFilter(ctx, pool, filter, pos, limit+1)
		return store.Classify(err)
	})
	if err != nil {
		return cli.Failf(1, "reading the audit list: %v", err)
	}
	next := ""
	if len(rows) > limit {
		rows = rows[:limit]
		next = encodeAuditCursor(rows[limit-1])
	}
	if g.json {
		list := make([]auditJSON, len(rows))
		for i, a := range rows {
			list[i] = auditJSON{At: a.At.UTC(), Actor: a.Actor, Source: a.Source, Action: a.Action, Queue: a.Queue, Detail: a.Detail}
		}
		return cli.PrintJSON(out, map[string]any{"rows": list, "next": next})
	}
	if len(rows) == 0 {
		out.Printf("no audit rows%s\n", map[bool]string{true: " match"}[filter != (store.AuditFilter{})])
		return nil
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WHEN\tWHO\tFROM\tACTION\tQUEUE\tWHAT")
	for _, a := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.At.UTC().Format(time.RFC3339), a.Actor, a.Source, a.Action, orDash(a.Queue), cli.Fit(cli.OneLine(a.Detail), 80))
	}
	tw.Flush()
	if next != "" {
		fmt.Fprintf(&b, "more: --after %s\n", next)
	}
	out.Printf("%s", b.String())
	return nil
}

// encodeAuditCursor writes the position of an audit row as a token.
func encodeAuditCursor(a store.AuditRow) string {
	return base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf("%d.%s", a.At.UnixMicro(), a.ID)))
}

func decodeAuditCursor(s string) (store.AuditRow, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return store.AuditRow{}, err
	}
	at, id, ok := strings.Cut(string(raw), ".")
	var micros int64
	if _, err := fmt.Sscan(at, &micros); !ok || err != nil {
		return store.AuditRow{}, fmt.Errorf("not a cursor")
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return store.AuditRow{}, err
	}
	return store.AuditRow{At: time.UnixMicro(micros).UTC(), ID: u}, nil
}
