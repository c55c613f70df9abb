package sql_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// wantInstalled reads the version row through crsql.Installed and fails the test
// unless it is (version, serves).
func wantInstalled(t *testing.T, pool *pgxpool.Pool, version, serves int64) {
	t.Helper()
	v, s, err := crsql.Installed(context.Background(), pool, crsql.Tables{})
	if err != nil || v != version || s != serves {
		t.Fatalf("Installed = %d, serves %d, %v; want %d, serves %d", v, s, err, version, serves)
	}
}

// applyMigrationsUpTo builds a database at version v from the migration
// files, as code of that version left it.
func applyMigrationsUpTo(t *testing.T, pool *pgxpool.Pool, v int) {
	t.Helper()
	for _, m := range crsql.Migrations() {
		if m.Version > v {
			break
		}
		for _, s := range m.Statements(crsql.Tables{}) {
			if _, err := pool.Exec(context.Background(), s); err != nil {
				t.Fatalf("migration %s: %v\n%s", m.Name, err, s)
			}
		}
	}
}

// setVersionRow overwrites the version row's columns.
func setVersionRow(t *testing.T, pool *pgxpool.Pool, serves, installed int64) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `UPDATE crdbwork_schema_version SET version = $1, installed = $2`, serves, installed); err != nil {
		t.Fatal(err)
	}
}

// TestCheckServes: the version row of a version-4 or later schema says both what it
// is (`installed`) and the oldest code it serves (`version`, the column that
// code of versions 1 to 3 compares with its own version), and Check and
// Apply read both.
func TestCheckServes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if crsql.Version != 6 || crsql.Serves != 3 {
		t.Fatalf("this test is written for schema version 6 serving version-3 code, the code says version %d serving %d: update it", crsql.Version, crsql.Serves)
	}

	t.Run("current", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
			t.Fatal(err)
		}
		wantInstalled(t, pool, crsql.Version, crsql.Serves)
		if err := crsql.Check(ctx, pool, crsql.Tables{}); err != nil {
			t.Fatalf("Check of a database at version 6 serving 3: %v", err)
		}
		// What version-3 code reads and compares with its own Version (3).
		var old int64
		if err := pool.QueryRow(ctx, `SELECT version FROM crdbwork_schema_version`).Scan(&old); err != nil || old != 3 {
			t.Fatalf("the column version-3 code reads holds %d (%v), want 3", old, err)
		}
	})

	t.Run("newer, still serving this code", func(t *testing.T) {
		t.Parallel()
		pool := newSchemaDB(t)
		setVersionRow(t, pool, crsql.Version, crsql.Version+2)
		if err := crsql.Check(ctx, pool, crsql.Tables{}); err != nil {
			t.Fatalf("Check of a database at version %d serving %d: %v", crsql.Version+2, crsql.Version, err)
		}
		// Apply leaves a newer schema as it is: it never lowers the row.
		if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
			t.Fatalf("Apply over a newer schema that serves this code: %v", err)
		}
		wantInstalled(t, pool, crsql.Version+2, crsql.Version)
	})

	t.Run("newer, no longer serving this code", func(t *testing.T) {
		t.Parallel()
		pool := newSchemaDB(t)
		setVersionRow(t, pool, crsql.Version+1, crsql.Version+1)
		err := crsql.Check(ctx, pool, crsql.Tables{})
		if !errors.Is(err, crsql.ErrSchemaNewer) {
			t.Fatalf("Check of a database serving version %d and newer = %v, want ErrSchemaNewer", crsql.Version+1, err)
		}
		if !strings.Contains(err.Error(), "serves code of version 7 and newer") {
			t.Errorf("the error does not name the oldest version served: %v", err)
		}
		if err := crsql.Apply(ctx, pool, crsql.Tables{}); !errors.Is(err, crsql.ErrSchemaNewer) {
			t.Fatalf("Apply over a database serving version %d and newer = %v, want ErrSchemaNewer", crsql.Version+1, err)
		}
		wantInstalled(t, pool, crsql.Version+1, crsql.Version+1)
	})

	t.Run("version 3", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		applyMigrationsUpTo(t, pool, 3)
		wantInstalled(t, pool, 3, 3) // no `installed` column: version is both
		if err := crsql.Check(ctx, pool, crsql.Tables{}); !errors.Is(err, crsql.ErrSchemaOutdated) {
			t.Fatalf("Check of a version-3 database = %v, want ErrSchemaOutdated", err)
		}
		if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
			t.Fatal(err)
		}
		wantInstalled(t, pool, crsql.Version, crsql.Serves)
		if err := crsql.Check(ctx, pool, crsql.Tables{}); err != nil {
			t.Fatalf("Check after upgrading version 3: %v", err)
		}
	})

	t.Run("version 4 migration interrupted", func(t *testing.T) {
		t.Parallel()
		pool := testdb.New(t)
		applyMigrationsUpTo(t, pool, 3)
		// Migration 4 up to, not including, its last statement (the one that
		// raises the version row): the `installed` column is there, still 0.
		var m4 crsql.Migration
		for _, m := range crsql.Migrations() {
			if m.Version == 4 {
				m4 = m
			}
		}
		stmts := m4.Statements(crsql.Tables{})
		last := stmts[len(stmts)-1]
		if !strings.HasPrefix(last, "INSERT INTO") || !strings.Contains(last, "crdbwork_schema_version") {
			t.Fatalf("migration 4 does not end by raising the version row: %s", last)
		}
		for _, s := range stmts[:len(stmts)-1] {
			if _, err := pool.Exec(ctx, s); err != nil {
				t.Fatalf("%v\n%s", err, s)
			}
		}
		var installedCol int64
		if err := pool.QueryRow(ctx, `SELECT installed FROM crdbwork_schema_version`).Scan(&installedCol); err != nil || installedCol != 0 {
			t.Fatalf("interrupted migration: installed = %d (%v), want the column's default 0", installedCol, err)
		}
		wantInstalled(t, pool, 3, 3)
		if err := crsql.Check(ctx, pool, crsql.Tables{}); !errors.Is(err, crsql.ErrSchemaOutdated) {
			t.Fatalf("Check of an interrupted version-4 migration = %v, want ErrSchemaOutdated", err)
		}
		if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
			t.Fatalf("Apply finishing the interrupted migration: %v", err)
		}
		wantInstalled(t, pool, crsql.Version, crsql.Serves)
		if err := crsql.Check(ctx, pool, crsql.Tables{}); err != nil {
			t.Fatalf("Check after Apply finished the migration: %v", err)
		}
	})
}
