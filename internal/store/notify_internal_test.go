package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SendBatch makes recorder a Batcher: it records each queued statement as a
// call, and answers with no rows.
func (r *recorder) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		r.calls = append(r.calls, call{q.SQL, q.Arguments})
	}
	return noResults{}
}

// noResults are the results of a recorded batch: no rows, no errors.
type noResults struct{}

func (noResults) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, nil }
func (noResults) Query() (pgx.Rows, error)         { return noRows{}, nil }
func (noResults) QueryRow() pgx.Row                { return noRow{} }
func (noResults) Close() error                     { return nil }
func (noResults) Tx() pgx.Tx                       { return nil }
