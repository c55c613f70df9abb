package claim

import (
	"context"
	"errors"
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
// with more pairs sends several batches.
const fairBatch = 512

// batcher is what a pgx.Batch needs: *pgxpool.Pool, *pgx.Conn and pgx.Tx
// have it.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// fairTurns reads, for the pairs (tenants[i], priorities[i]), the turns
// stamp needs: one crsql.Statements.FairLast per pair and one FairHead per
// pair with readHead[i], each a single index seek (see there), sent as
// pgx.Batches of at most fairBatch statements when db has SendBatch and
// one by one otherwise. It returns one fairTurn per pair, or none if the
// queue is not fair.
func (q *Queue) fairTurns(ctx context.Context, db crsql.DB, tenants []string, priorities []int64, readHead []bool) ([]fairTurn, error) {
	out := make([]fairTurn, len(tenants))
	type pending struct {
		i    int
		head bool // FairHead of pair i; FairLast otherwise
	}
	var jobs []pending
	for i := range tenants {
		out[i].t, out[i].p = tenants[i], priorities[i]
		jobs = append(jobs, pending{i, false})
		if readHead[i] {
			jobs = append(jobs, pending{i, true})
		}
	}
	fair := true
	// read scans the answer of one job from rows (no row: not fair, for
	// FairLast; no head, for FairHead).
	read := func(j pending, row pgx.Row) error {
		var err error
		if j.head {
			err = row.Scan(&out[j.i].head)
		} else {
			err = row.Scan(&out[j.i].now, &out[j.i].last)
		}
		switch {
		case errors.Is(err, pgx.ErrNoRows) && j.head:
			return nil
		case errors.Is(err, pgx.ErrNoRows):
			fair = false
			return nil
		case err != nil:
			return fmt.Errorf("reading the turns of tenant %q, priority %d: %w", out[j.i].t, out[j.i].p, err)
		}
		return nil
	}
	args := func(j pending) (string, []any) {
		if j.head {
			return q.st.FairHead, []any{q.opts.Queue, out[j.i].p}
		}
		return q.st.FairLast, []any{q.opts.Queue, out[j.i].t, out[j.i].p}
	}
	bdb, canBatch := db.(batcher)
	for start := 0; start < len(jobs) && fair; start += fairBatch {
		chunk := jobs[start:min(start+fairBatch, len(jobs))]
		if !canBatch {
			for _, j := range chunk {
				stmt, a := args(j)
				if err := read(j, db.QueryRow(ctx, stmt, a...)); err != nil {
					return nil, err
				}
			}
			continue
		}
		b := &pgx.Batch{}
		for _, j := range chunk {
			stmt, a := args(j)
			b.Queue(stmt, a...)
		}
		res := bdb.SendBatch(ctx, b)
		for _, j := range chunk {
			if err := read(j, res.QueryRow()); err != nil {
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
