package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	crsql "github.com/crdbwork/crdbwork/sql"
)

// fairTurn is what the stamps of one (tenant, priority) pair are computed
// from: the database's now(), the head of the priority (only for the pair
// that reads it; nil otherwise, or if there is none) and the tenant's
// latest unclaimed turn of that priority (nil if none).
type fairTurn struct {
	t          string
	p          int64
	now        time.Time
	head, last *time.Time
}

// fairBatch bounds the statements of one pgx.Batch of fairTurns: a call
// with more sends several batches.
const fairBatch = 64

// batcher is what a pgx.Batch needs: *pgxpool.Pool, *pgx.Conn and pgx.Tx
// have it.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// fairQuery is one statement of fairTurns: the tenants' latest turns of
// the pairs from first on (n of them), or the head of pair first's
// priority.
type fairQuery struct {
	first, n int
	head     bool
	sql      string
	args     []any
}

// fairTurns reads, for the pairs (tenants[i], priorities[i]), the turns
// stamp needs: crsql.FairStatements.Lasts per group of at most
// crsql.MaxFairPairs pairs and crsql.Statements.FairHead per pair with
// readHead[i], each made of single index seeks (see there), sent as
// pgx.Batches when db has SendBatch (one round trip each) and one by one
// otherwise. It returns one fairTurn per pair, or none if the queue is not
// fair.
func (q *Queue) fairTurns(ctx context.Context, db crsql.DB, tenants []string, priorities []int64, readHead []bool) ([]fairTurn, error) {
	out := make([]fairTurn, len(tenants))
	var queries []fairQuery
	for first := 0; first < len(tenants); first += crsql.MaxFairPairs {
		n := min(crsql.MaxFairPairs, len(tenants)-first)
		args := make([]any, 0, 1+2*n)
		args = append(args, q.opts.Queue)
		for i := first; i < first+n; i++ {
			args = append(args, tenants[i], priorities[i])
		}
		queries = append(queries, fairQuery{first: first, n: n, sql: q.fair.Lasts(n), args: args})
	}
	for i := range tenants {
		out[i].t, out[i].p = tenants[i], priorities[i]
		if readHead[i] {
			queries = append(queries, fairQuery{first: i, head: true, sql: q.st.FairHead, args: []any{q.opts.Queue, priorities[i]}})
		}
	}
	fair := true
	// read takes the answer of one query from rows (no row: not fair, for
	// a read of the lasts; no head, for a head).
	read := func(f fairQuery, rows pgx.Rows) error {
		defer rows.Close()
		got := 0
		for rows.Next() {
			var err error
			if f.head {
				err = rows.Scan(&out[f.first].head)
			} else {
				var i int
				var now time.Time
				var last *time.Time
				if err = rows.Scan(&i, &now, &last); err == nil {
					if i < 0 || i >= f.n {
						return fmt.Errorf("the fair turns read answered for pair %d of %d", i, f.n)
					}
					out[f.first+i].now, out[f.first+i].last = now, last
				}
			}
			if err != nil {
				return err
			}
			got++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if !f.head && got == 0 {
			fair = false
		} else if !f.head && got != f.n {
			return fmt.Errorf("the fair turns read answered %d rows for %d pairs", got, f.n)
		}
		return nil
	}
	bdb, canBatch := db.(batcher)
	for start := 0; start < len(queries) && fair; start += fairBatch {
		chunk := queries[start:min(start+fairBatch, len(queries))]
		if !canBatch {
			for _, f := range chunk {
				rows, err := db.Query(ctx, f.sql, f.args...)
				if err != nil {
					return nil, err
				}
				if err := read(f, rows); err != nil {
					return nil, err
				}
			}
			continue
		}
		b := &pgx.Batch{}
		for _, f := range chunk {
			b.Queue(f.sql, f.args...)
		}
		res := bdb.SendBatch(ctx, b)
		for _, f := range chunk {
			rows, err := res.Query()
			if err == nil {
				err = read(f, rows)
			}
			if err != nil {
				_ = res.Close()
				return nil, err
			}
		}
		if err := res.Close(); err != nil {
			return nil, err
		}
	}
	if !fair {
		return nil, nil
	}
	return out, nil
}
