package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	crsql "github.com/crdbwork/crdbwork/sql"
)

// tables are the crdbwork table names the demo uses: the defaults.
var tables = crsql.Tables{}

// pingTimeout bounds the first contact with the database.
const pingTimeout = 5 * time.Second

// connect opens a pool on rawURL and pings it. maxConns, if positive, sets
// the pool size unless the URL sets pool_max_conns itself. A malformed URL
// or an unreachable server is an exit-2 error.
func connect(ctx context.Context, rawURL string, maxConns int) (*pgxpool.Pool, error) {
	return connectWith(ctx, rawURL, maxConns, nil)
}

// connectWith is connect with configure, if not nil, applied to the pool's
// configuration before the pool is made (worker.ConfigurePool, say); its
// error is an exit-2 error.
func connectWith(ctx context.Context, rawURL string, maxConns int, configure func(*pgxpool.Config) error) (*pgxpool.Pool, error) {
	if scheme, _, ok := strings.Cut(rawURL, "://"); ok && !acceptedSchemes[strings.ToLower(scheme)] {
		return nil, failf(2, "unsupported scheme %q in the database URL%s: use postgresql:// or postgres:// (CockroachDB speaks the PostgreSQL protocol: postgresql://root@host:26257/db?sslmode=disable)",
			scheme, quotedURL(rawURL))
	}
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, failf(2, "invalid database URL%s: %v", quotedURL(rawURL), parseErrorMessage(err))
	}
	if maxConns > 0 && !strings.Contains(rawURL, "pool_max_conns") {
		cfg.MaxConns = int32(maxConns)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > pingTimeout {
		cfg.ConnConfig.ConnectTimeout = pingTimeout
	}
	if configure != nil {
		if err := configure(cfg); err != nil {
			return nil, failf(2, "configuring the pool for the database URL%s: %v", quotedURL(rawURL), err)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, failf(2, "invalid database URL%s: %v", quotedURL(rawURL), err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		if ctx.Err() != nil {
			return nil, failf(130, "interrupted")
		}
		where := fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			switch {
			case pgErr.Code == "3D000":
				return nil, failf(2, "the database %q does not exist at %s: create it (CREATE DATABASE %s) or fix the URL's path",
					cfg.ConnConfig.Database, where, pgx.Identifier{cfg.ConnConfig.Database}.Sanitize())
			case pgErr.Code == "28P01" || pgErr.Code == "28000":
				return nil, failf(2, "the server at %s refused user %q: wrong password or user, or not allowed to connect (%s)",
					where, cfg.ConnConfig.User, pgErr.Message)
			}
		}
		if errors.Is(pingCtx.Err(), context.DeadlineExceeded) {
			return nil, failf(2, "cannot reach the database at %s within %v: %v", where, pingTimeout, err)
		}
		return nil, failf(2, "cannot reach the database at %s: %v", where, err)
	}
	return pool, nil
}

// acceptedSchemes are the URL schemes pgx takes.
var acceptedSchemes = map[string]bool{"postgres": true, "postgresql": true}

// warm opens the pool's connections now, so that a worker does not open
// them while it works: on a loaded machine a new connection can take longer
// than a heartbeat's deadline.
func warm(ctx context.Context, pool *pgxpool.Pool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n := int(pool.Config().MaxConns)
	conns := make(chan *pgxpool.Conn, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c, err := pool.Acquire(ctx); err == nil {
				conns <- c
			}
		}()
	}
	wg.Wait()
	close(conns)
	for c := range conns {
		c.Release()
	}
}

// parseErrorMessage drops the connection string that pgx repeats in its
// parse errors (it may hold a password).
func parseErrorMessage(err error) string {
	msg := err.Error()
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) && strings.HasPrefix(msg, "cannot parse `") {
		if i := strings.Index(msg, "`: "); i >= 0 {
			msg = msg[i+3:]
		}
	}
	return msg
}

// quotedURL returns " <url>" with its password hidden, or "" when the URL
// cannot be parsed (and so cannot be redacted safely).
func quotedURL(raw string) string {
	if _, err := url.Parse(raw); err != nil || !strings.Contains(raw, "://") {
		return ""
	}
	return " " + redactURL(raw)
}

// redactURL hides the password of a URL for messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// requireSchema reports a missing or outdated crdbwork schema as an exit-2
// error that says to run `demo migrate`.
func requireSchema(ctx context.Context, db crsql.DB) error {
	err := crsql.Check(ctx, db, tables)
	switch {
	case err == nil:
		return requireTables(ctx, db)
	case isMissingDatabase(err):
		return failf(2, "%s", missingDatabaseMessage(err))
	case errors.Is(err, crsql.ErrSchemaMissing):
		return failf(2, "the crdbwork schema is not in this database: run `demo migrate` first (or apply sql/schema.sql)")
	case errors.Is(err, crsql.ErrSchemaOutdated):
		return failf(2, "the crdbwork schema in this database is at version %d, this demo needs %d: run `demo migrate` (it upgrades in place; workers of the old version may keep running meanwhile)",
			installedVersion(ctx, db), crsql.Version)
	case errors.Is(err, crsql.ErrSchemaNewer):
		return failf(2, "%v", err)
	}
	return failf(1, "checking the crdbwork schema: %v", err)
}

// crdbworkTables are the schema's tables, by the suffix Tables.Table takes.
var crdbworkTables = []string{"schema_version", "sessions", "queues", "session_parts", "session_queues", "items", "dead_items", "ended"}

// requireTables reports a partly missing schema (a table dropped by hand
// under a version row that says all is well) as an exit-2 error.
func requireTables(ctx context.Context, db crsql.DB) error {
	for _, t := range crdbworkTables {
		rows, err := db.Query(ctx, "SELECT 1 FROM "+tables.Table(t)+" LIMIT 0")
		if err == nil {
			rows.Close()
			err = rows.Err()
		}
		switch {
		case err == nil:
		case errors.Is(crsql.Classify(err), crsql.ErrSchemaMissing):
			return failf(2, "the crdbwork schema is incomplete: the table %s is missing: run `demo migrate` (it recreates what is missing)", tables.Table(t))
		default:
			return failf(1, "checking the crdbwork table %s: %v", tables.Table(t), err)
		}
	}
	return nil
}

// isMissingDatabase reports the server's "database does not exist" (3D000;
// CockroachDB accepts the connection and says so at the first statement).
func isMissingDatabase(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "3D000"
}

func missingDatabaseMessage(err error) string {
	var pgErr *pgconn.PgError
	errors.As(err, &pgErr)
	return fmt.Sprintf("the database does not exist on the server (%s): create it (CREATE DATABASE ...) or fix the URL's path", pgErr.Message)
}

// migration is what migrate did.
type migration struct {
	From     int64    // the version before (0: no schema)
	To       int64    // the version after
	Warnings []string // things Apply did not do (CockroachDB zone settings it was refused)
}

// migrate creates or upgrades the crdbwork schema in place (crsql.ApplyWith:
// only the migrations above the installed version) and creates the demo
// tables.
func migrate(ctx context.Context, db crsql.DB) (migration, error) {
	m := migration{To: crsql.Version}
	m.From = installedVersion(ctx, db)
	err := crsql.ApplyWith(ctx, db, tables, crsql.ApplyOptions{Warn: func(msg string) { m.Warnings = append(m.Warnings, msg) }})
	if err != nil {
		if errors.Is(err, crsql.ErrSchemaNewer) {
			return m, failf(2, "%v", err)
		}
		return m, failf(1, "applying the crdbwork schema: %v", err)
	}
	for _, s := range demoTablesSQL {
		if _, err := db.Exec(ctx, s); err != nil {
			return m, failf(1, "creating the demo tables: %v", err)
		}
	}
	return m, nil
}

// installedVersion reads the schema version row: 0 when there is none.
func installedVersion(ctx context.Context, db crsql.DB) int64 {
	v, _, err := crsql.Installed(ctx, db, tables)
	if err != nil {
		return 0
	}
	return v
}

// engineName asks the server which engine it is.
func engineName(ctx context.Context, db crsql.DB) string {
	d, err := crsql.DetectDialect(ctx, db)
	if err != nil {
		return "unknown"
	}
	return d.String()
}

// verbose reports whether level shows info logs.
func verbose(level string) bool {
	l := strings.ToLower(level)
	return l == "debug" || l == "info"
}
