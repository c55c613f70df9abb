package claim

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/store"
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
// the pairs from first on, or the head of pair first's priority.
type fairQuery struct {
	first    int
	head     bool
	pairs    []store.FairPair // the lasts' pairs
	priority int64            // the head's priority
}

// fairTurns reads, for the pairs (tenants[i], priorities[i]), the turns
// stamp needs: store.Store.ItemsFairLasts per group of at most store.MaxFairPairs
// pairs and store.Store.ItemsFairHead per pair with readHead[i], each made of
// single index seeks (see there), sent as pgx.Batches when db has
// SendBatch (one round trip each) and one by one otherwise. It returns one
// fairTurn per pair, or none if the queue is not fair.
func (q *Queue) fairTurns(ctx context.Context, db crsql.DB, tenants []string, priorities []int64, readHead []bool) ([]fairTurn, error) {
	out := make([]fairTurn, len(tenants))
	var queries []fairQuery
	for first := 0; first < len(tenants); first += store.MaxFairPairs {
		n := min(store.MaxFairPairs, len(tenants)-first)
		pairs := make([]store.FairPair, n)
		for i := range pairs {
			pairs[i] = store.FairPair{Tenant: tenants[first+i], Priority: priorities[first+i]}
		}
		queries = append(queries, fairQuery{first: first, pairs: pairs})
	}
	for i := range tenants {
		out[i].t, out[i].p = tenants[i], priorities[i]
		if readHead[i] {
			queries = append(queries, fairQuery{first: i, head: true, priority: priorities[i]})
		}
	}
	fair := true
	// took takes the answer of one query (no lasts: not fair; no head: the
	// priority has none).
	took := func(f fairQuery, head *time.Time, lasts []store.FairLast) {
		switch {
		case f.head:
			out[f.first].head = head
		case lasts == nil:
			fair = false
		default:
			for i, l := range lasts {
				out[f.first+i].now, out[f.first+i].last = l.Now, l.Last
			}
		}
	}
	s, name, d := q.store, q.opts.Queue, q.engine.Load().dialect // set by ready, which every enqueue path runs first
	bdb, canBatch := db.(batcher)
	for start := 0; start < len(queries) && fair; start += fairBatch {
		chunk := queries[start:min(start+fairBatch, len(queries))]
		if !canBatch {
			for _, f := range chunk {
				var head *time.Time
				var lasts []store.FairLast
				var err error
				if f.head {
					head, err = s.ItemsFairHead(ctx, db, d, name, f.priority)
				} else {
					lasts, err = s.ItemsFairLasts(ctx, db, name, f.pairs)
				}
				if err != nil {
					return nil, err
				}
				took(f, head, lasts)
			}
			continue
		}
		b := &pgx.Batch{}
		for _, f := range chunk {
			if f.head {
				s.ItemsFairHeadQueue(b, d, name, f.priority)
			} else {
				s.ItemsFairLastsQueue(b, name, f.pairs)
			}
		}
		res := bdb.SendBatch(ctx, b)
		for _, f := range chunk {
			var head *time.Time
			var lasts []store.FairLast
			var err error
			if f.head {
				head, err = s.ItemsFairHeadRead(res)
			} else {
				lasts, err = s.ItemsFairLastsRead(res, len(f.pairs))
			}
			if err != nil {
				_ = res.Close()
				return nil, err
			}
			took(f, head, lasts)
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
