package claim

import (
	"context"
	"errors"

	"github.com/crdbwork/crdbwork/internal/store"
)

// statisticsMinRows and statisticsMinBytes are the backlog from which
// refreshStatistics analyzes a table whose statistics say it is (next to)
// empty: its rows as the server counted them, or, for a table never
// analyzed, its size (read at once from its files, where the server's
// count may lag by seconds). Below them, any plan reads little.
const (
	statisticsMinRows  = 5000
	statisticsMinBytes = 1 << 20
)

// refreshStatistics (queuemaint.Queue.RefreshStatistics) runs ANALYZE, on PostgreSQL, of the items and ended-ids
// tables that the planner believes hold next to nothing while they hold a
// backlog (5,000 rows and ten times what the planner believes, or 1 MiB of
// a table never analyzed), and returns the tables it analyzed, as named in
// SQL. Such a table was never analyzed (a new deployment's first backlog)
// or was analyzed while drained; until autovacuum comes, within about a
// minute, the planner estimates every condition at its default
// selectivity, all the partial indexes look alike, and claims in parts mode
// may walk the whole queue's index instead of their part's (issue #19;
// docs/operations.md). Workers call it when their session starts and with
// each reap of the queue's leases, so the window lasts seconds. It reads
// two rows of the server's statistics views when there is nothing to do.
// On CockroachDB it does nothing: its automatic statistics refresh a table
// once a share of its rows changed. A role that does not own the tables
// (nor belongs to their owner) leaves them to autovacuum.
func (q *Queue) refreshStatistics(ctx context.Context) ([]string, error) {
	if err := q.ready(ctx); err != nil {
		return nil, err
	}
	if q.engine.Load().dialect != store.Postgres {
		return nil, nil
	}
	behind, err := q.store.StatisticsBehind(ctx, q.db, statisticsMinRows, statisticsMinBytes)
	if err != nil {
		return nil, err
	}
	var done []string
	var errs []error
	for _, table := range behind {
		if err := q.store.StatisticsAnalyze(ctx, q.db, table); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, table)
	}
	return done, errors.Join(errs...)
}
