package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
)

// cleanupBatch bounds the rows one DELETE removes.
const cleanupBatch = 5000

// cleanupPlan is what cleanup found to remove, before it deletes anything.
type cleanupPlan struct {
	queue      string
	demoQueue  bool     // the queue is one the demo created
	inDatabase bool     // the queue has rows in crdbwork's tables
	items      int64    // its items, claimed or not
	dead       int64    // its dead items
	otherDemo  []string // the other demo queues: they keep the demo tables
	dropTables bool     // the demo tables go (no other demo queue)
	dropSchema bool
}

func cmdCleanup(ctx context.Context, name string, args []string, out *cli.Console) error {
	var c common
	var dropSchema bool
	f := prog.NewFlagSet(name, `Removes what the demo made in a database given with --database-url: the items,
dead items, ended ids, part count, settings, tenant limits and schedules of
--queue, which must be a queue the demo created, and its rows in the demo's
tables. The demo's tables themselves (demo_results, demo_enqueued, demo_runs,
demo_queues) are dropped with the last demo queue; while another demo queue
is recorded they stay. With --drop-schema it then drops the crdbwork tables
too, only if no other queue (the demo's or not) and no live session is left:
checked before anything is deleted.

Refuses a queue the demo did not create (operate it with the crdbwork
command), and a queue live sessions work on (stop the workers first). Says
what it will delete on stderr, and shows the progress of long deletes.`)
	c.register(f, urlRequired)
	f.BoolVar(&dropSchema, "drop-schema", false, "also drop the crdbwork tables, if no other queue and no live session is left")
	f.FlagOnly("drop-schema")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if err := c.requireURL(f); err != nil {
		return err
	}
	pool, err := cli.Connect(ctx, c.databaseURL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	p, err := planCleanup(ctx, pool, c.queue, dropSchema)
	if err != nil {
		return err
	}
	out.Errorf("demo cleanup: %s", p.describe())
	start := time.Now()
	var rows store.QueueRows
	if p.inDatabase {
		if rows, err = deleteQueue(ctx, pool, p.queue, out, start); err != nil {
			return err
		}
	}
	if p.dropTables {
		for _, t := range demoTableNames {
			if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
				return cli.Failf(1, "dropping %s: %v", t, err)
			}
		}
	} else if p.demoQueue {
		if err := deleteDemoRows(ctx, pool, p.queue, out, start); err != nil {
			return err
		}
	}
	if p.dropSchema {
		if err := stmts.VerifyDropTables(ctx, pool); err != nil {
			return cli.Failf(1, "%v", err)
		}
	}
	if c.json {
		return cli.PrintJSON(out, map[string]any{"queue": c.queue, "items_deleted": rows.Items, "dead_items_deleted": rows.DeadItems,
			"demo_tables_dropped": p.dropTables, "schema_dropped": p.dropSchema})
	}
	switch {
	case p.inDatabase || p.demoQueue:
		out.Printf("removed queue %q (%d items, %d dead items)", p.queue, rows.Items, rows.DeadItems)
	default:
		out.Printf("queue %q: nothing to remove", p.queue)
	}
	if p.dropTables {
		out.Printf("; dropped the demo tables")
	}
	if p.dropSchema {
		out.Printf("; dropped the crdbwork tables")
	}
	out.Printf("\n")
	return nil
}

// planCleanup checks, without writing, what cleanup may remove: it refuses
// a queue the demo did not create, a queue live sessions work on, and (with
// dropSchema) a database where another queue or a live session is left.
func planCleanup(ctx context.Context, pool *pgxpool.Pool, queue string, dropSchema bool) (cleanupPlan, error) {
	p := cleanupPlan{queue: queue, dropSchema: dropSchema}
	s, err := readOwnership(ctx, pool, queue)
	if err != nil {
		return p, err
	}
	if s.hasQueue && !s.isOwn(queue) {
		return p, notOwnError("cleanup", queue)
	}
	p.demoQueue, p.inDatabase = s.isOwn(queue), s.hasQueue
	if slices.Contains(s.worked, queue) {
		return p, cli.Failf(1, "live sessions work on queue %q: stop its workers first (nothing was deleted)", queue)
	}
	for _, q := range s.own {
		if q != queue {
			p.otherDemo = append(p.otherDemo, q)
		}
	}
	p.dropTables = len(p.otherDemo) == 0
	if dropSchema {
		if !s.schema {
			return p, cli.Failf(2, "there are no crdbwork tables in this database to drop (nothing was deleted)")
		}
		var others []string
		for _, q := range s.present {
			if q != queue {
				others = append(others, q)
			}
		}
		if len(others) > 0 {
			return p, cli.Failf(1, "not dropping the crdbwork tables: other queues are in this database: %s (nothing was deleted; a demo queue's cleanup is `demo cleanup --queue NAME`, other queues are not the demo's)", quoteList(others, 10))
		}
		infos, err := session.List(ctx, pool, tables)
		if err != nil {
			return p, cli.Failf(1, "%v", err)
		}
		if len(infos) > 0 {
			return p, cli.Failf(1, "not dropping the crdbwork tables: %d sessions are live (stop the workers first; nothing was deleted)", len(infos))
		}
	}
	if p.inDatabase {
		q, err := claim.New(pool, claim.Options{Queue: queue, Tables: tables})
		if err != nil {
			return p, cli.Failf(2, "%v", err)
		}
		info, err := q.Inspect(ctx)
		if err != nil {
			return p, cli.Failf(1, "%v", err)
		}
		p.items, p.dead = info.Unclaimed+info.Claimed, info.Dead
	}
	return p, nil
}

// describe says what cleanup will do, in one line.
func (p cleanupPlan) describe() string {
	var parts []string
	switch {
	case p.inDatabase:
		parts = append(parts, fmt.Sprintf("removing demo queue %q: %d items, %d dead items, its ended ids, part count, settings, tenant limits and schedules", p.queue, p.items, p.dead))
	case p.demoQueue:
		parts = append(parts, fmt.Sprintf("demo queue %q has no rows in the crdbwork tables", p.queue))
	default:
		parts = append(parts, fmt.Sprintf("queue %q is not in this database", p.queue))
	}
	switch {
	case p.dropTables:
		parts = append(parts, "dropping the demo tables (no other demo queue uses them)")
	case p.demoQueue:
		parts = append(parts, fmt.Sprintf("deleting its rows in the demo tables, which stay for the demo queues %s", quoteList(p.otherDemo, 5)))
	default:
		parts = append(parts, fmt.Sprintf("the demo tables stay for the demo queues %s", quoteList(p.otherDemo, 5)))
	}
	if p.dropSchema {
		parts = append(parts, "then dropping the crdbwork tables")
	}
	return strings.Join(parts, "; ")
}

// deleteQueue deletes queue's rows from crdbwork's tables in batches
// (store.Store.VerifyDeleteQueueRows), showing the progress once it takes longer
// than progressAfter, then its part count, settings and the rest.
func deleteQueue(ctx context.Context, pool *pgxpool.Pool, queue string, out *cli.Console, start time.Time) (store.QueueRows, error) {
	var total store.QueueRows
	for {
		r, err := stmts.VerifyDeleteQueueRows(ctx, pool, queue, cleanupBatch)
		if err != nil {
			out.EndProgress()
			return total, cli.Failf(1, "%v (deleted so far: %d items, %d dead items)", err, total.Items, total.DeadItems)
		}
		total.Items += r.Items
		total.DeadItems += r.DeadItems
		total.Ended += r.Ended
		if r.Items+r.DeadItems+r.Ended == 0 {
			break
		}
		if elapsed := time.Since(start); elapsed >= progressAfter {
			out.Progress(fmt.Sprintf("demo cleanup: deleted %d items, %d dead items and %d ended ids of %q, %s",
				total.Items, total.DeadItems, total.Ended, queue, elapsed.Round(time.Second)), false)
		}
	}
	out.EndProgress()
	if err := stmts.VerifyDeleteQueueRest(ctx, pool, queue); err != nil {
		return total, cli.Failf(1, "%v", err)
	}
	return total, nil
}

// demoRowsDeletes delete a batch of a queue's rows from the demo's tables:
// its items' results, then its recorded items. $1 queue, $2 limit.
var demoRowsDeletes = []struct{ what, stmt string }{
	{"results", `DELETE FROM demo_results WHERE row_id IN (SELECT r.row_id FROM demo_results AS r
    JOIN demo_enqueued AS e ON e.item_id = r.item_id WHERE e.queue = $1 LIMIT $2)`},
	{"recorded items", `DELETE FROM demo_enqueued WHERE item_id IN (SELECT item_id FROM demo_enqueued WHERE queue = $1 LIMIT $2)`},
}

// deleteDemoRows deletes queue's rows from the demo's tables, which other
// demo queues keep using, and its record in demo_queues.
func deleteDemoRows(ctx context.Context, pool *pgxpool.Pool, queue string, out *cli.Console, start time.Time) error {
	for _, d := range demoRowsDeletes {
		var n int64
		for {
			tag, err := pool.Exec(ctx, d.stmt, queue, cleanupBatch)
			if err != nil {
				out.EndProgress()
				return cli.Failf(1, "deleting the %s of %q from the demo tables: %v", d.what, queue, err)
			}
			n += tag.RowsAffected()
			if tag.RowsAffected() == 0 {
				break
			}
			if elapsed := time.Since(start); elapsed >= progressAfter {
				out.Progress(fmt.Sprintf("demo cleanup: deleted %d %s of %q from the demo tables, %s", n, d.what, queue, elapsed.Round(time.Second)), false)
			}
		}
	}
	out.EndProgress()
	if _, err := pool.Exec(ctx, `DELETE FROM demo_queues WHERE queue = $1`, queue); err != nil {
		return cli.Failf(1, "deleting %q from demo_queues: %v", queue, err)
	}
	return nil
}
