package testdb

// The CockroachDB fault model on PostgreSQL (CRDBWORK_TEST_FAULTS=crdb).
//
// CockroachDB answers SQLSTATE 40001 ("restart transaction") under ordinary
// contention, at any statement of an explicit transaction and at its
// COMMIT, after which the transaction has committed nothing; PostgreSQL
// does so only on real serialization conflicts, which a test rarely
// provokes. In this mode every test database that New, NewURL, NewServer
// and ExampleURL make raises 40001 itself, at a chosen rate, on the
// statements that write crdbwork's tables, and at the COMMIT of the
// transactions that wrote them:
//
//   - A BEFORE … FOR EACH STATEMENT trigger on INSERT, UPDATE and DELETE of
//     every crdbwork table draws once per client statement (a cascade or a
//     second trigger of the same statement draws nothing).
//   - A deferred constraint trigger (AFTER … DEFERRABLE INITIALLY DEFERRED)
//     on the same tables fires when the transaction commits and draws once
//     per transaction: a 40001 there rolls the transaction back, so the
//     COMMIT fails and nothing of it committed — CockroachDB's contract.
//
// Weights. CockroachDB retries an implicit transaction (a statement sent
// outside BEGIN … COMMIT, reading or writing) by itself, on the server, as
// long as it has sent none of its results to the client (the results
// buffer, sql.defaults.results_buffer.size, 16 KiB by default), so a client
// sees 40001 there only for statements with large results; inside an
// explicit transaction it cannot retry what the client has already seen,
// so the statements after BEGIN, and the COMMIT, may fail. A trigger
// cannot tell an explicit transaction's first statement from an implicit
// transaction (PostgreSQL shows no transaction block to SQL), but it can
// tell the later ones: a writing statement of a transaction that has
// already run one with another statement_timestamp(), and a COMMIT that
// comes in a statement of its own. Those draw at rate. The first writing
// statement of a transaction, and the commit at the end of an implicit
// transaction, draw at implicit: 0 by default, as CockroachDB retries them
// itself; implicit=R stresses the retries around single statements
// (package internal/retry's Do) too, and the tests' own statements with
// them. Reads cannot be reached: PostgreSQL has no trigger on SELECT, and
// row-level security, the only per-read hook, does not apply to the
// superuser the tests connect as. A read in a transaction that writes is
// followed by a write or a COMMIT that may fail for it; crdbwork's
// read-only transactions are not covered.
//
// Reproducing. Each database's draws are a hash of a per-binary seed, the
// database's number in the binary and a per-database draw counter (a
// sequence): a test whose statements run in the same order draws the same
// faults. The seed is printed when the first database is made, with the
// setting that repeats the run.
//
// Confinement. Only crdbwork's tables get the triggers — a table named by
// one of crdbwork's table suffixes next to the same prefix's
// schema_version table, not the version table itself (written only by
// sql.Apply) —, installed on the tables that exist when the database is
// made (a database copied from a template) and, by an event trigger, on
// those created later. The harness's own statements (creating and dropping
// databases) run on the server's default database, which has none.
//
// Wake-ups. The mode also sets testhook.SetNoListen: workers do not
// LISTEN and find new items with the idle probe, as on CockroachDB.
// Processes that tests start (cmd/demo) take the environment that
// FaultEnviron returns.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/crdbwork/crdbwork/internal/dbserver"
	"github.com/crdbwork/crdbwork/internal/testhook"
)

// FaultsEnv is the environment variable that turns the CockroachDB fault
// model on: "crdb", optionally followed by comma-separated settings,
// "rate=0.05" (the share of explicit transactions' writing statements and
// COMMITs answered with 40001), "implicit=0.01" (the share of first
// writing statements and implicit commits; default 0, see above) and
// "seed=N" (default: a random seed, printed). Empty or "off": no faults.
const FaultsEnv = "CRDBWORK_TEST_FAULTS"

// DefaultFaultRate is the rate of CRDBWORK_TEST_FAULTS=crdb without rate=.
const DefaultFaultRate = 0.05

// FaultConfig is the parsed CRDBWORK_TEST_FAULTS.
type FaultConfig struct {
	On       bool
	Rate     float64 // explicit transactions' writing statements and COMMITs
	Implicit float64 // first writing statements and implicit commits
	Seed     uint64
}

// String is the CRDBWORK_TEST_FAULTS value that repeats c.
func (c FaultConfig) String() string {
	if !c.On {
		return "off"
	}
	return fmt.Sprintf("crdb,rate=%g,implicit=%g,seed=%d", c.Rate, c.Implicit, c.Seed)
}

// ParseFaults parses a CRDBWORK_TEST_FAULTS value. A missing seed is drawn
// at random.
func ParseFaults(v string) (FaultConfig, error) {
	v = strings.TrimSpace(v)
	if v == "" || v == "off" {
		return FaultConfig{}, nil
	}
	fields := strings.Split(v, ",")
	if strings.TrimSpace(fields[0]) != "crdb" {
		return FaultConfig{}, fmt.Errorf("%s=%q: want \"crdb\" (optionally followed by ,rate=R,implicit=R,seed=N) or \"off\"", FaultsEnv, v)
	}
	c := FaultConfig{On: true, Rate: DefaultFaultRate, Seed: rand.Uint64()}
	for _, f := range fields[1:] {
		k, val, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok {
			return FaultConfig{}, fmt.Errorf("%s=%q: %q is not key=value", FaultsEnv, v, f)
		}
		var err error
		switch k {
		case "rate":
			c.Rate, err = parseRate(val)
		case "implicit":
			c.Implicit, err = parseRate(val)
		case "seed":
			c.Seed, err = strconv.ParseUint(val, 10, 64)
		default:
			err = errors.New("unknown setting (want rate, implicit or seed)")
		}
		if err != nil {
			return FaultConfig{}, fmt.Errorf("%s=%q: %s: %w", FaultsEnv, v, k, err)
		}
	}
	return c, nil
}

func parseRate(s string) (float64, error) {
	r, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, err
	}
	if r < 0 || r > 0.5 {
		return 0, fmt.Errorf("%g is not a share between 0 and 0.5 (a higher one would exhaust the retries)", r)
	}
	return r, nil
}

// The binary's fault model, parsed once (loadFaults).
var (
	faultsOnce sync.Once
	faults     FaultConfig
	faultsErr  error
)

// loadFaults parses CRDBWORK_TEST_FAULTS once, and when the model is on,
// turns its in-process part on and prints the setting that repeats the
// run.
func loadFaults() (FaultConfig, error) {
	faultsOnce.Do(func() {
		faults, faultsErr = ParseFaults(os.Getenv(FaultsEnv))
		if faultsErr != nil || !faults.On {
			return
		}
		testhook.SetNoListen(true)
		fmt.Fprintf(os.Stderr, "testdb: CockroachDB fault model on (PostgreSQL servers only): 40001 at %g of explicit transactions' writing statements and COMMITs, at %g of first writing statements and implicit commits; no LISTEN. To repeat: %s='%s'\n",
			faults.Rate, faults.Implicit, FaultsEnv, faults)
	})
	return faults, faultsErr
}

// FaultsOn reports whether the CockroachDB fault model is on for this
// test binary's databases: tests that assert exact retry counts, or that
// nothing was retried, use it to know that retries are expected. It is off
// when the tests' server is CockroachDB (whose retries are the real thing).
func FaultsOn() bool {
	c, err := loadFaults()
	if err != nil || !c.On {
		return false
	}
	e, err := getEnv()
	return err == nil && e.kind == dbserver.Postgres
}

// FaultEnviron returns the variables that give a process a test starts the
// fault model's in-process part: DEMO_WAKE=probe (cmd/demo's --wake) when
// the model is on, nothing otherwise. The database side needs nothing: it
// is in the database.
func FaultEnviron() []string {
	if c, err := loadFaults(); err != nil || !c.On {
		return nil
	}
	return []string{"DEMO_WAKE=probe"}
}

// execQueryer runs statements: *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type execQueryer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// InstallFaults installs the fault model in the database at dbURL with c's
// rates and seed, whatever CRDBWORK_TEST_FAULTS says (or replaces the
// rates and seed of the one there), so that a test of the fault paths
// runs in the normal mode too. It does not turn LISTEN off (that is the
// whole test binary's, with CRDBWORK_TEST_FAULTS). It reports false, and
// installs nothing, when the server is CockroachDB, whose own faults are
// the real thing.
func InstallFaults(t testing.TB, dbURL string, c FaultConfig) bool {
	t.Helper()
	if Kind(t) != dbserver.Postgres {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := install(ctx, dbURL, c.Rate, c.Implicit, int64(c.Seed)); err != nil {
		t.Fatalf("testdb: InstallFaults: %v", err)
	}
	return true
}

// SetFaultRate changes the fault rates of the database db is connected to,
// for the statements that start after it. It fails the test if the fault
// model is not installed there.
func SetFaultRate(t testing.TB, db execQueryer, rate, implicit float64) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `UPDATE crdbwork_test_faults.settings SET rate = $1, implicit = $2`, rate, implicit); err != nil {
		t.Fatalf("testdb: SetFaultRate: %v", err)
	}
}

// Quiet turns the fault model off (SetFaultRate 0, 0) for the database db
// is connected to, for a test that commits transactions of its own
// without retrying them (a caller's transaction around EnqueueTx: on
// CockroachDB its caller must retry it), or that asserts one exact
// interleaving or outcome of the server (an injected 40001 at a COMMIT
// whose answer a proxy drops makes it not commit). It does nothing where
// the model is not installed.
func Quiet(t testing.TB, db execQueryer) {
	t.Helper()
	if installed(t, db) {
		SetFaultRate(t, db, 0, 0)
	}
}

// installed reports whether the fault model is installed in the database
// db is connected to.
func installed(t testing.TB, db execQueryer) bool {
	t.Helper()
	var ok bool
	if err := db.QueryRow(context.Background(), `SELECT to_regclass('crdbwork_test_faults.settings') IS NOT NULL`).Scan(&ok); err != nil {
		t.Fatalf("testdb: is the fault model installed: %v", err)
	}
	return ok
}

// InjectedFaults returns how many 40001 errors the fault model raised so
// far in the database db is connected to, at statements and at commits
// (0, 0 where it is not installed).
func InjectedFaults(t testing.TB, db execQueryer) (statements, commits int64) {
	t.Helper()
	if !installed(t, db) {
		return 0, 0
	}
	statements, commits, err := injectedFaults(context.Background(), db)
	if err != nil {
		t.Fatalf("testdb: InjectedFaults: %v", err)
	}
	return statements, commits
}

func injectedFaults(ctx context.Context, db execQueryer) (statements, commits int64, err error) {
	err = db.QueryRow(ctx, `SELECT
		(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM crdbwork_test_faults.statement_faults),
		(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM crdbwork_test_faults.commit_faults)`).Scan(&statements, &commits)
	return statements, commits, err
}

// installFaults installs the fault model, when it is on, in the database
// dbURL names (the n-th of this binary) on a server of engine kind.
func installFaults(ctx context.Context, dbURL string, n uint64, kind dbserver.Kind) error {
	c, err := loadFaults()
	if err != nil || !c.On || kind != dbserver.Postgres {
		return err
	}
	// The database's seed: the binary's, mixed with the database's number.
	return install(ctx, dbURL, c.Rate, c.Implicit, int64(mix(c.Seed^mix(n))))
}

// install runs faultStatements in the database at dbURL.
func install(ctx context.Context, dbURL string, rate, implicit float64, seed int64) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("fault model: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, s := range faultStatements(rate, implicit, seed) {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("fault model: %w\nstatement: %s", err, s)
		}
	}
	return nil
}

// mix is splitmix64's finalizer.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// faultTableSuffixes are crdbwork's tables (sql/schema.go's tableNames),
// but the version table: package sql's tests check the list.
var faultTableSuffixes = []string{
	"sessions", "queues", "session_parts", "items", "dead_items", "tenant_limits",
	"schedules", "session_queues", "ended", "audit", "waiting", "waits_for", "cancelled_items", "waits_across", "reaps",
	"attempt_errors",
}

// FaultTableSuffixes returns the suffixes of the tables the fault model
// reaches (every crdbwork table but the version table).
func FaultTableSuffixes() []string { return append([]string(nil), faultTableSuffixes...) }

// faultStatements installs the model, idempotently: settings, counters,
// the draw, the triggers' functions, the triggers on the crdbwork tables
// that exist, and the event trigger that adds them to later ones. The
// triggers' functions run as their owner (SECURITY DEFINER), so that the
// model also draws for the statements of roles the tests create with only
// a worker's or an operator's grants (on the crdbwork tables, not on this
// schema).
func faultStatements(rate, implicit float64, seed int64) []string {
	suffixes := make([]string, len(faultTableSuffixes))
	for i, s := range faultTableSuffixes {
		suffixes[i] = "'" + s + "'"
	}
	return []string{
		`CREATE SCHEMA IF NOT EXISTS crdbwork_test_faults`,
		`CREATE TABLE IF NOT EXISTS crdbwork_test_faults.settings (
			singleton BOOL PRIMARY KEY DEFAULT true CHECK (singleton),
			rate FLOAT8 NOT NULL, implicit FLOAT8 NOT NULL, seed BIGINT NOT NULL)`,
		fmt.Sprintf(`INSERT INTO crdbwork_test_faults.settings (rate, implicit, seed) VALUES (%g, %g, %d)
			ON CONFLICT (singleton) DO UPDATE SET rate = excluded.rate, implicit = excluded.implicit, seed = excluded.seed`,
			rate, implicit, seed),
		`CREATE SEQUENCE IF NOT EXISTS crdbwork_test_faults.draws`,
		`CREATE SEQUENCE IF NOT EXISTS crdbwork_test_faults.statement_faults`,
		`CREATE SEQUENCE IF NOT EXISTS crdbwork_test_faults.commit_faults`,
		// draw returns true for a share p of its calls: the n-th draw of
		// the database is a hash of n and the seed.
		`CREATE OR REPLACE FUNCTION crdbwork_test_faults.draw(p FLOAT8, seed BIGINT) RETURNS BOOL
		LANGUAGE plpgsql AS $$
		BEGIN
			IF p <= 0 THEN
				RETURN false;
			END IF;
			RETURN (hashint8extended(nextval('crdbwork_test_faults.draws'), seed) & 2147483647)::FLOAT8 / 2147483648.0 < p;
		END $$`,
		// on_statement: once per client statement (the transaction-local
		// crdbwork_test_faults.stmt names the statement that drew). The
		// first writing statement of a transaction may be an implicit
		// transaction: it draws at implicit; later ones at rate.
		`CREATE OR REPLACE FUNCTION crdbwork_test_faults.on_statement() RETURNS trigger
		LANGUAGE plpgsql SECURITY DEFINER AS $$
		DECLARE
			st TEXT := statement_timestamp()::TEXT;
			first TEXT := COALESCE(current_setting('crdbwork_test_faults.first', true), '');
			s crdbwork_test_faults.settings;
		BEGIN
			IF COALESCE(current_setting('crdbwork_test_faults.stmt', true), '') = st THEN
				RETURN NULL;
			END IF;
			PERFORM set_config('crdbwork_test_faults.stmt', st, true);
			IF first = '' THEN
				PERFORM set_config('crdbwork_test_faults.first', st, true);
			END IF;
			SELECT * INTO s FROM crdbwork_test_faults.settings;
			IF crdbwork_test_faults.draw(CASE WHEN first <> '' AND first <> st THEN s.rate ELSE s.implicit END, s.seed) THEN
				PERFORM nextval('crdbwork_test_faults.statement_faults');
				RAISE EXCEPTION 'restart transaction: TransactionRetryWithProtoRefreshError: injected by the test fault model at % on %', TG_OP, TG_TABLE_NAME
					USING ERRCODE = '40001', HINT = 'crdbwork test fault model (CRDBWORK_TEST_FAULTS): retry the transaction';
			END IF;
			RETURN NULL;
		END $$`,
		// on_commit: deferred, so it runs when the transaction commits;
		// once per transaction. A COMMIT sent as a statement of its own
		// has another statement_timestamp() than the last writing
		// statement: it draws at rate; the end of an implicit transaction
		// at implicit.
		`CREATE OR REPLACE FUNCTION crdbwork_test_faults.on_commit() RETURNS trigger
		LANGUAGE plpgsql SECURITY DEFINER AS $$
		DECLARE
			s crdbwork_test_faults.settings;
			explicit BOOL := COALESCE(current_setting('crdbwork_test_faults.stmt', true), '') <> statement_timestamp()::TEXT;
		BEGIN
			IF COALESCE(current_setting('crdbwork_test_faults.commit', true), '') = 'drawn' THEN
				RETURN NULL;
			END IF;
			PERFORM set_config('crdbwork_test_faults.commit', 'drawn', true);
			SELECT * INTO s FROM crdbwork_test_faults.settings;
			IF crdbwork_test_faults.draw(CASE WHEN explicit THEN s.rate ELSE s.implicit END, s.seed) THEN
				PERFORM nextval('crdbwork_test_faults.commit_faults');
				RAISE EXCEPTION 'restart transaction: TransactionRetryWithProtoRefreshError: injected by the test fault model at COMMIT'
					USING ERRCODE = '40001', HINT = 'crdbwork test fault model (CRDBWORK_TEST_FAULTS): the transaction committed nothing; retry it';
			END IF;
			RETURN NULL;
		END $$`,
		// install_on adds both triggers to one table if it is crdbwork's.
		`CREATE OR REPLACE FUNCTION crdbwork_test_faults.install_on(rel OID) RETURNS VOID
		LANGUAGE plpgsql AS $$
		DECLARE
			ns OID;
			name TEXT;
			suffix TEXT;
		BEGIN
			SELECT c.relnamespace, c.relname INTO ns, name FROM pg_class AS c WHERE c.oid = rel AND c.relkind IN ('r', 'p');
			IF name IS NULL THEN
				RETURN;
			END IF;
			FOREACH suffix IN ARRAY ARRAY[` + strings.Join(suffixes, ", ") + `] LOOP
				IF right(name, length(suffix)) = suffix AND EXISTS (SELECT FROM pg_class AS v WHERE v.relnamespace = ns
					AND v.relname = left(name, length(name) - length(suffix)) || 'schema_version') THEN
					IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = rel AND tgname = 'crdbwork_test_fault_statement') THEN
						EXECUTE format('CREATE TRIGGER crdbwork_test_fault_statement BEFORE INSERT OR UPDATE OR DELETE ON %s
							FOR EACH STATEMENT EXECUTE FUNCTION crdbwork_test_faults.on_statement()', rel::regclass);
					END IF;
					IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = rel AND tgname = 'crdbwork_test_fault_commit') THEN
						EXECUTE format('CREATE CONSTRAINT TRIGGER crdbwork_test_fault_commit AFTER INSERT OR UPDATE OR DELETE ON %s
							DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION crdbwork_test_faults.on_commit()', rel::regclass);
					END IF;
					RETURN;
				END IF;
			END LOOP;
		END $$`,
		`CREATE OR REPLACE FUNCTION crdbwork_test_faults.on_create() RETURNS event_trigger
		LANGUAGE plpgsql AS $$
		DECLARE
			r RECORD;
		BEGIN
			FOR r IN SELECT objid FROM pg_event_trigger_ddl_commands() WHERE object_type = 'table' LOOP
				PERFORM crdbwork_test_faults.install_on(r.objid);
			END LOOP;
		END $$`,
		`DO $$
		BEGIN
			IF NOT EXISTS (SELECT FROM pg_event_trigger WHERE evtname = 'crdbwork_test_faults') THEN
				CREATE EVENT TRIGGER crdbwork_test_faults ON ddl_command_end WHEN TAG IN ('CREATE TABLE')
					EXECUTE FUNCTION crdbwork_test_faults.on_create();
			END IF;
		END $$`,
		`SELECT crdbwork_test_faults.install_on(c.oid) FROM pg_class AS c
			JOIN pg_namespace AS n ON n.oid = c.relnamespace
			WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'crdbwork_test_faults')`,
	}
}
