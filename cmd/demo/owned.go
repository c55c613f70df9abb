package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// The demo works only on what it made: the queues it created (recorded in
// its own table demo_queues) and its tables (demo_results, demo_enqueued,
// demo_runs, demo_queues). Before it writes anything, run, work and enqueue
// check the database (checkOwnership): a queue the demo did not create is
// never worked, enqueued into or cleaned up (the demo's handler would ack
// its items), and a database holding other queues is refused unless the
// command is given --shared-database.

// store runs the library's statements the demo needs on crdbwork's tables
// (internal/store/verify.go): the demo writes no SQL on them itself.
var stmts = store.New(tables)

// demoTablesSQL creates the demo's own tables. demo_results has no unique
// constraint on item_id on purpose: a duplicate acknowledgement would show
// up as a second row, which verify counts. demo_enqueued has no index on
// run_id (earlier demos made demo_enqueued_run_id, which is left alone):
// every enqueued item is a row of it, written in the enqueue's transaction,
// so each index on it costs "demo enqueue" a write per item, and verify
// --run-id reads the table through, as verify without it does.
var demoTablesSQL = []string{
	`CREATE TABLE IF NOT EXISTS demo_results (
    row_id     UUID        NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
    item_id    UUID        NOT NULL,
    session_id UUID        NOT NULL,
    part       BIGINT      NOT NULL,
    attempt    BIGINT      NOT NULL,
    done_at    TIMESTAMPTZ NOT NULL DEFAULT now()
)`,
	`CREATE INDEX IF NOT EXISTS demo_results_item_id ON demo_results (item_id)`,
	`CREATE TABLE IF NOT EXISTS demo_enqueued (
    item_id UUID NOT NULL PRIMARY KEY,
    run_id  UUID NOT NULL
)`,
}

// demoOwnTablesSQL adds to demoTablesSQL what this version of the demo
// keeps: the queues it created, and the queue of every recorded item (so
// that verify and cleanup can tell queues apart). The column is added only
// when it is missing (addQueueColumn): ALTER TABLE waits for a lock even
// when it has nothing to do.
var demoOwnTablesSQL = []string{
	`CREATE TABLE IF NOT EXISTS demo_queues (
    queue      TEXT        NOT NULL PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
)`,
}

// addQueueColumn adds demo_enqueued.queue to a table made by an earlier
// demo; rows recorded before have the queue "". CockroachDB accepts ADD
// COLUMN IF NOT EXISTS with a default (docs: "ALTER TABLE ... ADD COLUMN").
const addQueueColumn = `ALTER TABLE demo_enqueued ADD COLUMN IF NOT EXISTS queue TEXT NOT NULL DEFAULT ''`

// hasQueueColumn reports whether demo_enqueued has its queue column.
const hasQueueColumn = `SELECT count(*) FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = 'demo_enqueued' AND column_name = 'queue'`

// demoEnqueuedByQueue serves verify --queue and cleanup.
const demoEnqueuedByQueue = `CREATE INDEX IF NOT EXISTS demo_enqueued_queue ON demo_enqueued (queue, item_id)`

// demoTableNames are the demo's tables, dropped by cleanup with the last
// demo queue.
var demoTableNames = []string{"demo_results", "demo_enqueued", "demo_runs", "demo_queues"}

// runsTable records every handler run of `demo work --record-runs` (a
// demotest build): when it started and ended by the database clock, and in
// which process, for the limit tests, which compute the most runs at once.
const runsTable = `CREATE TABLE IF NOT EXISTS demo_runs (
    run_id UUID PRIMARY KEY, item_id UUID NOT NULL, pid BIGINT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL, ended_at TIMESTAMPTZ)`

// sharedUsage is the help of --shared-database.
const sharedUsage = "work in a database that also holds queues the demo did not create (they are left alone; the demo's queue must still be one it created, or a new one)"

// dbState is what checkOwnership found.
type dbState struct {
	schema   bool     // the crdbwork schema is there, at this version
	own      []string // the demo's queues (demo_queues), in order
	foreign  []string // the other queues, in order
	present  []string // every queue in the database, in order
	worked   []string // the queues live sessions work on, in order
	hasQueue bool     // queue is in the database (items, a row, a session)
}

// readOwnership reads, without writing, which queues the database holds and
// which of them the demo created. A missing crdbwork schema is no queue; an
// older, newer or incomplete one is requireSchema's exit-2 error (the demo
// does not upgrade a database it may not own: the migrate command does).
func readOwnership(ctx context.Context, db crsql.DB, queue string) (dbState, error) {
	var s dbState
	err := crsql.Check(ctx, db, tables)
	if !(errors.Is(err, crsql.ErrSchemaMissing) && !cli.IsMissingDatabase(err) && cli.InstalledVersion(ctx, db, tables) == 0) {
		// There is a schema (or an error): it must be whole and at this
		// version (requireSchema's exit-2 errors say what to do).
		if err := cli.RequireSchema(ctx, db, tables); err != nil {
			return s, err
		}
		s.schema = true
	}
	// The queues first, then the demo's records of them: a demo process
	// records its queue before the queue has a row or a worker, so every
	// demo queue this listing finds is recorded by the time the records
	// are read. (Read the other way round, a queue another demo process
	// recorded and started between the two reads looked foreign, and this
	// process refused to start.)
	if s.schema {
		names, err := claim.Queues(ctx, db, tables)
		if err != nil {
			return s, cli.Failf(1, "listing the queues: %v", err)
		}
		worked, err := stmts.VerifyWorkedQueues(ctx, db)
		if err != nil {
			return s, cli.Failf(1, "%v", err)
		}
		s.worked = worked
		all := append(names, worked...)
		sort.Strings(all)
		s.present = slices.Compact(all)
	}
	own, err := demoQueues(ctx, db)
	if err != nil {
		return s, err
	}
	s.own = own
	for _, n := range s.present {
		if n == queue {
			s.hasQueue = true
		}
		if !slices.Contains(own, n) {
			s.foreign = append(s.foreign, n)
		}
	}
	return s, nil
}

// demoQueues reads demo_queues: nil when the table is not there.
func demoQueues(ctx context.Context, db crsql.DB) ([]string, error) {
	rows, err := db.Query(ctx, `SELECT queue FROM demo_queues ORDER BY queue`)
	if err != nil {
		if errors.Is(store.Classify(err), crsql.ErrSchemaMissing) {
			return nil, nil
		}
		return nil, cli.Failf(1, "reading demo_queues: %v", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		if errors.Is(store.Classify(err), crsql.ErrSchemaMissing) {
			return nil, nil
		}
		return nil, cli.Failf(1, "reading demo_queues: %v", err)
	}
	return names, nil
}

// isOwn reports whether the demo created queue.
func (s dbState) isOwn(queue string) bool { return slices.Contains(s.own, queue) }

// notOwnError is the refusal to touch a queue the demo did not create.
func notOwnError(cmd, queue string) error {
	return &cli.ExitError{Code: 2, Msg: fmt.Sprintf("queue %q was not created by the demo: demo %s works only on the demo's own queues (its handler acks items without doing their work); pick another --queue, or operate this queue with the crdbwork command", queue, cmd)}
}

// checkOwnership refuses, before anything is written, a queue the demo did
// not create and (unless shared) a database holding other queues. cmd
// names the command in messages.
func checkOwnership(ctx context.Context, db crsql.DB, cmd, queue string, shared bool) (dbState, error) {
	s, err := readOwnership(ctx, db, queue)
	if err != nil {
		return s, err
	}
	if s.hasQueue && !s.isOwn(queue) {
		return s, notOwnError(cmd, queue)
	}
	if len(s.foreign) > 0 && !shared {
		return s, &cli.ExitError{Code: 2, Msg: fmt.Sprintf("this database holds queues the demo did not create (%s): the demo runs on a database of its own; use another database (without --database-url the demo starts its own), or pass --shared-database to work beside them (they are left alone)",
			quoteList(s.foreign, 5))}
	}
	return s, nil
}

// prepareDemo makes what the demo needs in a database checkOwnership
// accepted: the crdbwork schema if it is missing, the demo's tables, and the
// record that the demo created queue. warn gets the schema's warnings.
func prepareDemo(ctx context.Context, db crsql.DB, s dbState, queue string, warn func(string)) error {
	if !s.schema {
		err := crsql.ApplyWith(ctx, db, tables, crsql.ApplyOptions{Warn: warn})
		if err != nil {
			if errors.Is(err, crsql.ErrSchemaNewer) {
				return cli.Failf(2, "%v", err)
			}
			return cli.Failf(1, "creating the crdbwork schema: %v", err)
		}
	}
	if err := createDemoTables(ctx, db); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, `INSERT INTO demo_queues (queue) VALUES ($1) ON CONFLICT (queue) DO NOTHING`, queue); err != nil {
		return cli.Failf(1, "recording the demo queue %q: %v", queue, err)
	}
	return nil
}

// demoTablesReady reports whether the demo's tables, columns and indexes
// are all there. information_schema and pg_catalog.pg_indexes are on both
// engines (CockroachDB docs: "information_schema", "pg_catalog").
const demoTablesReady = `SELECT
    (SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()
        AND table_name IN ('demo_results', 'demo_enqueued', 'demo_queues')) = 3
    AND (SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema()
        AND table_name = 'demo_enqueued' AND column_name = 'queue') = 1
    AND (SELECT count(*) FROM pg_catalog.pg_indexes WHERE schemaname = current_schema()
        AND indexname IN ('demo_results_item_id', 'demo_enqueued_queue')) = 2`

// createDemoTables creates the demo's tables that are missing. When they
// are all there it runs no DDL: on PostgreSQL, CREATE INDEX IF NOT EXISTS
// takes its table's lock before it finds the index, which would stall the
// running workers' acks (they insert into demo_results) at every worker's
// start. Processes starting together race on CREATE ... IF NOT EXISTS,
// which PostgreSQL may refuse to the loser: each statement is tried again,
// and then finds the table.
func createDemoTables(ctx context.Context, db crsql.DB) error {
	var ready bool
	if err := db.QueryRow(ctx, demoTablesReady).Scan(&ready); err != nil {
		return cli.Failf(1, "looking for the demo tables: %v", err)
	}
	if ready {
		return nil
	}
	exec := func(stmt string) error {
		var err error
		for range 3 {
			if _, err = db.Exec(ctx, stmt); err == nil || ctx.Err() != nil {
				return err
			}
		}
		return err
	}
	for _, stmt := range append(append([]string(nil), demoTablesSQL...), demoOwnTablesSQL...) {
		if err := exec(stmt); err != nil {
			return cli.Failf(1, "creating the demo tables: %v", err)
		}
	}
	var n int
	if err := db.QueryRow(ctx, hasQueueColumn).Scan(&n); err != nil {
		return cli.Failf(1, "reading the columns of demo_enqueued: %v", err)
	}
	if n == 0 {
		if err := exec(addQueueColumn); err != nil {
			return cli.Failf(1, "adding the queue column to demo_enqueued: %v", err)
		}
	}
	if err := exec(demoEnqueuedByQueue); err != nil {
		return cli.Failf(1, "creating the demo tables: %v", err)
	}
	return nil
}

// openDemo prepares a demo command (cmd, for messages) on queue in the
// database db reaches: checkOwnership (refusals, before any write), then
// prepareDemo (the schema if missing, the demo's tables, the queue's
// record), with the schema's warnings on stderr.
func openDemo(ctx context.Context, db crsql.DB, cmd, queue string, shared bool, out *cli.Console) error {
	s, err := checkOwnership(ctx, db, cmd, queue, shared)
	if err != nil {
		return err
	}
	return prepareDemo(ctx, db, s, queue, func(msg string) { out.Errorf("demo: warning: %s", cli.OneLine(msg)) })
}

// quoteList quotes names for a message, at most max of them.
func quoteList(names []string, max int) string {
	q := make([]string, 0, min(len(names), max))
	for i, n := range names {
		if i == max {
			break
		}
		q = append(q, fmt.Sprintf("%q", n))
	}
	s := strings.Join(q, ", ")
	if len(names) > max {
		s += fmt.Sprintf(" and %d more", len(names)-max)
	}
	return s
}
