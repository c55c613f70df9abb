package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/lived"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// stableRows is the size of the large state of TestHotPlansInEveryState: a
// million items, which the test seeds in about ten seconds here.
const stableRows = 1000000

// TestHotPlansInEveryState EXPLAINs every hot statement (the claims, acks,
// nacks, releases, extends, the reaper's batches, the enqueue and the fair
// reads) in each state a table goes through, whatever moment ANALYZE ran
// at, and requires the same index-backed shape in all of them:
//
//   - empty: a fresh schema, never analyzed;
//   - filled after ANALYZE of the empty table: 20k items, 2k of them
//     claimed, with statistics that say the table is empty;
//   - claimed after ANALYZE: the statistics were taken while no item was
//     claimed, then 2k were claimed (the partial indexes over claimed items
//     look empty to the planner: the ack's plan in issue #19 read every
//     claimed item through crdbwork_items_lease);
//   - 1M rows, stale statistics: a million items, a tenth claimed, with the
//     statistics of the 20k-item table;
//   - 1M rows, analyzed.
//
// Autovacuum is off for the tables, so that no ANALYZE runs but the test's.
// On PostgreSQL each state is checked with the plan for the given
// parameters and with the generic plan a prepared statement settles on.
func TestHotPlansInEveryState(t *testing.T) {
	t.Parallel()
	sessionArray := lived.SessionArray()
	// items seeds the items g in [from, to]: every tenth in queue "other",
	// spread over 16 parts and 5 priorities, a third with a tenant, a
	// seventh with a deadline, a few exhausted; claimed (by the 16 sessions
	// in turn, with a lease) where the condition on g holds.
	items := func(from, to int, claimed string) string {
		return fmt.Sprintf(`INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, turn_at, tenant, expires_at, payload,
    attempts, max_attempts, claim, claim_token, claimed_at, lease_until)
SELECT gen_random_uuid(), CASE WHEN g %% 10 = 0 THEN 'other' ELSE 'q' END, g %% 16, g %% 5,
       now() - g * INTERVAL '1 millisecond', now() - g * INTERVAL '1 millisecond',
       CASE WHEN g %% 3 = 0 THEN 'tenant-' || (g %% 1000)::TEXT END,
       CASE WHEN g %% 7 = 0 THEN now() + (g %% 100 - 10) * INTERVAL '1 second' END, '\x00'::BYTEA,
       CASE WHEN %[3]s THEN 1 WHEN g %% 997 = 0 THEN 3 ELSE 0 END, 3,
       CASE WHEN %[3]s THEN (%[4]s)[g %% 16 + 1] END,
       CASE WHEN %[3]s THEN 1 ELSE 0 END,
       CASE WHEN %[3]s THEN now() END,
       CASE WHEN %[3]s THEN now() + (g %% 600 - 60) * INTERVAL '1 second' END
FROM generate_series(%[1]d, %[2]d) AS g`, from, to, claimed, sessionArray)
	}
	ended := func(from, to int) string {
		return fmt.Sprintf(`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
SELECT CASE WHEN g %% 6 = 0 THEN 'other' ELSE 'q' END, gen_random_uuid(), now() - g * INTERVAL '1 second', 'acked'
FROM generate_series(%d, %d) AS g`, from, to)
	}
	// edges seeds n edges of queue q from items of q (so that the acks'
	// check of their dependents finds some) or from random ids.
	edges := func(n int, fromItems bool) string {
		if fromItems {
			return fmt.Sprintf(`INSERT INTO crdbwork_waits_for (queue, prereq, dependent)
SELECT 'q', id, gen_random_uuid() FROM crdbwork_items WHERE queue = 'q' ORDER BY id LIMIT %d`, n)
		}
		return fmt.Sprintf(`INSERT INTO crdbwork_waits_for (queue, prereq, dependent)
SELECT CASE WHEN g %% 4 = 0 THEN 'other' ELSE 'q' END, gen_random_uuid(), gen_random_uuid() FROM generate_series(1, %d) AS g`, n)
	}
	analyze := []string{`ANALYZE crdbwork_items`, `ANALYZE crdbwork_ended`, `ANALYZE crdbwork_dead_items`, `ANALYZE crdbwork_waits_for`}
	states := []struct {
		name string
		prep []string
	}{
		{"empty", nil},
		{"filled after ANALYZE of the empty table", append(append([]string{}, analyze...),
			items(1, 20000, "g % 10 = 1"), ended(1, 20000), edges(5000, true))},
		{"claimed after ANALYZE", append(append([]string{
			`UPDATE crdbwork_items SET claim = NULL, claim_queue = NULL, claim_part = NULL, claimed_at = NULL, lease_until = NULL, attempts = 0 WHERE claim IS NOT NULL`},
			analyze...),
			`UPDATE crdbwork_items SET claim = (`+sessionArray+`)[part + 1], claim_token = claim_token + 1, attempts = attempts + 1,
    claimed_at = now(), lease_until = now() + (part * 10 - 30) * INTERVAL '1 second'
WHERE queue = 'q' AND attempts = 0 AND id IN (SELECT id FROM crdbwork_items WHERE queue = 'q' ORDER BY id LIMIT 2000)`)},
		{fmt.Sprintf("%dk rows, stale statistics", stableRows/1000), []string{
			items(20001, stableRows, "g % 10 = 1"), ended(20001, 120000), edges(100000, false)}},
		{fmt.Sprintf("%dk rows, analyzed", stableRows/1000), analyze},
	}
	// Each state of 20k items is a template built on the one before it
	// (testdb.NewFromSteps: a copy keeps the statistics and dead tuples of
	// the state it copies), checked by its own parallel subtest; the large
	// states are built from a copy of the last of them by the last subtest,
	// which checks both in turn (copying a million items would cost more than
	// inserting them, and no other test reads them).
	steps := []testdb.Step{hotPlanStep("q")}
	for n, st := range states {
		if n > 0 {
			steps = append(steps, testdb.Step{Key: st.name, Build: func(ctx context.Context, pool *pgxpool.Pool) error {
				for _, s := range st.prep {
					if _, err := pool.Exec(ctx, s); err != nil {
						return fmt.Errorf("%s: %w\n%s", st.name, err, s)
					}
				}
				return nil
			}})
		}
	}
	const small = 3 // the states of 20k items
	check := func(t *testing.T, pool *pgxpool.Pool, n int) {
		st := states[n]
		sessions := lived.Sessions()
		postgres := testdb.Kind(t) == "postgres"
		cases := hotCases(t, pool, sessions[0])
		explainEach(t, pool, fmt.Sprintf("stable_%d_", n), cases, nil, func(i int, mode, plan string) {
			c := cases[i]
			msg := hotPlanProblem(c.name, plan, postgres)
			if postgres && c.name == "ClaimPicked" && st.name == "empty" && msg == "a sequential scan of crdbwork_items" {
				// On a table PostgreSQL believes tiny (never analyzed,
				// empty), scanning it is the cheapest way to find the
				// picked rows, and right. Store.ItemsClaimPicked never lets
				// such a plan outlive the table's size: it is planned at
				// every run (QueryExecModeDescribeExec, no cached generic plan),
				// and a never-analyzed table's size is read from its
				// files; the other states check its plan on large tables.
				t.Logf("%s, %s (%s): %s (a table believed empty; ClaimPicked is planned per run)", st.name, c.name, mode, msg)
				return
			}
			if msg != "" {
				t.Errorf("%s, %s (%s): %s:\n%s", st.name, c.name, mode, msg, plan)
			}
		})
	}
	for n := range small {
		t.Run(states[n].name, func(t *testing.T) {
			t.Parallel()
			check(t, testdb.NewFromSteps(t, steps[:n+1]...), n)
		})
	}
	t.Run("large", func(t *testing.T) {
		t.Parallel()
		pool := testdb.NewFromSteps(t, steps[:small]...)
		ctx := context.Background()
		for n := small; n < len(states); n++ {
			start := time.Now()
			for _, s := range states[n].prep {
				if _, err := pool.Exec(ctx, s); err != nil {
					t.Fatalf("%s: %v\n%s", states[n].name, err, s)
				}
			}
			t.Logf("state %q prepared in %v", states[n].name, time.Since(start).Round(time.Millisecond))
			check(t, pool, n)
		}
	})
}

// hotPlanStep is the first state of the hot-plan tests (testdb.Step, the
// template the other states are built on): the schema, 16 live sessions
// (those of a lived database, internal/lived: lived.Items claims for them)
// and the given fair queues, with autovacuum off for the tables on
// PostgreSQL (so that no ANALYZE runs but the test's).
func hotPlanStep(queues ...string) testdb.Step {
	return testdb.Step{
		Key: "hot plans: schema, 16 sessions, fair queues " + strings.Join(queues, ", "),
		Build: func(ctx context.Context, pool *pgxpool.Pool) error {
			if err := applySchema(ctx, pool); err != nil {
				return err
			}
			for _, s := range lived.Sessions() {
				if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_sessions (id, expiry) VALUES ($1, INTERVAL '1 hour')`, s); err != nil {
					return err
				}
			}
			for _, q := range queues {
				if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_queues (name, fair) VALUES ($1, true)`, q); err != nil {
					return err
				}
			}
			dialect, err := store.DetectDialect(ctx, pool)
			if err != nil {
				return err
			}
			if dialect == store.Postgres {
				for _, table := range []string{"crdbwork_items", "crdbwork_ended", "crdbwork_dead_items", "crdbwork_sessions", "crdbwork_queues", "crdbwork_waits_for"} {
					if _, err := pool.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
}

// hotPlanSetup returns a fresh database of the test in hotPlanStep's state
// (a copy of its template), the sessions, an SQL array literal of them,
// and whether the server is PostgreSQL.
func hotPlanSetup(t *testing.T, queues ...string) (*pgxpool.Pool, []uuid.UUID, string, bool) {
	t.Helper()
	pool := testdb.NewFromSteps(t, hotPlanStep(queues...))
	return pool, lived.Sessions(), lived.SessionArray(), testdb.Kind(t) == "postgres"
}

// hotCases are the hot statements (the reaper's by-id steps, which run only
// when a batch fails, and the enqueue's Found, which runs only when an
// enqueue skipped ids, are left to TestStatementPlansUseIndexes) with arguments for the table's current
// rows: the keys of up to 512 items session holds (random ids where it
// holds fewer).
func hotCases(t *testing.T, pool *pgxpool.Pool, session uuid.UUID) []planCase {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT id, claim_token FROM crdbwork_items WHERE claim = $1 LIMIT 512`, session)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, 0, 512)
	tokens := make([]int64, 0, 512)
	var id uuid.UUID
	var token int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &token}, func() error {
		ids, tokens = append(ids, id), append(tokens, token)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for len(ids) < 512 {
		ids, tokens = append(ids, uuid.New()), append(tokens, 1)
	}
	holders := make([]uuid.UUID, len(ids))
	for i := range holders {
		holders[i] = session
	}
	dialect, err := store.DetectDialect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	st := store.NewStatements(crsql.Tables{})
	ds := st.ForDialect(dialect)
	parts := store.NewPartClaimStatements(crsql.Tables{})
	deaths := store.NewDeathStatements(crsql.Tables{})
	fair := store.NewFairStatements(crsql.Tables{})
	es := store.NewEnqueueStatements(crsql.Tables{})
	dedup := store.NewDedupStatements(crsql.Tables{})
	urgent := store.NewUrgentStatements(crsql.Tables{}).ForDialect(dialect)
	pick := []any{"q", 64, []string{}}
	for p := range store.MaxPartBranches {
		pick = append(pick, int64(p))
	}
	// An enqueue of 64 rows, half of them ids that may have ended.
	var endedIDs []uuid.UUID
	rows, err = pool.Query(ctx, `SELECT id FROM crdbwork_ended WHERE queue = 'q' LIMIT 32`)
	if err != nil {
		t.Fatal(err)
	}
	if endedIDs, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil {
		t.Fatal(err)
	}
	enqueueIDs := append([]uuid.UUID{}, endedIDs...)
	for len(enqueueIDs) < 64 {
		enqueueIDs = append(enqueueIDs, uuid.New())
	}
	n64 := make([]int64, 64)
	texts, payloads := make([]string, 64), make([][]byte, 64)
	amo, turns := make([]bool, 64), make([]*time.Time, 64)
	for i := range texts {
		texts[i], payloads[i], n64[i] = fmt.Sprint("k", i), []byte{0}, int64(i)
	}
	lease := int64(300e6)
	enqueueInsert := es.Insert
	if dialect == store.Postgres {
		enqueueInsert = es.PostgresInsert
	}
	cs := store.CancelStatementsForTest(crsql.Tables{})
	cases := []planCase{
		{"ClaimAny", ds.ClaimAny, []any{session, "q", 64, lease, []string{}}},
		{"ClaimAny (1000)", ds.ClaimAny, []any{session, "q", 1000, lease, []string{}}},
		{"ClaimParts", parts.Claim(dialect, 4), []any{session, "q", 64, lease, []string{}, int64(3), int64(4), int64(5), int64(6)}},
		{"ClaimParts (one part)", parts.Claim(dialect, 1), []any{session, "q", 64, lease, []string{}, int64(7)}},
		{"ClaimParts (shares)", parts.ClaimShares(dialect, 4), []any{session, "q", 128, lease, []string{}, int64(3), int64(4), int64(5), int64(6), int64(48)}},
		{"PickParts", parts.Pick(store.MaxPartBranches), pick},
		{"ClaimPicked", parts.ClaimPickedFor(dialect), []any{session, lease, ids[:64]}},
		{"ClaimUrgent", urgent, []any{session, "q", 64, lease, []string{}, int64(1), false, []string{}, []int64{}}},
		{"AckMany (one item)", ds.AckMany, []any{ids[:1], holders[:1], tokens[:1]}},
		{"AckMany", ds.AckMany, []any{ids[:64], holders[:64], tokens[:64]}},
		{"AckMany (512)", ds.AckMany, []any{ids, holders, tokens}},
		{"TakeAtMostOnce", ds.TakeAtMostOnce, []any{ids[:64], holders[:64], tokens[:64]}},
		{"Extend", ds.Extend, []any{ids[:64], holders[:64], tokens[:64], lease}},
		{"Nack", st.Nack, []any{ids[0], session, tokens[0], int64(1e6), "boom"}},
		{"Release", st.Release, []any{ids[0], session, tokens[0]}},
		{"SaveCheckpoint", store.NewCheckpointStatements(crsql.Tables{}).SaveCheckpoint, []any{ids[0], session, tokens[0], nil}},
		{"SaveProgress", store.NewCheckpointStatements(crsql.Tables{}).SaveProgress, []any{ids[0], session, tokens[0], int64(5), int64(10)}},
		{"Exhaust", deaths.Exhaust, []any{ids[0], session, tokens[0], "boom"}},
		{"DeadLetter", st.DeadLetter, []any{ids[0], session, tokens[0], "boom", "failed"}},
		{"Cancel", st.Cancel, []any{ids[0], "q", "ops", "no longer needed"}},
		{"CancelRequest", cs["Request"], []any{ids[0], "q", "ops", "no longer needed"}},
		{"SessionCancels", cs["SessionCancels"], []any{"q", session, 1000}},
		{"EndCancelled", cs["EndCancelled"], []any{ids[0], session, tokens[0]}},
		{"Snooze", cs["Snooze"], []any{ids[0], session, tokens[0], int64(1e6), int64(100)}},
		{"ReapCancelled", cs["ReapCancelled"], []any{"q", 1000}},
		{"ReapLeases", ds.ReapLeases, []any{"q", 1000}},
		{"ReapExhausted", st.ReapExhausted, []any{"q", 1000, "crash loop"}},
		{"ReapExpired", st.ReapExpired, []any{"q", 1000}},
		{"ExpiredLeaseIDs", deaths.ExpiredLeaseIDs, []any{"q", 1000}},
		{"ExhaustedIDs", deaths.ExhaustedIDs, []any{"q", 1000}},
		{"ExpiredIDs", deaths.ExpiredIDs, []any{"q", 1000}},
		{"PruneEnded", dedup.PruneEnded, []any{"q", 1000}},
		{"EnqueueInsert", enqueueInsert, []any{"q", enqueueIDs, n64, texts, n64, n64, n64, payloads, payloads, texts, n64, amo, turns, n64, texts, n64, texts}},
		{"FairLasts", fair.Lasts(3), []any{"q", "tenant-3", int64(0), "tenant-6", int64(1), "new", int64(2)}},
		{"FairHead", ds.FairHead, []any{"q", int64(1)}},
		{"Probe", store.ProbeText(crsql.Tables{}, dialect), []any{"q", store.ProbeLimit}},
		{"FairFront", store.FairFrontText(store.New(crsql.Tables{}), dialect), []any{"q", int64(1), int64(16)}},
		// Every session's queue reap turn, every few heartbeats: its test
		// of whether the reap has work is one seek per step's index.
		{"TakeQueueReapTurn", st.TakeQueueReapTurn, []any{"q", int64(2500000), int64(60000000)}},
	}
	if dialect == store.Postgres { // the pipelined ack runs on PostgreSQL only
		cases = append(cases, planCase{"AckAll (pipelined)", store.AckAllStatement(crsql.Tables{}), []any{ids[:64], holders[:64], tokens[:64], int64(64)}})
	}
	return cases
}

// hotIndexes are the indexes each hot statement must read (on both
// engines, the index's name appears in the plan); the statements not listed
// act on items they name by id, through the primary key.
var hotIndexes = map[string][]string{
	"ClaimAny":              {"crdbwork_items_turn_next"},
	"ClaimAny (1000)":       {"crdbwork_items_turn_next"},
	"ClaimUrgent":           {"crdbwork_items_turn_next"},
	"ClaimParts":            {"crdbwork_items_part_turn"},
	"ClaimParts (one part)": {"crdbwork_items_part_turn"},
	"ClaimParts (shares)":   {"crdbwork_items_part_turn"},
	"PickParts":             {"crdbwork_items_part_turn"},
	"ReapLeases":            {"crdbwork_items_lease"},
	"ExpiredLeaseIDs":       {"crdbwork_items_lease"},
	"ReapExhausted":         {"crdbwork_items_exhausted"},
	"ExhaustedIDs":          {"crdbwork_items_exhausted"},
	"ReapExpired":           {"crdbwork_items_expiry"},
	"ExpiredIDs":            {"crdbwork_items_expiry"},
	"PruneEnded":            {"crdbwork_ended_by_age"},
	"EnqueueInsert":         {"crdbwork_ended_pkey"},
	"FairLasts":             {"crdbwork_items_tenant_turn"},
	"FairHead":              {"crdbwork_items_turn_next"},
	"Probe":                 {"crdbwork_items_turn_next"},
	"SessionCancels":        {"crdbwork_items_cancel_requested"},
	"ReapCancelled":         {"crdbwork_items_cancel_requested"},
	"FairFront":             {"crdbwork_items_turn_next"},
	"TakeQueueReapTurn":     {"crdbwork_items_lease", "crdbwork_items_expiry", "crdbwork_items_cancel_requested"},
	"QueuePrunesDue":        {"crdbwork_items_exhausted", "crdbwork_ended_by_age", "crdbwork_cancelled_items_by_age", "crdbwork_attempt_errors_by_age", "crdbwork_dead_items_by_queue"},
}

// hotPlanProblem says what is wrong with a hot statement's plan ("" if
// nothing): a sequential (full) scan of a large table, a missing index, or,
// for the statements that act on items by id, a read through anything but
// the primary key (a secondary index over claimed items holds every item
// some session holds, and a merge join reads all of them).
func hotPlanProblem(name, plan string, postgres bool) string {
	for _, table := range []string{"crdbwork_items", "crdbwork_ended", "crdbwork_dead_items", "crdbwork_waits_for"} {
		if strings.Contains(plan, "Seq Scan on "+table) {
			return "a sequential scan of " + table
		}
	}
	if postgres && strings.HasPrefix(name, "AckMany") && (!strings.Contains(plan, "crdbwork_waits_for_pkey") || strings.Contains(plan, "hashed SubPlan")) {
		// Its check of the acked items' dependents: a primary-key seek of
		// the edges per acked item.
		return "it does not look each acked item's edges up by primary key"
	}
	if strings.Contains(plan, "FULL SCAN") || strings.Contains(plan, "full scan") {
		return "a full scan"
	}
	want, ok := hotIndexes[name]
	if !ok {
		want = []string{"crdbwork_items_pkey"}
		if postgres && (strings.Contains(plan, "crdbwork_items_claimed") || strings.Contains(plan, "crdbwork_items_lease") || strings.Contains(plan, "Merge")) {
			return "it reads the items of a statement that names them by id through an index of claimed items or a merge"
		}
	}
	if postgres && name == "EnqueueInsert" && strings.Contains(plan, "crdbwork_ended_by_age") {
		// The dedup check as a join over the queue's ended ids (the
		// planner's choice while crdbwork_ended looked empty, before
		// postgresDedupCheck): it must look each id up by primary key.
		return "its dedup check reads the queue's ended ids through crdbwork_ended_by_age"
	}
	if !postgres {
		return "" // CockroachDB's plans name indexes as table@index: checked by the scans above
	}
	for _, index := range want {
		if !strings.Contains(plan, index) {
			return "it does not read " + index
		}
	}
	return ""
}
