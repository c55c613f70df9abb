package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/lived"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestHotPlansWhenTheStatisticsMissAQueue checks the hot statements'
// plans in two states that TestHotPlansInEveryState does not reach, both
// common in a database that several queues share or whose queue drains
// and fills again:
//
//   - queue "q" filled after an ANALYZE that saw only another queue's
//     items: the statistics say "q" holds next to nothing (it is not among
//     the most common values), and then it got 40k items of 1,000 tenants,
//     a tenth of them claimed;
//   - the table drained (every item ended: its pages stay, their rows
//     dead), analyzed, and filled again: PostgreSQL believes the table holds
//     no row at all until the next ANALYZE, however many pages it has.
//
// On PostgreSQL some statements do change their plans there (knownFlips):
// they are logged, not failed, so that every other statement is held to its
// plan in both states; each is a case of issue #19's third goal still open.
// Autovacuum ends the second state within about a minute of the refill
// (an ANALYZE after 50 changed rows of a table believed empty;
// docs/operations.md).
func TestHotPlansWhenTheStatisticsMissAQueue(t *testing.T) {
	t.Parallel()
	pool, sessions, _, postgres := hotPlanSetup(t, "q", "other")
	items := func(queue string, from, to int) string {
		return lived.Items(queue, from, to, lived.ItemShape{Tenants: 1000, Claimed: 10})
	}
	analyze := []string{`ANALYZE crdbwork_items`, `ANALYZE crdbwork_ended`, `ANALYZE crdbwork_dead_items`}
	fill := []string{items("q", 1, 40000), `INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
SELECT 'q', gen_random_uuid(), now() - g * INTERVAL '1 second', 'acked' FROM generate_series(1, 20000) AS g`}
	states := []queueState{
		{"q filled after ANALYZE while another queue held the items", slices.Concat([]string{items("other", 1, 100000),
			`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
SELECT 'other', gen_random_uuid(), now() - g * INTERVAL '1 second', 'acked' FROM generate_series(1, 20000) AS g`},
			analyze, fill)},
		// The table keeps its pages when its items end (until a VACUUM
		// FULL), and an ANALYZE then finds no live row in them: PostgreSQL
		// believes every queue holds about one item, however many it has.
		{"filled again after ANALYZE of the drained table", slices.Concat(
			[]string{`DELETE FROM crdbwork_items`, `DELETE FROM crdbwork_ended`}, analyze, fill)},
	}
	checkQueueStates(t, pool, sessions, postgres, "queues", states)
	if postgres {
		// The second state is one the workers end (claim.Queue.
		// RefreshStatistics): both tables hold rows the statistics do not
		// know of. The server counts them as the backends report them,
		// within seconds.
		analyzeBehind(t, pool, []string{`"crdbwork_ended"`, `"crdbwork_items"`})
		checkQueueStates(t, pool, sessions, postgres, "refilled", []queueState{{"filled again, analyzed as StatisticsBehind asked", nil}})
	}
}

// analyzeBehind waits until Store.StatisticsBehind lists the tables want
// (the server counts the changes as the backends report them: at once here,
// as checkQueueStates flushes them after each statement), then analyzes
// them, as claim.Queue.RefreshStatistics would.
func analyzeBehind(t *testing.T, pool *pgxpool.Pool, want []string) {
	t.Helper()
	ctx := context.Background()
	stmts := store.New(crsql.Tables{})
	var behind []string
	await.Until(t, fmt.Sprintf("StatisticsBehind to list %q", want), func() (bool, string) {
		var err error
		if behind, err = stmts.StatisticsBehind(ctx, pool, 5000, 1<<20); err != nil {
			t.Fatal(err)
		}
		slices.Sort(behind)
		return slices.Equal(behind, want), fmt.Sprintf("%q; %s", behind, tableCounts(ctx, pool))
	})
	for _, table := range behind {
		if err := stmts.StatisticsAnalyze(ctx, pool, table); err != nil {
			t.Fatal(err)
		}
	}
	if behind, err := stmts.StatisticsBehind(ctx, pool, 5000, 1<<20); err != nil || len(behind) != 0 {
		t.Fatalf("after ANALYZE: StatisticsBehind = %q, %v; want none", behind, err)
	}
}

// TestHotPlansBeforeTheFirstAnalyze checks the hot statements' plans on a
// table never analyzed that holds a queue's backlog: the first minute of
// every new deployment and of every benchmark run, until autovacuum's first
// ANALYZE. Without statistics PostgreSQL estimates every condition at its
// default selectivity, every scan of a partial index at about one row, and
// picks among the indexes with the statement's leading columns by their
// heights: here the claims in parts mode walk crdbwork_items_turn_next, the
// whole queue's index, filtering the part (knownFlips); in the fairness
// benchmark the fair enqueue's read of a tenant's last turn walked it
// backwards past 14k entries, 13 ms a call (issue #19). No statement text
// can outweigh estimates that equal: the fix is statistics, and
// Store.StatisticsBehind must find the table (workers then analyze it:
// claim.Queue.RefreshStatistics). Once analyzed, every plan is as written.
func TestHotPlansBeforeTheFirstAnalyze(t *testing.T) {
	t.Parallel()
	pool, sessions, _, postgres := hotPlanSetup(t, "q")
	// A fair queue's backlog as the fairness benchmark enqueues it: 200
	// tenants, one priority, nothing claimed yet.
	fill := queueState{"filled, never analyzed", []string{`INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, turn_at, tenant, payload, max_attempts)
SELECT gen_random_uuid(), 'q', g % 16, 0, now(), now() + g * INTERVAL '1 microsecond', 'tenant-' || lpad((g % 200)::TEXT, 4, '0'), '\x00'::BYTEA, 3
FROM generate_series(1, 20000) AS g`}}
	checkQueueStates(t, pool, sessions, postgres, "first", []queueState{fill})
	if !postgres {
		return // StatisticsBehind reads PostgreSQL's catalogs
	}
	analyzeBehind(t, pool, []string{`"crdbwork_items"`}) // the ended ids are empty
	checkQueueStates(t, pool, sessions, postgres, "analyzed", []queueState{{"analyzed as StatisticsBehind asked", nil}})
}

// tableCounts is what the server knows of the items and ended ids: rows
// and pages in the statistics, live and dead rows counted since.
func tableCounts(ctx context.Context, pool *pgxpool.Pool) string {
	rows, err := pool.Query(ctx, `SELECT c.relname, c.reltuples, c.relpages, s.n_live_tup, s.n_dead_tup, s.n_mod_since_analyze, pg_relation_size(c.oid)
FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.relname IN ('crdbwork_items', 'crdbwork_ended') ORDER BY c.relname`)
	if err != nil {
		return err.Error()
	}
	var out []string
	for rows.Next() {
		var name string
		var reltuples float64
		var relpages, live, dead, mod, size int64
		if err := rows.Scan(&name, &reltuples, &relpages, &live, &dead, &mod, &size); err != nil {
			return err.Error()
		}
		out = append(out, fmt.Sprintf("%s: reltuples %.0f, relpages %d, live %d, dead %d, changed since ANALYZE %d, %d bytes", name, reltuples, relpages, live, dead, mod, size))
	}
	if err := rows.Err(); err != nil {
		return err.Error()
	}
	return strings.Join(out, "; ")
}

// queueState is a state of the tables: its name and the statements that
// bring the tables to it from the previous state.
type queueState struct {
	name string
	prep []string
}

// checkQueueStates brings the tables to each state in turn and checks every
// hot statement's plan there; a plan in knownFlips (keyed by prefix and
// state number) is logged, not failed.
func checkQueueStates(t *testing.T, pool *pgxpool.Pool, sessions []uuid.UUID, postgres bool, prefix string, states []queueState) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for n, st := range states {
		// On one connection that reports its changes to the server's
		// statistics after each statement, as a backend does within a second
		// (an ANALYZE that comes before the counts of the changes it saw is
		// then followed by them, and the server's row count goes wrong).
		for _, s := range st.prep {
			if _, err := conn.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v\n%s", st.name, err, s)
			}
			if postgres {
				if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
					t.Fatal(err)
				}
			}
		}
		cases := hotCases(t, pool, sessions[0])
		explainEach(t, pool, fmt.Sprintf("%s_%d_", prefix, n), cases, nil, func(i int, mode, plan string) {
			c := cases[i]
			msg := hotPlanProblem(c.name, plan, postgres)
			if why, known := knownFlips[fmt.Sprintf("%s %d %s (%s)", prefix, n, c.name, mode)]; postgres && known && msg != "" {
				t.Logf("known: %s, %s (%s): %s (%s)", st.name, c.name, mode, msg, why)
				return
			}
			if msg != "" {
				t.Errorf("%s, %s (%s): %s:\n%s", st.name, c.name, mode, msg, plan)
			}
		})
	}
}

// partsWalkQueue is what the claims in parts mode read on a table never
// analyzed.
const partsWalkQueue = "crdbwork_items_turn_next, the queue's index, filtering each part: no statistics, and the two indexes look alike"

// pruneHashes is the plan of PruneEnded once the refilled table is
// analyzed: a plan for its size, not a flip of statistics.
const pruneHashes = "20,000 ended ids, all the queue's: the delete of a batch of 1,000 ids hashes the table " +
	"(a sequential scan of 20k rows) rather than seeking each id; on a larger table it seeks (TestHotPlansInEveryState)"

// knownFlips are the plans TestHotPlansWhenTheStatisticsMissAQueue and
// TestHotPlansBeforeTheFirstAnalyze find changed on PostgreSQL 15, by the
// states' prefix and number, statement and plan mode, with what they read
// instead. The states "first 0" and "queues 1" are ones the workers end
// (claim.Queue.RefreshStatistics), and the tests check every plan again once
// the tables are analyzed as it would; "refilled 0" (a plan for the
// table's size) stays. "queues 0" (statistics per queue) has none left: it
// is the state of a database that has lived, where every hot statement
// must keep its plan (TestHotPlansInALivedDatabase).
var knownFlips = map[string]string{
	"refilled 0 PruneEnded (custom)":          pruneHashes,
	"refilled 0 PruneEnded (generic)":         pruneHashes,
	"first 0 ClaimParts (custom)":             partsWalkQueue,
	"first 0 ClaimParts (one part) (custom)":  partsWalkQueue,
	"first 0 ClaimParts (shares) (custom)":    partsWalkQueue,
	"first 0 PickParts (custom)":              partsWalkQueue,
	"first 0 ClaimParts (generic)":            partsWalkQueue,
	"first 0 ClaimParts (one part) (generic)": partsWalkQueue,
	"first 0 ClaimParts (shares) (generic)":   partsWalkQueue,
	"first 0 PickParts (generic)":             partsWalkQueue,
	"queues 1 AckMany (512) (custom)":         "a sequential scan of a table believed empty, joined to the 512 keys",
	"queues 1 ClaimAny (generic)":             "a bitmap scan of crdbwork_items_part_turn and a sort of the queue's unclaimed items",
	"queues 1 ClaimAny (1000) (generic)":      "a bitmap scan of crdbwork_items_part_turn and a sort of the queue's unclaimed items",
	"queues 1 ClaimUrgent (generic)":          "a bitmap scan of crdbwork_items_part_turn and a sort",
	"queues 1 FairHead (generic)":             "a bitmap scan of crdbwork_items_part_turn and a sort",
	"queues 1 Probe (generic)":                "a bitmap scan of crdbwork_items_part_turn and a sort",
	"queues 1 FairFront (generic)":            "a bitmap scan of crdbwork_items_part_turn and a sort",
	"queues 1 ClaimAny (custom)":              claimOrderAsGeneric,
	"queues 1 ClaimAny (1000) (custom)":       claimOrderAsGeneric,
	"queues 1 ClaimUrgent (custom)":           claimOrderAsGeneric,
	"queues 1 FairHead (custom)":              claimOrderAsGeneric,
	"queues 1 Probe (custom)":                 claimOrderAsGeneric,
	"queues 1 FairFront (custom)":             claimOrderAsGeneric,
}

// claimOrderAsGeneric is what the reads in claim order do, for the given
// queue, in a table believed empty: what their generic plans do there. On
// PostgreSQL they compare the queue with a value the planner cannot see
// (sql.pgClaimOrder), so that no estimate of one queue can flip them in a
// database that has lived (TestHotPlansInALivedDatabase, where the flip
// lasts); the plan for the given queue is then the generic plan, and in a
// table believed empty every index looks as cheap as the other, and a
// sort of one row as cheap as none. A prepared statement ran the generic
// plan here after five runs on a connection anyway (its cost did not
// exceed the custom plans'); the workers end the state within seconds
// (claim.Queue.RefreshStatistics), and "refilled 0" checks the plans after.
const claimOrderAsGeneric = "a bitmap scan of crdbwork_items_part_turn and a sort, as the generic plan: " +
	"the queue is a value the planner cannot see, and a table believed empty makes every index look alike"
