// Package agedb gives a crdbwork database the state of one that has lived:
// other queues with many items, whose statistics were taken before the
// queue under test existed, and dead tuples. In that state a queue that was
// quiet and then gets a burst is estimated by PostgreSQL at about one row
// (its value is in no statistics), which is where statement shapes that
// rely on estimates turn into scans (DESIGN.md, section 7; issue 29). Tests
// and benchmarks build it with Age, then create their queue and its burst
// without analyzing.
//
// It writes rows with plain SQL (the schema must be applied first) and
// runs on PostgreSQL and CockroachDB: ANALYZE is the same statement on
// both; autovacuum is switched off on PostgreSQL only (CockroachDB has no
// such table option: its automatic statistics may refresh the tables while
// the state is used).
package agedb

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	crsql "github.com/crdbwork/crdbwork/sql"
)

// Options says how much has lived.
type Options struct {
	// Queues are the names of the other queues (default "lived-a" and
	// "lived-b").
	Queues []string
	// Rows is the items each of those queues holds when the statistics are
	// taken (default 60,000: 120,000 with the default queues).
	Rows int
	// Deleted is the fraction of each queue's items deleted after the
	// statistics were taken, left as dead tuples (default 0.3; negative:
	// none).
	Deleted float64
	// Dead is the dead items each queue holds (default 2,000).
	Dead int
}

// Age writes the lived state into the database of pool, whose crdbwork
// tables (default names) exist: the other queues' items (keyed, half of
// them claimable later, spread over 16 parts) and dead items, ANALYZE of
// the items, dead items and queues tables, then deletions that leave dead
// tuples. Autovacuum of those tables is switched off on PostgreSQL, so
// that the statistics stay as old as the caller's queue makes them. Call it
// before the queue under test gets its first item.
func Age(ctx context.Context, pool *pgxpool.Pool, o Options) error {
	if len(o.Queues) == 0 {
		o.Queues = []string{"lived-a", "lived-b"}
	}
	if o.Rows == 0 {
		o.Rows = 60000
	}
	if o.Deleted == 0 {
		o.Deleted = 0.3
	}
	if o.Dead == 0 {
		o.Dead = 2000
	}
	d, err := crsql.DetectDialect(ctx, pool)
	if err != nil {
		return fmt.Errorf("agedb: %w", err)
	}
	tables := []string{"crdbwork_items", "crdbwork_dead_items", "crdbwork_queues", "crdbwork_ended"}
	var stmts []string
	if d == crsql.Postgres {
		for _, t := range tables {
			stmts = append(stmts, `ALTER TABLE `+t+` SET (autovacuum_enabled = false)`)
		}
	}
	for _, q := range o.Queues {
		lit := "'" + strings.ReplaceAll(q, "'", "''") + "'"
		stmts = append(stmts,
			`INSERT INTO crdbwork_queues (name, num_parts) VALUES (`+lit+`, 16) ON CONFLICT (name) DO NOTHING`,
			fmt.Sprintf(`INSERT INTO crdbwork_items (id, queue, part, item_key, priority, vesting_at, turn_at, enqueued_at, payload, tenant)
SELECT gen_random_uuid(), %s, g %% 16, 'key-' || (g %% 500)::TEXT, g %% 3,
       now() - (%d - g) * INTERVAL '1 millisecond', now() - (%d - g) * INTERVAL '1 millisecond',
       now() - (%d - g) * INTERVAL '1 millisecond', '\x00'::BYTEA,
       CASE WHEN g %% 5 = 0 THEN 'tenant-' || (g %% 50)::TEXT END
FROM generate_series(1, %d) AS g`, lit, o.Rows+1, o.Rows+1, o.Rows+1, o.Rows),
			fmt.Sprintf(`INSERT INTO crdbwork_dead_items (id, queue, part, item_key, priority, attempts, max_attempts, payload, enqueued_at, reason)
SELECT gen_random_uuid(), %s, g %% 16, 'key-' || (g %% 500)::TEXT, 0, 25, 25, '\x00'::BYTEA, now() - INTERVAL '1 hour', 'failed'
FROM generate_series(1, %d) AS g`, lit, o.Dead))
	}
	for _, t := range tables {
		stmts = append(stmts, `ANALYZE `+t)
	}
	if o.Deleted > 0 {
		for _, q := range o.Queues {
			lit := "'" + strings.ReplaceAll(q, "'", "''") + "'"
			stmts = append(stmts, fmt.Sprintf(`DELETE FROM crdbwork_items WHERE queue = %s AND random() < %g`, lit, o.Deleted))
		}
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("agedb: %w\n%s", err, s)
		}
	}
	return nil
}
