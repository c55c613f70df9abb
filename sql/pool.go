package sql

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Pool is a database that runs statements and starts transactions: a
// *pgxpool.Pool or a *pgx.Conn satisfies it (a pgx.Tx does not: it is a DB
// only). It is the one database type of crdbwork's packages: claim.DB,
// partition.DB and worker.DB are this type, under the name their package
// documents.
type Pool interface {
	DB
	// BeginTx starts a transaction with opts.
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}
