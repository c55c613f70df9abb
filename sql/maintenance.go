package sql

import (
	"context"
	"fmt"
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
