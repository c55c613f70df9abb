package store_test

import (
	"context"
	"regexp"
	"slices"
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

// applySchema installs the schema with the default table names: the
// schema step of testdb.NewLived.
func applySchema(ctx context.Context, pool *pgxpool.Pool) error {
	return crsql.Apply(ctx, pool, crsql.Tables{})
}

// livedOptions are the lived states of this package's tests: the quiet
// queues "q" and "qs" (sequenced) held a handful of items when the
// statistics were taken ("tiny"), or did not exist yet ("empty").
var livedOptions = map[string]lived.Options{"tiny": {Quiet: []string{"q", "qs"}}, "empty": {}}

// TestHotPlansInALivedDatabase checks every hot statement's plan in a
// database that has lived (internal/lived): four other queues with 120k
// items, 120k ended ids, dead items, waiting items and edges, analyzed
// before the queues under test existed, then a third of their rows ended
// and a tenth updated without a VACUUM; and then a burst on the quiet
// queues: "q" (fair, 16 parts: 40k items of 1,000 tenants, a tenth claimed,
// 20k ended ids, 2k dead items, 5k waiting items after 10k of its items) and "qs"
// (sequenced: 20k items over 500 keys). The statistics say both hold next
// to nothing.
//
// Every statement must keep the shape of a per-row seek: the claims
// (plain, parts, shares, urgent, sequenced, the fair heads), the acks and
// nacks, the reaper's batches, the enqueue's dedup probe, the dependency
// release and sweep, retention's prunes, the idle probe and the limits'
// reads; on PostgreSQL, in the plan for the arguments and in the generic
// plan. The reads of a whole queue in claim order (claimOrderProblem) must
// also not let the planner see the queue: a plan for a queue the
// statistics believe holds a handful of items sorted them (the "tiny"
// state). Every hot statement is checked: none is a known exception.
func TestHotPlansInALivedDatabase(t *testing.T) {
	t.Parallel()
	for _, state := range []string{"tiny", "empty"} {
		t.Run("q "+state+" when analyzed", func(t *testing.T) { t.Parallel(); checkLivedPlans(t, state) })
	}
}

// checkLivedPlans checks every hot statement's plan after the burst in a
// lived database of the state ("tiny" or "empty") of livedOptions.
func checkLivedPlans(t *testing.T, state string) {
	pool := livedBurst(t, livedOptions[state])
	postgres := testdb.Kind(t) == "postgres"
	sessions := lived.Sessions()
	cases := append(hotCases(t, pool, sessions[0]), livedCases(t, pool, sessions[0])...)
	explainEach(t, pool, "lived_", cases, nil, func(i int, mode, plan string) {
		c := cases[i]
		msg := livedPlanProblem(c.name, plan, postgres)
		if why, ok := livedAccepted[c.name+" ("+mode+")"]; ok && msg != "" {
			t.Logf("accepted (%s): %s (%s): %s", why, c.name, mode, msg)
			return
		}
		if msg != "" {
			t.Errorf("lived, %s (%s): %s:\n%s", c.name, mode, msg, plan)
			return
		}
		t.Logf("%s (%s):\n%s", c.name, mode, plan)
	})
}

// livedBurst returns a copy of the lived database after the burst of
// TestHotPlansInALivedDatabase on its quiet queues "q" and "qs".
func livedBurst(t *testing.T, o lived.Options) *pgxpool.Pool {
	t.Helper()
	pool := testdb.NewLived(t, applySchema, o)
	ctx := context.Background()
	burst := []string{
		`INSERT INTO crdbwork_queues (name, num_parts, fair) VALUES ('q', 16, true)`,
		`INSERT INTO crdbwork_queues (name, num_parts, sequenced) VALUES ('qs', 16, true)`,
		lived.Items("q", 1, 40000, lived.ItemShape{Tenants: 1000, Claimed: 10, Deadline: true}),
		lived.Items("qs", 1, 20000, lived.ItemShape{Keys: 500, Claimed: 2}),
		`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
SELECT 'q', gen_random_uuid(), now() - g * INTERVAL '1 second', 'acked' FROM generate_series(1, 20000) AS g`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason)
SELECT gen_random_uuid(), 'q', g % 16, 0, 1, 1, '\x00'::BYTEA, now() - INTERVAL '41 days', now() - g * INTERVAL '10 minutes', 'failed'
FROM generate_series(1, 2000) AS g`,
	}
	burst = append(burst, lived.Waiting("q", 10000, 5000)...)
	start := time.Now()
	for _, s := range burst {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	t.Logf("burst seeded in %v", time.Since(start).Round(time.Millisecond))
	return pool
}

// livedAccepted are plans that read more than a seek would, and why that
// is right, by statement and mode.
var livedAccepted = map[string]string{
	// The read of a queue's tenant limits returns all of them (a range of
	// the primary key, not a seek per row), once per Refresh per worker.
	// Its generic plan takes a queue's share of the table as one over the
	// number of queues with limits, here one (FairQueue's 1,000): the whole
	// table, which a sequential scan reads as cheaply as the range would.
	"TenantLimits (generic)": "the generic plan believes the queue holds every tenant limit",
}

// livedCases are the statements of the lived plan test beyond hotCases:
// the sequenced claims (queue "qs"), the dependency statements, retention,
// the limits' reads, the enqueue's Found and the reaper's by-id steps, on
// queue "q".
func livedCases(t *testing.T, pool *pgxpool.Pool, session uuid.UUID) []planCase {
	t.Helper()
	ctx := context.Background()
	dialect, err := store.DetectDialect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	ids := func(query string, n int) []uuid.UUID {
		rows, err := pool.Query(ctx, query, n)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil || len(out) != n {
			t.Fatalf("%d ids, %v\n%s", len(out), err, query)
		}
		return out
	}
	// Prerequisites of q's waiting items (the release's arguments), and
	// some of q's claimed items.
	prereqs := ids(`SELECT prereq FROM crdbwork_waits_for WHERE queue = 'q' LIMIT $1`, 64)
	claimed := ids(`SELECT id FROM crdbwork_items WHERE queue = 'q' AND claim IS NOT NULL LIMIT $1`, 64)
	waiting := ids(`SELECT id FROM crdbwork_waiting WHERE queue = 'q' LIMIT $1`, 64)
	seq := store.NewSequenceStatements(crsql.Tables{})
	ds := store.NewDependsStatements(crsql.Tables{}, dialect)
	ret := store.NewRetentionStatements(crsql.Tables{})
	ls := store.NewLimitStatements(crsql.Tables{})
	ms := store.NewMemberStatements(crsql.Tables{})
	deaths := store.NewDeathStatements(crsql.Tables{})
	es := store.NewEnqueueStatements(crsql.Tables{})
	lease := int64(300e6)
	urgent := store.NewUrgentStatements(crsql.Tables{}).ForDialect(dialect)
	// An enqueue of 50 waiting items, each after one of q's items.
	n := 50
	fresh := make([]uuid.UUID, n)
	texts, ints, bytes, bools, jsons := make([]string, n), make([]int64, n), make([][]byte, n), make([]bool, n), make([]string, n)
	for i := range fresh {
		fresh[i], texts[i], bytes[i], ints[i], jsons[i] = uuid.New(), "k", []byte("x"), 1, `{"k": "v"}`
	}
	pruneOlder, pruneBefore := ret.PruneDeadOlder, ret.PruneDeadBefore
	if dialect == store.Postgres {
		pruneOlder, pruneBefore = ret.PostgresPruneDeadOlder, ret.PostgresPruneDeadBefore
	}
	// The edges of those prerequisites, as the release reads them
	// (EdgesFrom): its and the end of dependents' arguments.
	rows, err := pool.Query(ctx, `SELECT prereq, dependent FROM crdbwork_waits_for WHERE queue = 'q' AND prereq = ANY($1) ORDER BY 1, 2 LIMIT 1000`, prereqs)
	if err != nil {
		t.Fatal(err)
	}
	var edgePre, edgeDep []uuid.UUID
	for rows.Next() {
		var p, d uuid.UUID
		if err := rows.Scan(&p, &d); err != nil {
			t.Fatal(err)
		}
		edgePre, edgeDep = append(edgePre, p), append(edgeDep, d)
	}
	if err := rows.Err(); err != nil || len(edgePre) == 0 {
		t.Fatalf("%d edges of the prerequisites, %v", len(edgePre), err)
	}
	outcomes := make([]string, len(prereqs))
	for i := range outcomes {
		outcomes[i] = []string{"dead", "cancelled", "unknown"}[i%3]
	}
	return []planCase{
		{"ClaimUrgent (tenants skipped)", urgent, []any{session, "q", 64, lease, []string{"tenant-3", "tenant-6"}, int64(1), false, []string{"tenant-9"}, []int64{3, 4}}},
		{"ClaimUrgent (every tenant limited)", urgent, []any{session, "q", 64, lease, []string{}, int64(1), true, []string{}, []int64{3, 4}}},
		{"ClaimAny (tenants skipped)", store.NewStatements(crsql.Tables{}).ForDialect(dialect).ClaimAny, []any{session, "q", 64, lease, []string{"tenant-3", "tenant-6"}}},
		{"ClaimAnySequenced", seq.ClaimAnyFor(dialect), []any{session, "qs", 64, lease, []string{}}},
		{"ClaimPartsSequenced", seq.ClaimParts(dialect, 4), []any{session, "qs", 64, lease, []string{}, int64(3), int64(4), int64(5), int64(6)}},
		{"ClaimPartsSequenced (one part)", seq.ClaimParts(dialect, 1), []any{session, "qs", 64, lease, []string{}, int64(7)}},
		{"ClaimUrgentSequenced", seq.ClaimUrgentFor(dialect), []any{session, "qs", 64, lease, []string{}, int64(1), false, []string{}, []int64{}}},
		{"EdgesFrom", ds.EdgesFrom, []any{"q", prereqs, 1000}},
		{"Release (dependents)", ds.Release, []any{"q", edgePre, edgeDep}},
		{"SweepRelease", ds.SweepRelease, []any{"q", edgePre, edgeDep}},
		{"ReleaseAnyway", ds.ReleaseAnyway, []any{"q", edgePre, edgeDep, int64(1)}},
		{"MoveReady", ds.MoveReady, []any{"q", waiting}},
		{"SweepPrereqs", ds.SweepPrereqs, []any{"q", prereqs[0], 1000}},
		{"KillDependents", ds.KillDependents, []any{"q", edgePre, edgeDep, prereqs, outcomes, int64(1)}},
		{"DeleteEdgesTo", ds.DeleteEdgesTo, []any{"q", edgeDep}},
		{"DeleteEdgesGone", ds.DeleteEdgesGone, []any{"q", edgePre, edgeDep}},
		{"InsertWaiting", ds.InsertWaiting, []any{"q", fresh, ints, texts, ints, ints, ints, bytes, bytes, texts, ints, bools, ints, jsons, ints, ints, ints, texts}},
		{"WaitedFor", ds.WaitedFor, []any{"q", prereqs}},
		{"InsertEdges", ds.InsertEdges, []any{"q", fresh, prereqs[:n]}},
		{"HasEdges", ds.HasEdges, []any{"q"}},
		{"HasEdges (a queue without edges)", ds.HasEdges, []any{"qs"}},
		{"Prereqs", ds.Prereqs, []any{"q", waiting[0]}},
		{"Dependents", ds.Dependents, []any{"q", prereqs[0], 100}},
		{"PickWaiting", ds.PickWaiting, []any{"q", 1000}},
		{"Classify", ds.Classify, []any{"q", append(append([]uuid.UUID{}, prereqs[:32]...), claimed[:32]...)}},
		{"PruneDeadOlder", pruneOlder, []any{"q", int64(30 * 24 * 3600e6), 1000}},
		{"PruneDeadBefore", pruneBefore, []any{"q", time.Now().Add(-time.Hour), 1000}},
		{"DeadNewest", ret.DeadNewest, []any{"q", int64(1000), int64(60e6)}},
		{"DeadSince", ret.DeadSince, []any{"q", time.Now().Add(-time.Hour), int64(1001)}},
		{"QueueLimits", ls.QueueLimits, []any{"q"}},
		{"TenantLimits", ls.TenantLimits, []any{"q"}},
		{"LimitSharers", ms.LimitSharers, []any{"q"}},
		{"QueueMembers", ms.QueueMembers, []any{"q"}},
		{"EnqueueFound", es.Found, []any{"q", claimed}},
		{"ReapLeasesIDs", deaths.ReapLeasesIDs, []any{"q", claimed}},
		{"ReapExpiredIDs", deaths.ReapExpiredIDs, []any{"q", claimed}},
	}
}

// livedIndexes are the indexes the statements of livedCases must read on
// PostgreSQL (hotIndexes has those of hotCases).
var livedIndexes = map[string][]string{
	"ClaimAnySequenced":                  {"crdbwork_items_turn_next", "crdbwork_items_sequence_order", "crdbwork_items_sequence_claimed"},
	"ClaimUrgentSequenced":               {"crdbwork_items_turn_next", "crdbwork_items_sequence_order", "crdbwork_items_sequence_claimed"},
	"ClaimPartsSequenced":                {"crdbwork_items_part_turn", "crdbwork_items_sequence_order", "crdbwork_items_sequence_claimed"},
	"ClaimPartsSequenced (one part)":     {"crdbwork_items_part_turn", "crdbwork_items_sequence_order", "crdbwork_items_sequence_claimed"},
	"EdgesFrom":                          {"crdbwork_waits_for_pkey"},
	"Release (dependents)":               {"crdbwork_waiting_pkey"},
	"SweepRelease":                       {"crdbwork_waiting_pkey"},
	"ReleaseAnyway":                      {"crdbwork_waiting_pkey"},
	"KillDependents":                     {"crdbwork_waiting_pkey"},
	"DeleteEdgesTo":                      {"crdbwork_waits_for_by_dependent_prereq"},
	"DeleteEdgesGone":                    {"crdbwork_waiting_pkey"},
	"ClaimUrgent (tenants skipped)":      {"crdbwork_items_turn_next"},
	"ClaimUrgent (every tenant limited)": {"crdbwork_items_turn_next"},
	"ClaimAny (tenants skipped)":         {"crdbwork_items_turn_next"},
	"InsertWaiting":                      {"crdbwork_waiting_pkey"},
	"InsertEdges":                        {"crdbwork_waits_for_pkey"},
	"WaitedFor":                          {"crdbwork_waits_for_pkey"},
	"HasEdges":                           {"crdbwork_waits_for_pkey"},
	"HasEdges (a queue without edges)":   {"crdbwork_waits_for_pkey"},
	"Prereqs":                            {"crdbwork_waits_for_by_dependent_prereq"},
	"Dependents":                         {"crdbwork_waits_for_pkey"},
	"PickWaiting":                        {"crdbwork_waiting_by_queue"},
	"MoveReady":                          {"crdbwork_waiting_pkey"},
	"SweepPrereqs":                       {"crdbwork_waits_for_pkey"},
	"PruneDeadOlder":                     {"crdbwork_dead_items_by_queue", "crdbwork_dead_items_pkey"},
	"PruneDeadBefore":                    {"crdbwork_dead_items_by_queue", "crdbwork_dead_items_pkey"},
	"DeadNewest":                         {"crdbwork_dead_items_by_queue"},
	"DeadSince":                          {"crdbwork_dead_items_by_queue"},
	"TenantLimits":                       {"crdbwork_tenant_limits_pkey"},
	"EnqueueFound":                       {"crdbwork_items_pkey"},
	"ReapLeasesIDs":                      {"crdbwork_items_pkey"},
	"ReapExpiredIDs":                     {"crdbwork_items_pkey"},
}

// livedDepends are the dependency statements of livedCases.
var livedDepends = map[string]bool{"EdgesFrom": true, "Release (dependents)": true, "SweepRelease": true, "ReleaseAnyway": true, "MoveReady": true,
	"SweepPrereqs": true, "KillDependents": true, "DeleteEdgesTo": true, "DeleteEdgesGone": true, "Classify": true,
	"InsertWaiting": true, "InsertEdges": true, "Prereqs": true, "Dependents": true, "WaitedFor": true}

// livedScan is a read of a whole table a hot statement must not make.
var livedScan = regexp.MustCompile(`Seq Scan on crdbwork_(items|ended|dead_items|waiting|waits_for|tenant_limits)\b|FULL SCAN|full scan`)

// livedPlanProblem says what is wrong with a plan in the lived state (""
// if nothing): hotPlanProblem's checks for the statements of hotCases; for
// the others, a read of a whole table, a missing index, or (the sequenced
// claims) a hash of a side of their anti-joins.
func livedPlanProblem(name, plan string, postgres bool) string {
	if msg := claimOrderProblem(name, plan, postgres); msg != "" {
		return msg
	}
	want, ok := livedIndexes[name]
	if !ok && name != "Classify" && name != "KillDependents" && name != "QueueLimits" && name != "LimitSharers" && name != "QueueMembers" {
		return hotPlanProblem(name, plan, postgres)
	}
	if m := livedScan.FindString(plan); m != "" {
		return "a whole-table read: " + m
	}
	if livedDepends[name] {
		// A dependency statement acts on the edges and waiting items of
		// the ids it is given: reading them by queue alone reads every
		// edge or waiting item of the queue.
		for _, index := range []string{"crdbwork_waits_for_pkey", "crdbwork_waits_for_by_dependent_prereq", "crdbwork_waiting_by_queue"} {
			for _, cond := range indexConds(plan, index) {
				if !strings.Contains(cond, "prereq") && !strings.Contains(cond, "dependent") && !strings.Contains(cond, "id") {
					return "it reads " + index + " by queue alone (" + strings.TrimSpace(cond) + "): every edge or waiting item of the queue"
				}
			}
		}
	}
	if !postgres {
		return ""
	}
	if strings.HasSuffix(name, "Sequenced") || strings.Contains(name, "Sequenced (") {
		if strings.Contains(plan, "Hash") {
			return "it hashes a side of its anti-joins (a scan of every sequenced item)"
		}
		// Each candidate's test must seek its key: a scan of a sequence
		// index by queue alone, the key a join filter, reads every
		// sequenced item of the queue per candidate (issue #29, item 5).
		for _, index := range []string{"crdbwork_items_sequence_order", "crdbwork_items_sequence_claimed"} {
			for _, cond := range indexConds(plan, index) {
				if !strings.Contains(cond, "item_key") {
					return "it reads " + index + " by queue alone (" + strings.TrimSpace(cond) + "), filtering the key: every sequenced item of the queue per candidate"
				}
			}
		}
	}
	for _, index := range want {
		if !strings.Contains(plan, index) {
			return "it does not read " + index
		}
	}
	return ""
}

// claimOrderReads are the name prefixes of the statements that read a
// whole queue in claim order through crdbwork_items_turn_next: the
// any-part claim, the urgent lane's, their sequenced forms, the idle probe
// and the fair heads.
var claimOrderReads = []string{"ClaimAny", "ClaimUrgent", "Probe", "FairHead", "FairFront"}

// sortNode is a sort in a PostgreSQL plan.
var sortNode = regexp.MustCompile(`(?m)(^|-> +)(Incremental )?Sort +\(`)

// claimOrderProblem says what is wrong ("" if nothing) with the
// PostgreSQL plan of a read in claim order (claimOrderReads): it must read
// crdbwork_items_turn_next in order, stopping at its limit (an index scan,
// not a bitmap scan, and no sort), and compare the queue there with a
// value the planner cannot see (an InitPlan's, or the generic plan's
// parameter), so that no estimate of the queue can change the plan: with
// the queue a constant of the plan, the statistics that believed a quiet
// queue held a handful of items made PostgreSQL read them all through
// crdbwork_items_part_turn and sort them (sql.pgClaimOrder).
func claimOrderProblem(name, plan string, postgres bool) string {
	if !postgres || !slices.ContainsFunc(claimOrderReads, func(p string) bool { return strings.HasPrefix(name, p) }) {
		return ""
	}
	if sortNode.MatchString(plan) {
		return "it sorts what it read: not a read in claim order that stops at its limit"
	}
	for _, index := range []string{"crdbwork_items_turn_next", "crdbwork_items_part_turn"} {
		if strings.Contains(plan, "Bitmap Index Scan on "+index) {
			return "a bitmap scan of " + index + ": every entry of the queue, not a read in claim order"
		}
	}
	conds := indexConds(plan, "crdbwork_items_turn_next")
	if len(conds) == 0 {
		return "it does not scan crdbwork_items_turn_next"
	}
	for _, cond := range conds {
		if strings.Contains(cond, "queue = '") {
			return "it compares the queue with a constant of the plan (" + strings.TrimSpace(cond) + "): the plan depends on what the statistics say of that queue"
		}
	}
	return ""
}

// indexConds returns the Index Cond line of each scan of index in plan (""
// for a scan without one).
func indexConds(plan, index string) []string {
	var out []string
	lines := strings.Split(plan, "\n")
	for i, l := range lines {
		if !strings.Contains(l, "Scan using "+index+" ") && !strings.HasSuffix(l, "Scan using "+index) && !strings.Contains(l, "Scan on "+index+" ") {
			continue
		}
		cond := ""
		for _, next := range lines[i+1:] {
			if strings.Contains(next, "->") {
				break
			}
			if strings.Contains(next, "Index Cond:") {
				cond = next
				break
			}
		}
		out = append(out, cond)
	}
	return out
}

// TestLivedState checks the harness itself: the copy holds the other
// queues' rows, their statistics predate the deletions (PostgreSQL believes
// more rows than there are) and believe the quiet queues hold a handful of
// rows (the "tiny" state; none left in the copy).
func TestLivedState(t *testing.T) {
	t.Parallel()
	pool := testdb.NewLived(t, applySchema, livedOptions["tiny"])
	ctx := context.Background()
	var items, ended, dead, waiting, edges, quiet int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM crdbwork_items), (SELECT count(*) FROM crdbwork_ended),
       (SELECT count(*) FROM crdbwork_dead_items), (SELECT count(*) FROM crdbwork_waiting), (SELECT count(*) FROM crdbwork_waits_for),
       (SELECT count(*) FROM crdbwork_items WHERE queue = 'q')`).Scan(&items, &ended, &dead, &waiting, &edges, &quiet); err != nil {
		t.Fatal(err)
	}
	t.Logf("items %d, ended %d, dead %d, waiting %d, edges %d", items, ended, dead, waiting, edges)
	if items < 70_000 || ended < 70_000 || dead < 10_000 || waiting != 20_000 || edges < 10_000 || quiet != 0 {
		t.Fatalf("lived state: items %d, ended %d, dead %d, waiting %d, edges %d, quiet queue %d", items, ended, dead, waiting, edges, quiet)
	}
	if testdb.Kind(t) != "postgres" {
		return
	}
	// The statistics: taken before a third of the items were deleted; the
	// quiet queues among the most common values at a frequency that makes
	// them a handful of rows.
	var reltuples float64
	var vals []string
	var freqs []float64
	if err := pool.QueryRow(ctx, `SELECT c.reltuples, s.most_common_vals::TEXT::TEXT[], s.most_common_freqs
FROM pg_class c JOIN pg_stats s ON s.tablename = c.relname AND s.attname = 'queue'
WHERE c.relname = 'crdbwork_items'`).Scan(&reltuples, &vals, &freqs); err != nil {
		t.Fatal(err)
	}
	if reltuples < float64(items)*1.2 {
		t.Errorf("crdbwork_items: statistics of %.0f rows for %d: not taken before the deletions", reltuples, items)
	}
	for _, q := range lived.Queues {
		if !slices.Contains(vals, q) {
			t.Errorf("the statistics' most common queues %q lack %s", vals, q)
		}
	}
	// The quiet queues: among them at lived.QuietRows rows each, exactly
	// (every row sampled), whichever build this is.
	for _, q := range livedOptions["tiny"].Quiet {
		i := slices.Index(vals, q)
		if i < 0 {
			t.Errorf("the statistics' most common queues %q lack the quiet queue %s", vals, q)
			continue
		}
		if rows := freqs[i] * reltuples; rows < lived.QuietRows-0.5 || rows > lived.QuietRows+0.5 {
			t.Errorf("the statistics give the quiet queue %s %.1f rows (a frequency of %g), want %d", q, rows, freqs[i], lived.QuietRows)
		}
	}
	var autovacuum bool
	if err := pool.QueryRow(ctx, `SELECT COALESCE('autovacuum_enabled=false' = ANY(reloptions), false) FROM pg_class WHERE relname = 'crdbwork_items'`).Scan(&autovacuum); err != nil || !autovacuum {
		t.Errorf("crdbwork_items: autovacuum not off in the copy (%v)", err)
	}
}
