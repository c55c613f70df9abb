package sql_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
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
	pool, sessions, sessionArray, postgres := hotPlanSetup(t, "q", "other")
	ctx := context.Background()
	// items seeds the items g in [from, to] of queue: over 16 parts and 5
	// priorities, each with one of 1,000 tenants, in turn order; claimed
	// (by the 16 sessions in turn, with a lease) where g % 10 = 1.
	items := func(queue string, from, to int) string {
		return fmt.Sprintf(`INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, turn_at, tenant, payload,
    attempts, max_attempts, claim, claim_token, claimed_at, lease_until)
SELECT gen_random_uuid(), '%[3]s', g %% 16, g %% 5,
       now() - INTERVAL '1 hour', now() + g * INTERVAL '1 microsecond', 'tenant-' || (g %% 1000)::TEXT, '\x00'::BYTEA,
       CASE WHEN g %% 10 = 1 THEN 1 ELSE 0 END, 3,
       CASE WHEN g %% 10 = 1 THEN (%[4]s)[g %% 16 + 1] END,
       CASE WHEN g %% 10 = 1 THEN 1 ELSE 0 END,
       CASE WHEN g %% 10 = 1 THEN now() END,
       CASE WHEN g %% 10 = 1 THEN now() + INTERVAL '5 minutes' END
FROM generate_series(%[1]d, %[2]d) AS g`, from, to, queue, sessionArray)
	}
	analyze := []string{`ANALYZE crdbwork_items`, `ANALYZE crdbwork_ended`, `ANALYZE crdbwork_dead_items`}
	fill := []string{items("q", 1, 40000), `INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
SELECT 'q', gen_random_uuid(), now() - g * INTERVAL '1 second', 'acked' FROM generate_series(1, 20000) AS g`}
	states := []struct {
		name string
		prep []string
	}{
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
	for n, st := range states {
		for _, s := range st.prep {
			if _, err := pool.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v\n%s", st.name, err, s)
			}
		}
		cases := hotCases(t, pool, sessions[0])
		explainEach(t, pool, fmt.Sprintf("queues_%d_", n), cases, nil, func(i int, mode, plan string) {
			c := cases[i]
			msg := hotPlanProblem(c.name, plan, postgres)
			if why, known := knownFlips[fmt.Sprintf("%d %s (%s)", n, c.name, mode)]; postgres && known && msg != "" {
				t.Logf("known: %s, %s (%s): %s (%s)", st.name, c.name, mode, msg, why)
				return
			}
			if msg != "" {
				t.Errorf("%s, %s (%s): %s:\n%s", st.name, c.name, mode, msg, plan)
			}
		})
	}
}

// knownFlips are the plans TestHotPlansWhenTheStatisticsMissAQueue finds
// changed on PostgreSQL 15, by state number, statement and plan mode, with
// what they read instead. They are open work (issue #19, third goal).
var knownFlips = map[string]string{
	"0 EnqueueInsert (custom)": "the dedup probe per row reads the queue's ended ids through crdbwork_ended_by_age, " +
		"which the statistics say holds none of the queue's",
	"1 AckMany (512) (custom)":    "a sequential scan of a table believed empty, joined to the 512 keys",
	"1 ClaimAny (generic)":        "a bitmap scan of crdbwork_items_part_turn and a sort of the queue's unclaimed items",
	"1 ClaimAny (1000) (generic)": "a bitmap scan of crdbwork_items_part_turn and a sort of the queue's unclaimed items",
	"1 ClaimUrgent (generic)":     "a bitmap scan of crdbwork_items_part_turn and a sort",
	"1 FairHead (generic)":        "a bitmap scan of crdbwork_items_part_turn and a sort",
	"1 Probe (generic)":           "a bitmap scan of crdbwork_items_part_turn and a sort",
	"1 FairFront (generic)":       "a bitmap scan of crdbwork_items_part_turn and a sort",
}
