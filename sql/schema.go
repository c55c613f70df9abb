package sql

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Version is the schema version this code expects. Apply brings a database
// to it; Check accepts a database at this version, or at a newer one that
// still serves this code (see Serves).
const Version = 6

// Serves is the oldest code version that a database at Version still
// serves: code of that version and newer keeps working on it, through
// session losses and restarts, so a rolling upgrade never stops old
// workers. The version row stores it in its `version` column, the column
// that code of versions 1 to 3 compares with its own version, and the
// schema's own version in `installed`.
const Serves = 3

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one numbered file of sql/migrations: it upgrades a database
// at version Version-1 to Version. Each is plain SQL, idempotent, and ends by
// raising the version row (never lowering it).
type Migration struct {
	Version int    // the version the database has after it
	Name    string // the file name, e.g. "0002_leases_tokens_pause.sql"
	SQL     string // the file's text, with the default table names
}

// Statements returns the migration's statements with the names of t.
func (m Migration) Statements(t Tables) []string { return statements(t.rewrite(m.SQL)) }

// Migrations returns every migration, in order. Migration 1 creates the
// version-1 schema; a fresh install uses SchemaSQL instead of replaying them.
func Migrations() []Migration {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		panic(err) // embedded at build time: cannot fail
	}
	var out []Migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic("crdbwork: migration file without a number: " + e.Name())
		}
		text, err := fs.ReadFile(migrationFS, "migrations/"+e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, Migration{Version: v, Name: e.Name(), SQL: string(text)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

// statements splits a SQL file into its statements, dropping comments.
func statements(file string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(file, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// isCockroach asks the server whether it is CockroachDB.
func isCockroach(ctx context.Context, db DB) (bool, error) {
	var v string
	if err := db.QueryRow(ctx, "SELECT version()").Scan(&v); err != nil {
		return false, fmt.Errorf("crdbwork: asking the server for its version: %w", err)
	}
	return strings.Contains(v, "CockroachDB"), nil
}

// ApplyOptions configure ApplyWith. The zero value is valid.
type ApplyOptions struct {
	// Warn receives warnings: things Apply did not do but that do not stop
	// crdbwork from working (today: CockroachDB zone configurations that the
	// cluster refused, as CockroachDB Cloud Basic/Serverless does). Nil
	// writes them with the standard log package.
	Warn func(msg string)
}

// Apply creates or upgrades the crdbwork schema: ApplyWith with the zero
// ApplyOptions.
func Apply(ctx context.Context, db DB, t Tables) error {
	return ApplyWith(ctx, db, t, ApplyOptions{})
}

// ApplyWith creates or upgrades the crdbwork schema, in place.
//
// A database without the schema gets the complete current schema (the file
// sql/schema.sql). A database at an older version gets the migrations above
// its version, in order, and only those (see Migrations); each is
// idempotent and raises the version row last, so an interrupted upgrade is
// finished by running ApplyWith again. A database at the current version is
// checked by applying the schema file again (every statement is idempotent).
// It refuses a schema newer than Version.
//
// Upgrading is safe while workers of the previous version run: migrations
// add tables, columns and indexes and change nothing that code of version
// Serves and newer reads or writes (see each file's header); the version
// row keeps saying that this code is served (Installed), so that code keeps
// working through session losses and restarts; and new code refuses to run
// (Check, ErrSchemaOutdated) until the upgrade is done. cmd/demo's
// upgrade_test.go runs the previous release's binary beside this code and
// under this upgrade. Some statements hold their table's lock for a time
// that grows with its rows on PostgreSQL (migration 4 rewrites the dead
// items: a new column with a volatile default and a new primary key), so
// moves of items to the dead items wait for them.
//
// After the schema it creates the SQL function crdbwork_enqueue, or
// replaces an installed one of an older revision, and leaves alone one of
// the same or a newer revision (EnqueueFunctionRevision): on CockroachDB,
// which stores a function's body re-formatted, comparing bodies would
// replace it at every start.
//
// On CockroachDB, the two claim indexes are created covering the claims'
// filter columns, under their own names (the statements of
// sql/cockroach.go's cockroachIndexes replace schema.sql's), and ApplyWith
// then applies sql/cockroach.sql (the same indexes, and zone
// configurations) best-effort: if the cluster refuses it, the schema is
// still complete, ApplyWith returns nil and reports the refusal to
// opts.Warn.
func ApplyWith(ctx context.Context, db DB, t Tables, opts ApplyOptions) error {
	if err := t.Validate(); err != nil {
		return err
	}
	warn := opts.Warn
	if warn == nil {
		warn = func(msg string) { log.Printf("crdbwork: warning: %s", msg) }
	}
	var stmts []string
	current, serves, err := installedVersion(ctx, db, t)
	switch {
	case errors.Is(err, ErrSchemaMissing):
		if t.Schema != "" {
			stmts = append(stmts, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{t.Schema}.Sanitize())
		}
		stmts = append(stmts, statements(t.rewrite(schemaFile))...)
	case err != nil:
		return err
	case serves > Version:
		return fmt.Errorf("%w (database has version %d and serves code of version %d and newer, this code %d)", ErrSchemaNewer, current, serves, Version)
	case current > Version:
		// A newer schema that still serves this code is left as it is:
		// this code must not apply its older file over it.
		return nil
	case current == Version:
		stmts = statements(t.rewrite(schemaFile))
	default:
		for _, m := range Migrations() {
			if int64(m.Version) > current {
				stmts = append(stmts, m.Statements(t)...)
			}
		}
	}
	cockroach, err := isCockroach(ctx, db)
	if err != nil {
		return err
	}
	if cockroach {
		stmts = cockroachForms(stmts, t)
	}
	for _, s := range stmts {
		if _, err := db.Exec(ctx, s); err != nil {
			return fmt.Errorf("crdbwork: applying schema: %w\nstatement: %s", err, s)
		}
	}
	if err := applyEnqueueFunction(ctx, db, cockroach, t, warn); err != nil {
		return err
	}
	if cockroach {
		for _, s := range statements(t.rewrite(cockroachFile)) {
			if _, err := db.Exec(ctx, s); err != nil {
				warn(fmt.Sprintf("the cluster refused a CockroachDB setting of sql/cockroach.sql (CockroachDB Cloud Basic/Serverless refuses zone configurations); crdbwork works without it, with a longer garbage-collection TTL for its tables: %v (statement: %s)", err, s))
				break
			}
		}
	}
	return nil
}

// Check reports whether the schema serves this code: nil for a database at
// Version, or at a newer version that still serves it (a rolling upgrade in
// progress); otherwise an error wrapping ErrSchemaMissing, ErrSchemaOutdated
// or ErrSchemaNewer.
func Check(ctx context.Context, db DB, t Tables) error {
	v, serves, err := installedVersion(ctx, db, t)
	if err != nil {
		return err
	}
	switch {
	case v < Version:
		return fmt.Errorf("%w (database has version %d, this code %d)", ErrSchemaOutdated, v, Version)
	case serves > Version:
		return fmt.Errorf("%w (database has version %d and serves code of version %d and newer, this code %d)", ErrSchemaNewer, v, serves, Version)
	}
	return nil
}

// Installed returns the database's schema version and the oldest code
// version it serves (an error wrapping ErrSchemaMissing if there is none).
func Installed(ctx context.Context, db DB, t Tables) (version, serves int64, err error) {
	return installedVersion(ctx, db, t)
}

// installedVersion reads the version row. Databases of versions 1 to 3 have
// no `installed` column (their `version` is both); from version 4 on,
// `version` is the oldest code served and `installed` the schema's version.
// The row is read with SELECT * so that one query serves both.
func installedVersion(ctx context.Context, db DB, t Tables) (version, serves int64, err error) {
	// The simple protocol: a prepared SELECT * cached by the connection
	// would fail once an upgrade adds the column.
	rows, err := db.Query(ctx, "SELECT * FROM "+t.Table("schema_version"), pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return 0, 0, classify(err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return 0, 0, classify(err)
		}
		return 0, 0, fmt.Errorf("%w (the version table %s is empty)", ErrSchemaMissing, t.Table("schema_version"))
	}
	vals, err := rows.Values()
	if err != nil {
		return 0, 0, fmt.Errorf("crdbwork: reading the schema version: %w", err)
	}
	var installed int64
	for i, f := range rows.FieldDescriptions() {
		n, ok := vals[i].(int64)
		switch {
		case !ok:
		case f.Name == "version":
			serves = n
		case f.Name == "installed":
			installed = n
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, classify(err)
	}
	version = installed
	if version == 0 { // versions 1 to 3, or a version-4 upgrade interrupted before its last statement
		version = serves
	}
	return version, serves, nil
}
