package workertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// tablesTimeout bounds making the schema, and dropping it.
const tablesTimeout = 2 * time.Minute

// Tables gives the test t crdbwork tables of its own: it creates a schema
// with a fresh name (crdbwork_test_, part of the test's name, and a random
// suffix) in pool's database, applies the crdbwork schema into it, and
// returns the Tables that name it. When t ends, the schema is dropped with
// everything in it (DROP SCHEMA ... CASCADE, at t.Cleanup).
//
// Give the Tables to everything the test builds — claim.Options.Tables (the
// workers, schedule runners and Work calls built on the queue take them
// from it), session.Options.Tables, partition.Options.Tables, Options.Tables
// of a Work call given no queue, RequireEnqueued — and all that crdbwork
// stores (sessions, queues, parts, items, dead items, ended ids, limits,
// schedules) lives in the test's schema. Tests that each call Tables may
// then run in parallel (t.Parallel) on one database, with the same queue
// names, without seeing each other's rows or leaving any behind. The
// application's own tables are the test's business: create them where it
// likes (in tables.Schema, they are dropped with it).
//
// Tables calls t.Fatalf if the schema cannot be made, so call it from the
// test's goroutine. Keep the pool open until the test's cleanups run: close
// it in a t.Cleanup registered before Tables is called, which runs after the
// drop (if the pool is closed already, the schema is dropped on a
// connection of its own, made from the pool's configuration).
// Stop whatever uses the tables (workers, sessions) before the test ends:
// cleanups registered after Tables run before the drop. A drop that fails
// is reported with t.Errorf, with the statement to run by hand.
//
// It works on PostgreSQL and CockroachDB (v20.2 and later have user-defined
// schemas and DROP SCHEMA ... CASCADE, which Tables uses to remove them). On
// CockroachDB every statement of the schema is an online schema change, so
// making a test's tables takes noticeably longer than on PostgreSQL.
//
// It takes a *pgxpool.Pool rather than any connection: the schema must
// outlive a transaction the test may roll back, and the pool's
// configuration gives the drop a connection of its own when needed.
func Tables(t testing.TB, pool *pgxpool.Pool) crsql.Tables {
	t.Helper()
	if pool == nil {
		t.Fatalf("workertest.Tables: nil pool")
	}
	tables := crsql.Tables{Schema: schemaName(t.Name())}
	stmts := store.New(tables)
	ctx, cancel := context.WithTimeout(context.Background(), tablesTimeout)
	defer cancel()
	// CREATE SCHEMA without IF NOT EXISTS: the schema the cleanup drops is
	// surely this test's.
	if err := stmts.SchemaCreate(ctx, pool); err != nil {
		t.Fatalf("workertest.Tables: creating schema %s: %v", tables.Schema, err)
	}
	t.Cleanup(func() { dropSchema(t, pool, stmts) })
	warn := func(msg string) { t.Logf("workertest.Tables: %s", msg) }
	if err := crsql.ApplyWith(ctx, pool, tables, crsql.ApplyOptions{Warn: warn}); err != nil {
		t.Fatalf("workertest.Tables: applying the crdbwork schema in %s: %v", tables.Schema, err)
	}
	return tables
}

// dropSchema drops the test's schema, on the pool or, if that fails (the
// pool is closed), on a connection of its own.
func dropSchema(t testing.TB, pool *pgxpool.Pool, stmts *store.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), tablesTimeout)
	defer cancel()
	err := stmts.SchemaDrop(ctx, pool)
	if err == nil || databaseGone(err) {
		return
	}
	conn, connErr := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if connErr == nil {
		connErr = stmts.SchemaDrop(ctx, conn)
		_ = conn.Close(ctx)
		if connErr == nil || databaseGone(connErr) {
			return
		}
	}
	// err says what to run by hand.
	t.Errorf("workertest.Tables: %v (on a connection of its own: %v)", err, connErr)
}

// databaseGone reports the error of a database that no longer exists: the
// schema went with it.
func databaseGone(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "3D000"
}

// schemaName returns a fresh schema name for a test: crdbwork_test_, up to
// 24 characters of the test's name folded to [a-z0-9_], and 16 random hex
// digits; at most 55 bytes, under the 63-byte identifier limit.
func schemaName(test string) string {
	var b strings.Builder
	b.WriteString("crdbwork_test_")
	n := 0
	under := false
	for _, r := range strings.ToLower(test) {
		if n == 24 {
			break
		}
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9'
		switch {
		case ok:
			b.WriteRune(r)
			under = false
		case !under:
			b.WriteByte('_')
			under = true
		default:
			continue
		}
		n++
	}
	if !under {
		b.WriteByte('_')
	}
	var suffix [8]byte
	_, _ = rand.Read(suffix[:])
	b.WriteString(hex.EncodeToString(suffix[:]))
	return b.String()
}
