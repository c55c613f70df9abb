package testdb

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/dbserver"
)

func TestParseFaults(t *testing.T) {
	for _, c := range []struct {
		in   string
		want FaultConfig
		bad  bool
	}{
		{in: "", want: FaultConfig{}},
		{in: "off", want: FaultConfig{}},
		{in: "crdb,seed=7", want: FaultConfig{On: true, Rate: DefaultFaultRate, Implicit: 0, Seed: 7}},
		{in: "crdb, rate=0.2, implicit=0, seed=9", want: FaultConfig{On: true, Rate: 0.2, Implicit: 0, Seed: 9}},
		{in: "crdb,rate=0.1,implicit=0.02,seed=1", want: FaultConfig{On: true, Rate: 0.1, Implicit: 0.02, Seed: 1}},
		{in: "cockroach", bad: true},
		{in: "crdb,rate=2", bad: true},
		{in: "crdb,rate=-0.1", bad: true},
		{in: "crdb,rate", bad: true},
		{in: "crdb,speed=1", bad: true},
		{in: "crdb,seed=x", bad: true},
	} {
		got, err := ParseFaults(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("ParseFaults(%q) = %+v, want an error", c.in, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseFaults(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if got.On {
			again, err := ParseFaults(got.String())
			if err != nil || again != got {
				t.Errorf("ParseFaults(%q) (the String of %q) = %+v, %v; want %+v", got.String(), c.in, again, err, got)
			}
		}
	}
	// A missing seed is drawn, and printed with the rest.
	a, _ := ParseFaults("crdb")
	b, _ := ParseFaults("crdb")
	if a.Seed == b.Seed {
		t.Errorf("two seeds drawn alike: %d", a.Seed)
	}
}

// faultDB returns a pool on a fresh database with the fault model
// installed at the given rates and seed, whatever CRDBWORK_TEST_FAULTS says,
// and a crdbwork-like table set: the version table, crdbwork_items (its
// trigger is made by the event trigger) and other_items (no version table
// of its prefix: not crdbwork's).
func faultDB(t *testing.T, rate, implicit float64, seed int64) *pgxpool.Pool {
	t.Helper()
	if Kind(t) != dbserver.Postgres {
		t.Skip("the fault model is PostgreSQL's: CockroachDB raises its own")
	}
	u := NewURL(t)
	if !InstallFaults(t, u, FaultConfig{On: true, Rate: rate, Implicit: implicit, Seed: uint64(seed)}) {
		t.Fatal("InstallFaults on PostgreSQL installed nothing")
	}
	pool, err := pgxpool.New(ctxFor(t), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if !installed(t, pool) {
		t.Fatal("the fault model is not installed")
	}
	ctx := ctxFor(t)
	for _, s := range []string{
		`CREATE TABLE crdbwork_schema_version (v INT)`,
		`CREATE TABLE crdbwork_items (id INT PRIMARY KEY)`,
		`CREATE TABLE other_items (id INT PRIMARY KEY)`} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	return pool
}

func isRetry(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40001"
}

func count(t *testing.T, db *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(ctxFor(t), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFaultModelExplicit: at rate 1 and implicit 0, statements outside a
// transaction and a transaction's first write pass; its second write
// fails, and so does the COMMIT of a transaction with one write, which
// then committed nothing.
func TestFaultModelExplicit(t *testing.T) {
	db := faultDB(t, 1, 0, 1)
	ctx := ctxFor(t)
	// Implicit transactions, simple and extended protocol.
	if _, err := db.Exec(ctx, `INSERT INTO crdbwork_items VALUES (1)`); err != nil {
		t.Fatalf("implicit insert (simple protocol): %v", err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO crdbwork_items VALUES ($1)`, 2); err != nil {
		t.Fatalf("implicit insert (extended protocol): %v", err)
	}
	if _, err := db.Exec(ctx, `UPDATE crdbwork_items SET id = id WHERE id = $1`, 2); err != nil {
		t.Fatalf("implicit update: %v", err)
	}
	// A second write in a transaction fails.
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO crdbwork_items VALUES ($1)`, 3); err != nil {
		t.Fatalf("first write of a transaction: %v", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM crdbwork_items WHERE id = $1`, 1); !isRetry(err) {
		t.Fatalf("second write of a transaction: %v, want 40001", err)
	}
	_ = tx.Rollback(ctx)
	// A COMMIT fails, at the server's default isolation too, and nothing
	// committed.
	tx, err = db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO crdbwork_items VALUES ($1)`, 4); err != nil {
		t.Fatalf("first write of a transaction: %v", err)
	}
	if err := tx.Commit(ctx); !isRetry(err) {
		t.Fatalf("COMMIT: %v, want 40001", err)
	}
	if n := count(t, db, "crdbwork_items"); n != 2 {
		t.Errorf("%d items after the failed COMMIT, want 2", n)
	}
	// Not crdbwork's table: never.
	tx, err = db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := tx.Exec(ctx, `INSERT INTO other_items VALUES ($1)`, i); err != nil {
			t.Fatalf("write %d of another table: %v", i, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("COMMIT of another table's writes: %v", err)
	}
	// The version table: never.
	tx, err = db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := tx.Exec(ctx, `INSERT INTO crdbwork_schema_version VALUES (1)`); err != nil {
			t.Fatalf("write of the version table: %v", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("COMMIT of the version table's writes: %v", err)
	}
	stmts, commits := injected(t, db)
	if stmts != 1 || commits != 1 {
		t.Errorf("injected %d statement and %d commit faults, want 1 and 1", stmts, commits)
	}
}

// TestFaultModelImplicit: at rate 0 and implicit 1, a statement outside a
// transaction fails (at the statement or at its implicit commit) and
// leaves nothing; a cascade from another table draws nothing more.
func TestFaultModelImplicit(t *testing.T) {
	db := faultDB(t, 0, 1, 1)
	ctx := ctxFor(t)
	if _, err := db.Exec(ctx, `INSERT INTO crdbwork_items VALUES ($1)`, 1); !isRetry(err) {
		t.Fatalf("implicit insert: %v, want 40001", err)
	}
	if n := count(t, db, "crdbwork_items"); n != 0 {
		t.Errorf("%d items after the failed insert, want 0", n)
	}
	stmts, commits := injected(t, db)
	if stmts != 1 || commits != 0 {
		t.Errorf("injected %d statement and %d commit faults, want 1 and 0", stmts, commits)
	}
}

// TestFaultModelRates: the share of failed transactions follows the rate,
// and the same seed draws the same faults.
func TestFaultModelRates(t *testing.T) {
	run := func(seed int64) []bool {
		db := faultDB(t, 0.2, 0, seed)
		ctx := ctxFor(t)
		var failed []bool
		for i := range 200 {
			tx, err := db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, `INSERT INTO crdbwork_items VALUES ($1)`, i)
			if err == nil {
				err = tx.Commit(ctx)
			} else {
				_ = tx.Rollback(ctx)
			}
			if err != nil && !isRetry(err) {
				t.Fatal(err)
			}
			failed = append(failed, err != nil)
		}
		return failed
	}
	a, b, c := run(5), run(5), run(6)
	if !slices.Equal(a, b) {
		t.Errorf("the same seed drew different faults:\n%v\n%v", a, b)
	}
	if slices.Equal(a, c) {
		t.Errorf("two seeds drew the same faults")
	}
	n := 0
	for _, f := range a {
		if f {
			n++
		}
	}
	// 200 commits at 0.2: 40 expected; [20, 60] is beyond 4 standard
	// deviations (5.7) either way.
	if n < 20 || n > 60 {
		t.Errorf("%d of 200 commits failed at rate 0.2", n)
	}
}

// TestFaultModelTemplate: tables that exist when the model is installed
// (a database copied from a template) get the triggers too.
func TestFaultModelTemplate(t *testing.T) {
	if Kind(t) != dbserver.Postgres {
		t.Skip("the fault model is PostgreSQL's")
	}
	db := New(t)
	ctx := ctxFor(t)
	for _, s := range append([]string{
		`CREATE SCHEMA work`,
		`CREATE TABLE work.q_schema_version (v INT)`,
		`CREATE TABLE work.q_sessions (id INT PRIMARY KEY)`,
	}, faultStatements(0, 1, 1)...) {
		if _, err := db.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	if _, err := db.Exec(ctx, `DELETE FROM work.q_sessions`); !isRetry(err) {
		t.Fatalf("delete from a table made before the model: %v, want 40001", err)
	}
	if _, err := db.Exec(ctx, `DELETE FROM work.q_schema_version`); err != nil {
		t.Fatalf("delete from the version table: %v", err)
	}
}

func injected(t *testing.T, db *pgxpool.Pool) (stmts, commits int64) {
	t.Helper()
	return InjectedFaults(t, db)
}

// TestFaultModelTemplateCopies: a database copied from a template
// (NewFromTemplate) has the fault model when it is on, with its triggers
// on the tables the template holds, and none otherwise; the template's
// build ran without it.
func TestFaultModelTemplateCopies(t *testing.T) {
	buildSaw := make(chan bool, 1)
	pool := NewFromTemplate(t, "fault model", func(ctx context.Context, pool *pgxpool.Pool) error {
		for _, s := range []string{
			`CREATE TABLE crdbwork_schema_version (v INT)`,
			`CREATE TABLE crdbwork_items (id INT PRIMARY KEY)`,
		} {
			if _, err := pool.Exec(ctx, s); err != nil {
				return err
			}
		}
		var has bool
		err := pool.QueryRow(ctx, `SELECT to_regclass('crdbwork_test_faults.settings') IS NOT NULL`).Scan(&has)
		buildSaw <- has
		return err
	})
	select {
	case has := <-buildSaw:
		if has {
			t.Error("the template was built with the fault model installed")
		}
	default: // built by an earlier test of the binary
	}
	var triggers int
	if err := pool.QueryRow(ctxFor(t), `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'crdbwork_items'::regclass AND tgname LIKE 'crdbwork_test_fault%'`).Scan(&triggers); err != nil {
		t.Fatal(err)
	}
	want := 0
	if FaultsOn() {
		want = 2
	}
	if installed(t, pool) != FaultsOn() || triggers != want {
		t.Errorf("the copy: model installed %v, %d fault triggers on crdbwork_items; want %v, %d", installed(t, pool), triggers, FaultsOn(), want)
	}
}
