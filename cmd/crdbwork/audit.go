package main

import (
	"context"
	"os"
	"os/user"

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
		out.Errorf("crdbwork %s: warning: not recorded in the audit list: %v", action, err)
	}
}
