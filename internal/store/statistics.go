package store

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// RefreshStats refreshes the planner's statistics of table (a name as it
// appears in SQL, quoted if it needs to be) and, on PostgreSQL, reclaims
// its dead rows: VACUUM ANALYZE there, ANALYZE on CockroachDB, which has no
// VACUUM (its MVCC garbage is removed by garbage collection after the
// zone's gc.ttlseconds; sql/cockroach.sql sets it). CockroachDB docs
// checked: "CREATE STATISTICS" says ANALYZE is an alias for it, kept for
// PostgreSQL compatibility. Benchmarks and tests call it after seeding.
func RefreshStats(ctx context.Context, db DB, table string) error {
	d, err := DetectDialect(ctx, db)
	if err != nil {
		return err
	}
	stmt := "VACUUM ANALYZE " + table
	if d == Cockroach {
		stmt = "ANALYZE " + table
	}
	if _, err := db.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("crdbwork: refreshing the statistics of %s: %w", table, err)
	}
	return nil
}

// statisticsBehind lists, of the tables $1 (names as in SQL), those
// PostgreSQL's planner believes hold next to nothing while they hold a
// backlog: never analyzed nor vacuumed (reltuples -1) with at least $3 bytes
// of rows, or holding at least $2 live rows and ten times what the last
// ANALYZE or VACUUM found (reltuples). n_live_tup is what the server
// counted since, as the backends report it (within seconds); the size is
// read from the table's files at once. Tables the role may not analyze (it
// is not, nor has the rights of, their owner) are left out: PostgreSQL would
// skip them with a warning. Only PostgreSQL has these catalogs
// (a PostgreSQL-only statement: CockroachDB refreshes its statistics
// itself, see Store.StatisticsBehind).
const statisticsBehind = `SELECT t.name
FROM unnest($1::TEXT[]) AS t (name)
JOIN pg_class AS c ON c.oid = to_regclass(t.name)
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE pg_has_role(c.relowner, 'USAGE')
  AND ((c.reltuples < 0 AND pg_relation_size(c.oid) >= $3)
    OR (s.n_live_tup >= $2 AND s.n_live_tup > 10 * greatest(c.reltuples, 0)))`

// StatisticsBehind returns the tables, of the items and the ended ids (the
// ones the hot statements read), whose PostgreSQL statistics say they hold
// next to nothing while they hold a backlog: never analyzed and at least
// minBytes in size, or holding at least minRows rows and ten times what the
// statistics say (analyzed while drained, then filled), and that the role
// may analyze (it owns them, or is a member of their owner). The names are as
// they appear in SQL, for Analyze. Until the next ANALYZE the planner
// estimates every condition on such a table at its default selectivity, the
// plans of the hot statements depend on the indexes' heights
// (internal/store/stable_plans_queues_test.go), and autovacuum may take a minute to
// come (docs/operations.md). PostgreSQL only: it fails on CockroachDB, whose
// automatic statistics refresh a table once a share of its rows changed.
func (s *Store) StatisticsBehind(ctx context.Context, db DB, minRows, minBytes int64) ([]string, error) {
	rows, err := db.Query(ctx, statisticsBehind, s.statisticsTables(), minRows, minBytes)
	if err != nil {
		return nil, fmt.Errorf("crdbwork: reading the tables' statistics: %w", err)
	}
	behind, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("crdbwork: reading the tables' statistics: %w", err)
	}
	return behind, nil
}

// StatisticsAnalyze refreshes PostgreSQL's statistics of table, a name returned by
// StatisticsBehind, unless another ANALYZE or VACUUM of it is running
// (SKIP_LOCKED: that one refreshes them).
func (s *Store) StatisticsAnalyze(ctx context.Context, db DB, table string) error {
	if !slices.Contains(s.statisticsTables(), table) {
		return fmt.Errorf("crdbwork: analyze %s: not a table StatisticsBehind reads", table)
	}
	if _, err := db.Exec(ctx, "ANALYZE (SKIP_LOCKED) "+table); err != nil {
		return fmt.Errorf("crdbwork: analyze %s: %w", table, err)
	}
	return nil
}

// statisticsTables are the tables StatisticsBehind reads and Analyze
// refreshes, named as in SQL: the items and the ended ids.
func (s *Store) statisticsTables() []string {
	return []string{identifier(s.t, "items").Sanitize(), identifier(s.t, "ended").Sanitize()}
}
