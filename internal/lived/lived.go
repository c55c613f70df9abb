// Package lived brings a crdbwork database to the state of one that has
// lived: other queues and tenants with over a hundred thousand rows,
// statistics taken before the queue under test existed, rows deleted and
// updated since (dead tuples no VACUUM has removed), ended ids, dead items,
// waiting items and their edges of the other queues. A plan that is right
// on a fresh database can be wrong there: the statistics know nothing of a
// quiet queue (one that was empty, or held a handful of items, when they
// were taken), so PostgreSQL estimates its rows at about one, whatever
// burst it got since (docs/operations.md, "Statistics on PostgreSQL").
//
// Build fills a database whose crdbwork schema is applied (with the
// default table names). The test harness (testdb.NewLived) builds it once
// per test binary, as a template database that each test copies; the
// benchmarks (bench/lived.go) the same way. The queue under test then gets
// its burst: enqueued through the API, or seeded with Items.
//
// Every statement is accepted by PostgreSQL and CockroachDB (no temporary
// tables, INT arithmetic with floor(...)::INT, no named arguments); the
// autovacuum and automatic statistics switches differ per engine and are
// chosen by SELECT version(). The package imports no other crdbwork package,
// so that every test package can use it, package sql's own included.
package lived

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what Build needs of a connection or pool.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// The other queues of a lived database, one per kind of traffic. Tests
// name their own queues otherwise (any name not starting with "lived-").
const (
	// PlainQueue is a plain queue in 16 parts.
	PlainQueue = "lived-plain"
	// FairQueue is a fair queue of Tenants tenants, each with a limit of
	// its own.
	FairQueue = "lived-fair"
	// SequencedQueue is a sequenced queue of 1,000 keys, each key's head
	// claimed for the first 1,000 keys' first items.
	SequencedQueue = "lived-seq"
	// DependsQueue holds prerequisites and the items waiting for them
	// (crdbwork_waiting, crdbwork_waits_for).
	DependsQueue = "lived-deps"
)

// Queues are the other queues, in the order Build spreads the items over.
var Queues = []string{PlainQueue, FairQueue, SequencedQueue, DependsQueue}

// Tenants is the number of tenants of FairQueue.
const Tenants = 1000

// SessionCount is the number of live sessions Build adds (expiry one
// hour): the other queues' claimed items are theirs, and a test may use
// them for its own claims.
const SessionCount = 16

// QuietRows is the number of items and ended ids a quiet queue of
// Options.Quiet holds when the statistics are taken: enough that
// PostgreSQL's sample of the default 120,000 items (30,000 rows) finds it,
// so that it is among the most common values at a frequency that makes it a
// handful of rows (a queue the sample misses is the "empty" form).
const QuietRows = 20

// Options say how large the lived state is. The zero value is the default.
type Options struct {
	// Rows is the number of items of the other queues (default 120,000),
	// spread evenly over Queues. As many ended ids, and a sixth as many
	// dead items and waiting items (each after one or two of DependsQueue's
	// items) go with them.
	Rows int
	// Quiet are queues that hold QuietRows items (and as many ended ids,
	// and two dead items) when the statistics are taken, deleted afterwards: the
	// "tiny when analyzed" form of a quiet queue. A queue not named here
	// and not among Queues is the "empty when analyzed" form.
	Quiet []string
	// Autovacuum leaves the tables' autovacuum (PostgreSQL) or automatic
	// statistics (CockroachDB) on. By default Build turns it off for the
	// tables it fills, so that the statistics stay those it took whatever
	// the test or benchmark then does: the worst case, which a database
	// whose autovacuum is behind, or whose changes since its last ANALYZE
	// are below the thresholds, is in for minutes.
	Autovacuum bool
}

func (o Options) rows() int {
	if o.Rows <= 0 {
		return 120_000
	}
	return o.Rows
}

// Sessions returns the ids of the SessionCount sessions Build adds; they are
// the same in every lived database.
func Sessions() []uuid.UUID {
	out := make([]uuid.UUID, SessionCount)
	for i := range out {
		out[i] = uuid.MustParse(fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1))
	}
	return out
}

// SessionArray is Sessions as an SQL literal of type UUID[].
func SessionArray() string {
	lits := make([]string, 0, SessionCount)
	for _, s := range Sessions() {
		lits = append(lits, "'"+s.String()+"'")
	}
	return "ARRAY[" + strings.Join(lits, ",") + "]::UUID[]"
}

// Tables are the tables Build fills, analyzes and (by default) keeps from
// autovacuum.
var Tables = []string{"crdbwork_items", "crdbwork_ended", "crdbwork_dead_items", "crdbwork_waiting",
	"crdbwork_waits_for", "crdbwork_tenant_limits", "crdbwork_sessions", "crdbwork_queues"}

// Build brings db, a database with crdbwork's schema applied (default table
// names) and no rows, to the lived state, in order:
//
//  1. the SessionCount sessions, and the other queues' settings (16 parts;
//     FairQueue fair, SequencedQueue sequenced; a limit for each of
//     FairQueue's tenants);
//  2. Options.Rows items over Queues: a tenth of them claimed (with a
//     lease; SequencedQueue: the first item of each of its keys), five
//     priorities, a seventh with a deadline; as many ended ids over the
//     last day, dead items, waiting items of DependsQueue (after one or
//     two of its items each: Waiting);
//  3. the quiet queues' handful of rows (Options.Quiet);
//  4. autovacuum off for the tables (unless Options.Autovacuum), ANALYZE
//     of every table;
//  5. what a database does after: half of DependsQueue's edges deleted
//     (the waiting items' counts are left as they were: no statement of
//     another queue reads them), a third of the other queues' items ended
//     (deleted), a tenth nacked (updated), the ended ids older than 16
//     hours and the dead items older than 20 hours pruned, the quiet
//     queues' rows gone; none of it vacuumed or analyzed.
//
// It takes a few seconds for the default size; testdb.NewLived builds it
// once per test binary and copies it.
func Build(ctx context.Context, db DB, o Options) error {
	var version string
	if err := db.QueryRow(ctx, `SELECT version()`).Scan(&version); err != nil {
		return fmt.Errorf("lived: reading the server's version: %w", err)
	}
	cockroach := strings.Contains(version, "CockroachDB")
	for _, q := range o.Quiet {
		if strings.HasPrefix(q, "lived-") || strings.ContainsAny(q, `'\`) {
			return fmt.Errorf("lived: quiet queue %q: a queue of the test's own may not start with \"lived-\" nor hold a quote or backslash", q)
		}
	}
	n := o.rows()
	var steps []string
	steps = append(steps, `INSERT INTO crdbwork_sessions (id, expiry, name)
SELECT ('00000000-0000-4000-8000-' || lpad(g::TEXT, 12, '0'))::UUID, INTERVAL '1 hour', 'lived-' || g::TEXT
FROM generate_series(1, 16) AS g`,
		`INSERT INTO crdbwork_queues (name, num_parts, fair, sequenced, max_in_flight, tenant_max_in_flight) VALUES
('`+PlainQueue+`', 16, false, false, 0, 0), ('`+FairQueue+`', 16, true, false, 0, 4),
('`+SequencedQueue+`', 16, false, true, 0, 0), ('`+DependsQueue+`', 16, false, false, 500, 0)`,
		`INSERT INTO crdbwork_tenant_limits (queue, tenant, max_in_flight, rate_limit)
SELECT '`+FairQueue+`', 'tenant-' || g::TEXT, 2, 10 FROM generate_series(0, `+fmt.Sprint(Tenants-1)+`) AS g`)
	steps = append(steps, itemsSQL(n), endedSQL(n), deadSQL(n/6))
	steps = append(steps, Waiting(DependsQueue, n/4, n/6)...)
	for _, q := range o.Quiet {
		steps = append(steps,
			Items(q, 1, QuietRows, ItemShape{Claimed: 2}),
			`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome) SELECT '`+q+`', gen_random_uuid(), now() - g * INTERVAL '1 minute', 'acked' FROM generate_series(1, `+fmt.Sprint(QuietRows)+`) AS g`,
			`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason)
SELECT gen_random_uuid(), '`+q+`', 0, 0, 1, 1, '\x00'::BYTEA, now() - INTERVAL '1 day', now() - g * INTERVAL '1 minute', 'failed' FROM generate_series(1, 2) AS g`)
	}
	if !o.Autovacuum {
		for _, t := range Tables {
			if cockroach {
				steps = append(steps, `ALTER TABLE `+t+` SET (sql_stats_automatic_collection_enabled = false)`)
			} else {
				steps = append(steps, `ALTER TABLE `+t+` SET (autovacuum_enabled = false)`)
			}
		}
	}
	for _, t := range Tables {
		steps = append(steps, `ANALYZE `+t)
	}
	steps = append(steps,
		// A third of the items ended, a tenth nacked (pushed back, one
		// more attempt), a third of the ended ids pruned, half the edges
		// satisfied: dead tuples in every table and index, unvacuumed.
		`DELETE FROM crdbwork_waits_for WHERE prereq IN (SELECT id FROM crdbwork_items WHERE queue = '`+DependsQueue+`' AND part < 8)`,
		`DELETE FROM crdbwork_items WHERE queue IN ('`+PlainQueue+`', '`+FairQueue+`', '`+DependsQueue+`') AND part < 5`,
		`UPDATE crdbwork_items SET vesting_at = vesting_at + INTERVAL '1 second', attempts = attempts + 1
WHERE queue IN ('`+PlainQueue+`', '`+FairQueue+`') AND part BETWEEN 5 AND 6 AND claim IS NULL`,
		`DELETE FROM crdbwork_ended WHERE ended_at < now() - INTERVAL '16 hours'`,
		`DELETE FROM crdbwork_dead_items WHERE died_at < now() - INTERVAL '20 hours'`)
	for _, q := range o.Quiet {
		for _, t := range []string{"crdbwork_items", "crdbwork_ended", "crdbwork_dead_items"} {
			steps = append(steps, `DELETE FROM `+t+` WHERE queue = '`+q+`'`)
		}
	}
	for _, s := range steps {
		if _, err := db.Exec(ctx, s); err != nil {
			return fmt.Errorf("lived: %w\n%s", err, s)
		}
	}
	return nil
}

// itemsSQL seeds the other queues' n items: item g of queue Queues[g % 4],
// part g % 16, priority g % 5, a tenant of FairQueue's 1,000 on its items,
// a key of SequencedQueue's 1,000 (in enqueue order) on its items, a
// seventh with a deadline, a tenth claimed by the sessions (SequencedQueue:
// its keys' first items, as its unique index allows).
func itemsSQL(n int) string {
	// k is the item's number within its queue: its keys and turns.
	const k = `floor(g / 4.0)::INT`
	claimed := `((g % 4 <> 2 AND g % 10 = 1) OR (g % 4 = 2 AND ` + k + ` < 1000))`
	return fmt.Sprintf(`INSERT INTO crdbwork_items (id, queue, part, item_key, priority, vesting_at, turn_at, enqueued_at, seq_order,
    tenant, expires_at, payload, attempts, max_attempts, claim, claim_token, claimed_at, lease_until)
SELECT gen_random_uuid(), (ARRAY['%[2]s', '%[3]s', '%[4]s', '%[5]s'])[g %% 4 + 1], g %% 16,
       CASE WHEN g %% 4 = 2 THEN 'key-' || (%[6]s %% 1000)::TEXT END, g %% 5,
       now() - (%[1]d - g) * INTERVAL '1 millisecond', now() - (%[1]d - g) * INTERVAL '1 millisecond',
       now() - (%[1]d - g) * INTERVAL '1 millisecond', CASE WHEN g %% 4 = 2 THEN g END,
       CASE WHEN g %% 4 = 1 THEN 'tenant-' || (%[6]s %% %[9]d)::TEXT END,
       CASE WHEN g %% 7 = 0 THEN now() + (g %% 100 + 600) * INTERVAL '1 second' END, '\x00'::BYTEA,
       CASE WHEN %[7]s THEN 1 ELSE 0 END, 25,
       CASE WHEN %[7]s THEN (%[8]s)[g %% 16 + 1] END,
       CASE WHEN %[7]s THEN 1 ELSE 0 END,
       CASE WHEN %[7]s THEN now() END,
       CASE WHEN %[7]s THEN now() + (g %% 600 + 300) * INTERVAL '1 second' END
FROM generate_series(1, %[1]d) AS g`, n, PlainQueue, FairQueue, SequencedQueue, DependsQueue, k, claimed, SessionArray(), Tenants)
}

// endedSQL seeds n ended ids of the other queues over the last day.
func endedSQL(n int) string {
	return fmt.Sprintf(`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
SELECT (ARRAY['%[2]s', '%[3]s', '%[4]s', '%[5]s'])[g %% 4 + 1], gen_random_uuid(), now() - g * (INTERVAL '86400 seconds' / %[1]d),
       (ARRAY['acked', 'acked', 'acked', 'dead', 'cancelled'])[g %% 5 + 1]
FROM generate_series(1, %[1]d) AS g`, n, PlainQueue, FairQueue, SequencedQueue, DependsQueue)
}

// deadSQL seeds n dead items of the other queues over the last day, some
// ids dead twice.
func deadSQL(n int) string {
	return fmt.Sprintf(`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason, tenant)
SELECT md5('lived-dead-' || (g %% %[6]d)::TEXT)::UUID, (ARRAY['%[2]s', '%[3]s', '%[4]s', '%[5]s'])[g %% 4 + 1], g %% 16, 0, 25, 25, '\x00'::BYTEA,
       now() - INTERVAL '2 days', now() - g * (INTERVAL '86400 seconds' / %[1]d), 'failed',
       CASE WHEN g %% 4 = 1 THEN 'tenant-' || (g %% 1000)::TEXT END
FROM generate_series(1, %[1]d) AS g`, max(n, 1), PlainQueue, FairQueue, SequencedQueue, DependsQueue, max(n*9/10, 1))
}

// Waiting returns the statements that give queue n waiting items
// (crdbwork_waiting) after up to prereqs of its items (crdbwork_waits_for):
// the queue's first prereqs items in id order are the prerequisites, the
// r-th of them of waiting item r mod n, so that each waiting item waits for
// one or more of them (remaining counts its edges). Run them after the
// queue's items are in; no join, so that the plan of the seed does not
// depend on statistics that know nothing of the queue.
func Waiting(queue string, prereqs, n int) []string {
	n = max(n, 1)
	return []string{fmt.Sprintf(`INSERT INTO crdbwork_waits_for (queue, prereq, dependent)
SELECT '%[1]s', id, md5('%[1]s-waiting-' || (r %% %[3]d)::TEXT)::UUID
FROM (SELECT id, row_number() OVER (ORDER BY id) AS r FROM crdbwork_items WHERE queue = '%[1]s' ORDER BY id LIMIT %[2]d) AS p`, queue, prereqs, n),
		fmt.Sprintf(`INSERT INTO crdbwork_waiting (id, queue, hash, payload, remaining, enqueued_at)
SELECT dependent, '%[1]s', count(*), '\x00'::BYTEA, count(*), now() - INTERVAL '1 minute'
FROM crdbwork_waits_for WHERE queue = '%[1]s' GROUP BY dependent`, queue)}
}

// ItemShape says what a burst's items carry.
type ItemShape struct {
	// Parts spreads the items over parts 0..Parts-1 (default 16).
	Parts int
	// Priorities spreads them over priorities 0..Priorities-1 (default 5).
	Priorities int
	// Tenants gives each one of that many tenants ("tenant-N"; 0: none).
	Tenants int
	// Keys makes them sequenced items over that many keys ("key-N", in
	// enqueue order; 0: not sequenced). The queue's row must say so
	// (crdbwork_queues.sequenced) for the claims to treat them as such.
	Keys int
	// Claimed claims every Claimed-th item (by the lived sessions in turn,
	// with a lease of five minutes; 0: none). With Keys, only items that
	// are the first of their key are claimed.
	Claimed int
	// Deadline gives every seventh item a deadline in ten minutes.
	Deadline bool
}

// Items returns an INSERT of the items g in [from, to] of queue, shaped
// as s says, in enqueue order (g ascending), all vested: a burst seeded in
// one statement. The sessions it claims for are Sessions (Build adds them).
func Items(queue string, from, to int, s ItemShape) string {
	if s.Parts <= 0 {
		s.Parts = 16
	}
	if s.Priorities <= 0 {
		s.Priorities = 5
	}
	key, seq, tenant, expires := "NULL", "NULL", "NULL", "NULL"
	claimed := "false"
	if s.Keys > 0 {
		key = fmt.Sprintf(`'key-' || (g %% %d)::TEXT`, s.Keys)
		seq = "g"
	}
	if s.Tenants > 0 {
		tenant = fmt.Sprintf(`'tenant-' || (g %% %d)::TEXT`, s.Tenants)
	}
	if s.Deadline {
		expires = `CASE WHEN g % 7 = 0 THEN now() + INTERVAL '10 minutes' END`
	}
	if s.Claimed > 0 {
		claimed = fmt.Sprintf(`g %% %d = 0`, s.Claimed)
		if s.Keys > 0 {
			claimed += fmt.Sprintf(` AND g - %d < %d`, from, s.Keys)
		}
	}
	return fmt.Sprintf(`INSERT INTO crdbwork_items (id, queue, part, item_key, priority, vesting_at, turn_at, enqueued_at, seq_order,
    tenant, expires_at, payload, attempts, max_attempts, claim, claim_token, claimed_at, lease_until)
SELECT gen_random_uuid(), '%[1]s', g %% %[4]d, %[6]s, g %% %[5]d,
       now() - INTERVAL '1 hour', now() - INTERVAL '1 hour' + g * INTERVAL '1 microsecond',
       now() - INTERVAL '1 hour' + g * INTERVAL '1 microsecond', %[7]s, %[8]s, %[9]s, '\x00'::BYTEA,
       CASE WHEN %[10]s THEN 1 ELSE 0 END, 25,
       CASE WHEN %[10]s THEN (%[11]s)[g %% 16 + 1] END,
       CASE WHEN %[10]s THEN 1 ELSE 0 END,
       CASE WHEN %[10]s THEN now() END,
       CASE WHEN %[10]s THEN now() + INTERVAL '5 minutes' END
FROM generate_series(%[2]d, %[3]d) AS g`, queue, from, to, s.Parts, s.Priorities, key, seq, tenant, expires, claimed, SessionArray())
}
