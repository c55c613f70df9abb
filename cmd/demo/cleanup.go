package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/session"
)

// cleanupBatch bounds the rows one DELETE removes.
const cleanupBatch = 5000

func cmdCleanup(ctx context.Context, name string, args []string, out *console) error {
	var c common
	var dropSchema bool
	f := newFlagSet(name, `Removes what the demo left in a database given with --database-url: the
items, dead items, part count, settings, tenant limits and schedules of
--queue and the demo's tables (demo_results, demo_enqueued, demo_runs). With
--drop-schema it then drops the crdbwork
tables too, if no other queue has items or dead items. Refuses while live
sessions own parts of the queue (stop the workers first).`)
	c.register(f, urlRequired)
	f.boolVar(&dropSchema, "drop-schema", false, "also drop the crdbwork tables")
	f.flagOnly("drop-schema")
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	pool, err := openChecked(ctx, &c, f, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	s, err := readStatus(ctx, pool, c.queue)
	if err != nil {
		return failf(1, "%v", err)
	}
	if owners := liveOwners(s); len(owners) > 0 {
		return failf(1, "live sessions own parts of queue %q (%s): stop the workers first", c.queue, strings.Join(owners, ", "))
	}
	items, err := deleteBatched(ctx, pool, tables.Table("items"), c.queue)
	if err != nil {
		return failf(1, "deleting the items of %q: %v", c.queue, err)
	}
	dead, err := deleteBatched(ctx, pool, tables.Table("dead_items"), c.queue)
	if err != nil {
		return failf(1, "deleting the dead items of %q: %v", c.queue, err)
	}
	if err := deleteEnded(ctx, pool, c.queue); err != nil {
		return failf(1, "deleting the ended ids of %q: %v", c.queue, err)
	}
	for _, stmt := range []string{
		`DELETE FROM ` + tables.Table("session_parts") + ` WHERE queue = $1`,
		`DELETE FROM ` + tables.Table("queues") + ` WHERE name = $1`,
		`DELETE FROM ` + tables.Table("tenant_limits") + ` WHERE queue = $1`,
		`DELETE FROM ` + tables.Table("schedules") + ` WHERE queue = $1`,
	} {
		if _, err := pool.Exec(ctx, stmt, c.queue); err != nil {
			return failf(1, "removing queue %q: %v", c.queue, err)
		}
	}
	for _, t := range []string{"demo_results", "demo_enqueued", "demo_runs"} {
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			return failf(1, "dropping %s: %v", t, err)
		}
	}
	dropped := false
	if dropSchema {
		if err := dropCrdbwork(ctx, pool); err != nil {
			return err
		}
		dropped = true
	}
	if c.json {
		return printJSON(out, map[string]any{"queue": c.queue, "items_deleted": items, "dead_items_deleted": dead,
			"demo_tables_dropped": true, "schema_dropped": dropped})
	}
	out.printf("removed queue %q (%d items, %d dead items) and the demo tables", c.queue, items, dead)
	if dropped {
		out.printf("; dropped the crdbwork tables")
	}
	out.printf("\n")
	return nil
}

// liveOwners names the live sessions that own parts of the status's queue.
func liveOwners(s *status) []string {
	var names []string
	for _, ss := range s.Sessions {
		if ss.Parts != "" {
			names = append(names, orDash(ss.Name))
		}
	}
	return names
}

// deleteBatched deletes the rows of queue from table in bounded batches and
// returns how many it deleted.
func deleteBatched(ctx context.Context, pool *pgxpool.Pool, table, queue string) (int64, error) {
	var n int64
	for {
		tag, err := pool.Exec(ctx, `DELETE FROM `+table+` WHERE id IN (SELECT id FROM `+table+` WHERE queue = $1 LIMIT $2)`,
			queue, cleanupBatch)
		if err != nil {
			return n, err
		}
		n += tag.RowsAffected()
		if tag.RowsAffected() < cleanupBatch {
			return n, nil
		}
	}
}

// deleteEnded deletes the queue's ended ids (the dedup window's rows) in
// bounded batches. Their ids are unique per queue only, hence the queue in
// the outer condition.
func deleteEnded(ctx context.Context, pool *pgxpool.Pool, queue string) error {
	table := tables.Table("ended")
	for {
		tag, err := pool.Exec(ctx, `DELETE FROM `+table+` WHERE queue = $1 AND id IN (SELECT id FROM `+table+` WHERE queue = $1 LIMIT $2)`,
			queue, cleanupBatch)
		if err != nil {
			return err
		}
		if tag.RowsAffected() < cleanupBatch {
			return nil
		}
	}
}

// dropCrdbwork drops the crdbwork tables unless another queue still has
// items or dead items, or a session is live.
func dropCrdbwork(ctx context.Context, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, `SELECT DISTINCT queue FROM `+tables.Table("items")+
		` UNION SELECT DISTINCT queue FROM `+tables.Table("dead_items"))
	if err != nil {
		return failf(1, "listing the queues left: %v", err)
	}
	var left []string
	for rows.Next() {
		var q string
		if err := rows.Scan(&q); err != nil {
			rows.Close()
			return failf(1, "listing the queues left: %v", err)
		}
		left = append(left, fmt.Sprintf("%q", q))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return failf(1, "listing the queues left: %v", err)
	}
	if len(left) > 0 {
		sort.Strings(left)
		return failf(1, "not dropping the crdbwork tables: other queues still have items: %s (clean them up with --queue first)", strings.Join(left, ", "))
	}
	infos, err := session.List(ctx, pool, tables)
	if err != nil {
		return failf(1, "%v", err)
	}
	if len(infos) > 0 {
		return failf(1, "not dropping the crdbwork tables: %d sessions are live (stop the workers first)", len(infos))
	}
	// Children before parents (foreign keys).
	for _, t := range []string{"items", "dead_items", "ended", "session_parts", "session_queues", "sessions", "queues", "tenant_limits", "schedules", "schema_version"} {
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+tables.Table(t)); err != nil {
			return failf(1, "dropping %s: %v", tables.Table(t), err)
		}
	}
	return nil
}
