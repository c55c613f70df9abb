package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The machine's limits: what the server does when a queue costs nothing but
// its one necessary statement. Each loop of a limit program takes a batch of
// the oldest jobs with one DELETE … FOR UPDATE SKIP LOCKED (what every queue
// on PostgreSQL does to hand out work without two workers taking one job),
// and the exactly-once limit inserts the deleted jobs' result rows in the
// same statement, so that a job's end and its result commit together. No
// session, no retry bookkeeping, no handler: the ceiling a queue's
// throughput can approach on this server, measured in the same run.

// setupMachineLimits creates the limit programs' tables.
func setupMachineLimits(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_limit_jobs (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payload BYTEA NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS bench_limit_results (
    job_id BIGINT PRIMARY KEY, done_at TIMESTAMPTZ NOT NULL DEFAULT now())`)
	if err != nil {
		return fmt.Errorf("limit programs' tables: %w", err)
	}
	return nil
}

// takeJobs is the at-least-once limit's statement: the oldest $1 jobs that
// no other connection holds, deleted and returned. PostgreSQL's DELETE has
// no LIMIT, hence the subquery; CockroachDB's DELETE takes ORDER BY and
// LIMIT but no locking clause, and its SELECT … FOR UPDATE SKIP LOCKED
// (in its recent versions) accepts this same form. These run on PostgreSQL
// only: the bench's server.
const takeJobs = `DELETE FROM bench_limit_jobs WHERE id IN (
    SELECT id FROM bench_limit_jobs ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id`

// takeJobsWithResults is the exactly-once limit's: the same delete, its
// rows' results inserted in the same statement (so in its transaction).
const takeJobsWithResults = `WITH taken AS (` + takeJobs + `)
INSERT INTO bench_limit_results (job_id) SELECT id FROM taken`

// limitSystem is one of the limit programs: conns connections, each
// looping one statement that takes up to batch jobs, until the jobs are
// gone.
type limitSystem struct {
	exactlyOnce bool
	conns       int
	batch       int
}

func (l limitSystem) name() string {
	if l.exactlyOnce {
		return "limit exactly-once"
	}
	return "limit at-least-once"
}

func (l limitSystem) run(ctx context.Context, url string, d drain, m marks) (result, error) {
	if d.backlog > 0 {
		return result{}, errors.New("the limit programs drain every job: no backlog")
	}
	setup, err := newSetupPool(ctx, url)
	if err != nil {
		return result{}, err
	}
	defer setup.Close()
	if _, err := setup.Exec(ctx, `TRUNCATE bench_limit_jobs, bench_limit_results`); err != nil {
		return result{}, fmt.Errorf("emptying the limit programs' tables: %w", err)
	}
	if _, err := setup.Exec(ctx, `INSERT INTO bench_limit_jobs (payload) SELECT '' FROM generate_series(1, $1)`, d.items); err != nil {
		return result{}, fmt.Errorf("enqueueing %d jobs: %w", d.items, err)
	}
	if _, err := setup.Exec(ctx, `ANALYZE bench_limit_jobs`); err != nil {
		return result{}, err
	}
	pool, err := newPool(ctx, url, l.conns)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	// Open the connections before the clock starts, as the other systems'
	// pools do while they enqueue.
	conns := make([]*pgxpool.Conn, l.conns)
	for i := range conns {
		if conns[i], err = pool.Acquire(ctx); err != nil {
			return result{}, err
		}
	}
	stmt := takeJobs
	if l.exactlyOnce {
		stmt = takeJobsWithResults
	}
	mon, err := startConnMonitor(ctx, url)
	if err != nil {
		return result{}, err
	}
	runCtx, cancel := context.WithTimeout(ctx, runTimeout(d.items))
	defer cancel()
	var taken atomic.Int64
	errs := make([]error, l.conns)
	var wg sync.WaitGroup
	m.start()
	start := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Release()
			for {
				tag, err := c.Exec(runCtx, stmt, l.batch)
				if err != nil {
					errs[i] = fmt.Errorf("connection %d: %w", i+1, err)
					return
				}
				if tag.RowsAffected() == 0 {
					return // nothing left that another connection does not hold
				}
				taken.Add(tag.RowsAffected())
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	peak, monErr := mon.stop()
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	m.done()
	var left, results int
	if err := setup.QueryRow(ctx, `SELECT (SELECT count(*) FROM bench_limit_jobs), (SELECT count(*) FROM bench_limit_results)`).Scan(&left, &results); err != nil {
		return result{}, err
	}
	want := 0
	if l.exactlyOnce {
		want = d.items
	}
	if n := taken.Load(); n != int64(d.items) || left != 0 || results != want {
		return result{}, fmt.Errorf("%d jobs taken, %d left and %d result rows of %d jobs (want %d results)", n, left, results, d.items, want)
	}
	return result{elapsed: elapsed, peakConns: peak, poolConns: l.conns}, monErr
}
