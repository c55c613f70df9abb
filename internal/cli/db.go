package cli

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

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// PingTimeout bounds the first contact with the database.
const PingTimeout = 5 * time.Second

// Connect opens a pool on rawURL and pings it. maxConns, if positive, sets
// the pool size unless the URL sets pool_max_conns itself. A malformed URL
// or an unreachable server is an exit-2 error.
func Connect(ctx context.Context, rawURL string, maxConns int) (*pgxpool.Pool, error) {
	return ConnectWith(ctx, rawURL, maxConns, nil)
}

// ConnectWith is Connect with configure, if not nil, applied to the pool's
// configuration before the pool is made (worker.ConfigurePool, say); its
// error is an exit-2 error.
func ConnectWith(ctx context.Context, rawURL string, maxConns int, configure func(*pgxpool.Config) error) (*pgxpool.Pool, error) {
	if scheme, _, ok := strings.Cut(rawURL, "://"); ok && !acceptedSchemes[strings.ToLower(scheme)] {
		return nil, Failf(2, "unsupported scheme %q in the database URL%s: use postgresql:// or postgres:// (CockroachDB speaks the PostgreSQL protocol: postgresql://root@host:26257/db?sslmode=disable)",
			scheme, quotedURL(rawURL))
	}
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, Failf(2, "invalid database URL%s: %v", quotedURL(rawURL), parseErrorMessage(err))
	}
	if maxConns > 0 && !strings.Contains(rawURL, "pool_max_conns") {
		cfg.MaxConns = int32(maxConns)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > PingTimeout {
		cfg.ConnConfig.ConnectTimeout = PingTimeout
	}
	if configure != nil {
		if err := configure(cfg); err != nil {
			return nil, Failf(2, "configuring the pool for the database URL%s: %v", quotedURL(rawURL), err)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, Failf(2, "invalid database URL%s: %v", quotedURL(rawURL), err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		if ctx.Err() != nil {
			return nil, Failf(130, "interrupted")
		}
		where := fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			switch {
			case pgErr.Code == "3D000":
				return nil, Failf(2, "the database %q does not exist at %s: create it (CREATE DATABASE %s) or fix the URL's path",
					cfg.ConnConfig.Database, where, pgx.Identifier{cfg.ConnConfig.Database}.Sanitize())
			case pgErr.Code == "28P01" || pgErr.Code == "28000":
				return nil, Failf(2, "the server at %s refused user %q: wrong password or user, or not allowed to connect (%s)",
					where, cfg.ConnConfig.User, pgErr.Message)
			}
		}
		if errors.Is(pingCtx.Err(), context.DeadlineExceeded) {
			return nil, Failf(2, "cannot reach the database at %s within %v: %v", where, PingTimeout, err)
		}
		return nil, Failf(2, "cannot reach the database at %s: %v", where, err)
	}
	return pool, nil
}

// acceptedSchemes are the URL schemes pgx takes.
var acceptedSchemes = map[string]bool{"postgres": true, "postgresql": true}

// Warm opens the pool's connections now, so that a worker does not open
// them while it works: on a loaded machine a new connection can take longer
// than a heartbeat's deadline.
func Warm(ctx context.Context, pool *pgxpool.Pool) {
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
	return " " + RedactURL(raw)
}

// RedactURL hides the password of a URL for messages.
func RedactURL(raw string) string {
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

// RequireSchema reports a missing or outdated crdbwork schema as an exit-2
// error that says to run `crdbwork migrate`.
func RequireSchema(ctx context.Context, db crsql.DB, tables crsql.Tables) error {
	err := crsql.Check(ctx, db, tables)
	switch {
	case err == nil:
		return requireTables(ctx, db, tables)
	case IsMissingDatabase(err):
		return Failf(2, "%s", missingDatabaseMessage(err))
	case errors.Is(err, crsql.ErrSchemaMissing):
		return Failf(2, "the crdbwork schema is not in this database: run `crdbwork migrate` first (or apply sql/schema.sql)")
	case errors.Is(err, crsql.ErrSchemaOutdated):
		return Failf(2, "the crdbwork schema in this database is at version %d, this binary needs %d: run `crdbwork migrate` (it upgrades in place; workers of the old version may keep running meanwhile)",
			InstalledVersion(ctx, db, tables), crsql.Version)
	case errors.Is(err, crsql.ErrSchemaNewer):
		return Failf(2, "%v", err)
	}
	return Failf(1, "checking the crdbwork schema: %v", err)
}

// crdbworkTables are the schema's tables, by the suffix Tables.Table takes.
var crdbworkTables = []string{"schema_version", "sessions", "queues", "session_parts", "session_queues", "items", "dead_items", "ended"}

// requireTables reports a partly missing schema (a table dropped by hand
// under a version row that says all is well) as an exit-2 error.
func requireTables(ctx context.Context, db crsql.DB, tables crsql.Tables) error {
	for _, t := range crdbworkTables {
		rows, err := db.Query(ctx, "SELECT 1 FROM "+tables.Table(t)+" LIMIT 0")
		if err == nil {
			rows.Close()
			err = rows.Err()
		}
		switch {
		case err == nil:
		case errors.Is(store.Classify(err), crsql.ErrSchemaMissing):
			return Failf(2, "the crdbwork schema is incomplete: the table %s is missing: run `crdbwork migrate` (it recreates what is missing)", tables.Table(t))
		default:
			return Failf(1, "checking the crdbwork table %s: %v", tables.Table(t), err)
		}
	}
	return nil
}

// IsMissingDatabase reports the server's "database does not exist" (3D000;
// CockroachDB accepts the connection and says so at the first statement).
func IsMissingDatabase(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "3D000"
}

func missingDatabaseMessage(err error) string {
	var pgErr *pgconn.PgError
	errors.As(err, &pgErr)
	return fmt.Sprintf("the database does not exist on the server (%s): create it (CREATE DATABASE ...) or fix the URL's path", pgErr.Message)
}

// InstalledVersion reads the schema version row: 0 when there is none.
func InstalledVersion(ctx context.Context, db crsql.DB, tables crsql.Tables) int64 {
	v, _, err := crsql.Installed(ctx, db, tables)
	if err != nil {
		return 0
	}
	return v
}

// EngineName asks the server which engine it is.
func EngineName(ctx context.Context, db crsql.DB) string {
	d, err := store.DetectDialect(ctx, db)
	if err != nil {
		return "unknown"
	}
	return d.String()
}

// OpenChecked connects to url (an exit-2 error naming f's flag when it is
// empty) with a pool of conns connections and checks the crdbwork schema
// of tables: the start of every command that needs it.
func OpenChecked(ctx context.Context, f *FlagSet, url string, tables crsql.Tables, conns int) (*pgxpool.Pool, error) {
	if err := f.RequireURL(url); err != nil {
		return nil, err
	}
	pool, err := Connect(ctx, url, conns)
	if err != nil {
		return nil, err
	}
	if err := RequireSchema(ctx, pool, tables); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}
