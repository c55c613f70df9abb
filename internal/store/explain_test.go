package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestStatementPlansUseIndexes seeds a 100k-item backlog (a tenth of it
// claimed by 16 sessions, ~600 each; two queues; 16 parts), ANALYZEs, and
// EXPLAINs every claim, ack, nack, release, extend and reap statement: none
// may scan the items table sequentially, and the set-based acks and extends
// must find their rows by primary key (not, say, by merging with every item
// the session holds). The schedules' statements (10k schedule rows seeded)
// may not scan crdbwork_schedules. On PostgreSQL it checks both the plan for the given
// parameters and the generic plan a long-lived prepared statement ends up
// with.
func TestStatementPlansUseIndexes(t *testing.T) {
	t.Parallel()
	// A long backlog, and a drained queue whose rows are mostly claimed
	// (where PostgreSQL's estimates for "claim = $session" change).
	t.Run("backlog", func(t *testing.T) { t.Parallel(); explainAll(t, 100000, 1) })
	t.Run("drained", func(t *testing.T) { t.Parallel(); explainAll(t, 12000, 8) })
}

// explainAll seeds total items, claimedTenths tenths of them claimed by 16
// sessions, and checks every statement's plans.
func explainAll(t *testing.T, total, claimedTenths int) {
	pool := newSchemaDB(t)
	ctx := context.Background()
	claimed := fmt.Sprintf("g %% 10 BETWEEN 1 AND %d", claimedTenths)
	// Every expression of the seed has the same type on both engines: on
	// CockroachDB INT / INT is DECIMAL (docs checked: "Operators", / on
	// two INTs), so a session's number is floor(g / 10.0)::INT, an INT on
	// both (PostgreSQL has no // operator, CockroachDB's integer division).
	// The seed is checked below: every session holds claimed items.
	session := uuid.New()
	seed := []string{
		`INSERT INTO crdbwork_sessions (id, expiry) VALUES ('` + session.String() + `', INTERVAL '1 hour')`,
		`INSERT INTO crdbwork_sessions (id, expiry) SELECT gen_random_uuid(), INTERVAL '1 hour' FROM generate_series(1, 15)`,
		// A regular table, dropped below: CockroachDB refuses temporary
		// tables unless experimental_enable_temp_tables is set (docs
		// checked: "Temporary Tables").
		`CREATE TABLE seed_sessions AS SELECT row_number() OVER (ORDER BY id) - 1 AS n, id FROM crdbwork_sessions`,
		`INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, turn_at, tenant, expires_at, payload, attempts, claim, claim_token, lease_until)
		 SELECT gen_random_uuid(), CASE WHEN g % 10 = 0 THEN 'other' ELSE 'q' END, g % 16, g % 5,
		        now() - g * INTERVAL '1 millisecond', now() - g * INTERVAL '1 millisecond',
		        CASE WHEN g % 3 = 0 THEN 'tenant-' || (g % 1000)::TEXT END,
		        CASE WHEN g % 7 = 0 THEN now() + (g % 100 - 10) * INTERVAL '1 second' END, '\x00'::BYTEA,
		        CASE WHEN ` + claimed + ` THEN 1 ELSE 0 END,
		        CASE WHEN ` + claimed + ` THEN (SELECT id FROM seed_sessions WHERE n = floor(g / 10.0)::INT % 16) END,
		        CASE WHEN ` + claimed + ` THEN 1 ELSE 0 END,
		        CASE WHEN ` + claimed + ` THEN now() + (g % 600) * INTERVAL '1 second' END
		 FROM generate_series(1, ` + fmt.Sprint(total) + `) AS g`,
		`DROP TABLE seed_sessions`,
		`INSERT INTO crdbwork_queues (name, fair) VALUES ('q', true)`,
		`ANALYZE crdbwork_items`,
		`INSERT INTO crdbwork_schedules (queue, name, last_period)
		 SELECT 'q' || (g % 10), 'schedule-' || g, now() - g * INTERVAL '1 minute' FROM generate_series(1, 10000) AS g`,
		`ANALYZE crdbwork_schedules`,
		// Dead items: 20k deaths over two queues, some ids dead several times.
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason)
		 SELECT md5((g % 15000)::TEXT)::UUID, CASE WHEN g % 10 = 0 THEN 'other' ELSE 'q' END, g % 16, 0, 1, 1, '\x00'::BYTEA,
		        now() - INTERVAL '1 day', now() - g * INTERVAL '1 second', 'failed'
		 FROM generate_series(1, 20000) AS g`,
		`ANALYZE crdbwork_dead_items`,
		// Ended ids: 100k of queue q over a day and a half (a third past
		// the default window), 20k of another queue.
		`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
		 SELECT CASE WHEN g % 6 = 0 THEN 'other' ELSE 'q' END, gen_random_uuid(), now() - g * INTERVAL '1 second', 'acked'
		 FROM generate_series(1, 120000) AS g`,
		`ANALYZE crdbwork_ended`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	var holders, orphans int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT claim), count(*) FILTER (WHERE attempts = 1 AND claim IS NULL) FROM crdbwork_items`).Scan(&holders, &orphans); err != nil {
		t.Fatal(err)
	}
	if holders != 16 || orphans != 0 {
		t.Fatalf("the seed gave claimed items to %d sessions, want 16, and left %d claimed items without a session", holders, orphans)
	}
	rows, err := pool.Query(ctx, `SELECT id FROM crdbwork_items WHERE claim = $1 LIMIT 512`, session)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil || len(ids) != 512 {
		t.Fatalf("seeded claimed ids: %d, %v", len(ids), err)
	}
	rows, err = pool.Query(ctx, `SELECT id FROM crdbwork_ended WHERE queue = 'q' ORDER BY ended_at DESC LIMIT 64`)
	if err != nil {
		t.Fatal(err)
	}
	endedIDs, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil || len(endedIDs) != 64 {
		t.Fatalf("seeded ended ids: %d, %v", len(endedIDs), err)
	}
	// An enqueue of 64 rows: 32 ended ids and 32 fresh ones.
	enqueueIDs := append(append([]uuid.UUID{}, endedIDs[:32]...), ids[:32]...)
	n64 := make([]int64, 64)
	texts, payloads := make([]string, 64), make([][]byte, 64)
	amo, turns := make([]bool, 64), make([]*time.Time, 64)
	for i := range texts {
		texts[i], payloads[i], n64[i] = fmt.Sprint("k", i), []byte{0}, int64(i)
	}
	es := store.NewEnqueueStatements(crsql.Tables{})
	dedup := store.NewDedupStatements(crsql.Tables{})
	sessions := make([]uuid.UUID, len(ids))
	tokens := make([]int64, len(ids))
	for i := range ids {
		sessions[i], tokens[i] = session, 1
	}
	st := store.NewStatements(crsql.Tables{})
	dialect, err := store.DetectDialect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	ds := st.ForDialect(dialect)
	ls := store.NewLimitStatements(crsql.Tables{})
	sched := store.NewScheduleStatements(crsql.Tables{})
	claimAny, reapLeases := ds.ClaimAny, ds.ReapLeases
	parts := store.NewPartClaimStatements(crsql.Tables{})
	fair := store.NewFairStatements(crsql.Tables{})
	claimParts := parts.Claim(dialect, 4)
	// A pick over MaxPartBranches parts, and the claim of what it picked.
	many := make([]any, 0, 3+store.MaxPartBranches)
	many = append(many, "q", 64, []string{})
	for p := range store.MaxPartBranches {
		many = append(many, int64(p))
	}
	urgent := store.NewUrgentStatements(crsql.Tables{}).ForDialect(dialect)
	deaths := store.NewDeathStatements(crsql.Tables{})
	refused := store.NewRefusedStatements(crsql.Tables{})
	inspect := store.NewInspectStatements(crsql.Tables{})
	var deadID, deadDeath uuid.UUID
	var diedAt time.Time
	if err := pool.QueryRow(ctx, `SELECT id, death, died_at FROM crdbwork_dead_items WHERE queue = 'q' ORDER BY died_at DESC LIMIT 1 OFFSET 5000`).Scan(&deadID, &deadDeath, &diedAt); err != nil {
		t.Fatal(err)
	}
	cases := []planCase{
		{"ClaimAny", claimAny, []any{session, "q", 64, int64(300e6), []string{}}},
		{"ClaimAny (1000)", claimAny, []any{session, "q", 1000, int64(300e6), []string{}}},
		{"ClaimAny (tenants skipped)", claimAny, []any{session, "q", 64, int64(300e6), []string{"tenant-3", "tenant-6"}}},
		{"ClaimUrgent", urgent, []any{session, "q", 64, int64(300e6), []string{}, int64(1), false, []string{}, []int64{}}},
		{"ClaimUrgent (1000)", urgent, []any{session, "q", 1000, int64(300e6), []string{}, int64(3), false, []string{}, []int64{}}},
		{"ClaimUrgent (tenants skipped)", urgent, []any{session, "q", 64, int64(300e6), []string{"tenant-3", "tenant-6"}, int64(1), false, []string{"tenant-9"}, []int64{3, 4}}},
		{"ClaimUrgent (every tenant limited)", urgent, []any{session, "q", 64, int64(300e6), []string{}, int64(1), true, []string{}, []int64{3, 4}}},
		{"ClaimParts", claimParts, []any{session, "q", 64, int64(300e6), []string{}, int64(3), int64(4), int64(5), int64(6)}},
		{"ClaimParts (1000)", claimParts, []any{session, "q", 1000, int64(300e6), []string{}, int64(3), int64(4), int64(5), int64(6)}},
		{"ClaimParts (tenants skipped)", claimParts, []any{session, "q", 64, int64(300e6), []string{"tenant-3"}, int64(3), int64(4), int64(5), int64(6)}},
		{"ClaimParts (one part)", parts.Claim(dialect, 1), []any{session, "q", 64, int64(300e6), []string{}, int64(7)}},
		{"ClaimParts (shares)", parts.ClaimShares(dialect, 4), []any{session, "q", 128, int64(300e6), []string{}, int64(3), int64(4), int64(5), int64(6), int64(48)}},
		{"PickParts", parts.Pick(store.MaxPartBranches), many},
		{"ClaimPicked", parts.ClaimPickedFor(dialect), []any{session, int64(300e6), ids[:64]}},
		{"TakeAtMostOnce", ds.TakeAtMostOnce, []any{ids[:64], sessions[:64], tokens[:64]}},
		{"ReapExpired", st.ReapExpired, []any{"q", 1000}},
		{"FairLasts", fair.Lasts(1), []any{"q", "tenant-3", int64(0)}},
		{"FairLasts (3 pairs)", fair.Lasts(3), []any{"q", "tenant-3", int64(0), "tenant-6", int64(1), "new", int64(2)}},
		{"FairHead", ds.FairHead, []any{"q", int64(1)}},
		// The idle probe (internal/wake): the claim's read, without locks.
		{"Probe", store.ProbeText(crsql.Tables{}, dialect), []any{"q", store.ProbeLimit}},
		{"Probe (drained queue)", store.ProbeText(crsql.Tables{}, dialect), []any{"drained", store.ProbeLimit}},
		{"FairFront", store.FairFrontText(store.New(crsql.Tables{}), dialect), []any{"q", int64(1), int64(16)}},
		{"AckMany", ds.AckMany, []any{ids[:64], sessions[:64], tokens[:64]}},
		{"AckMany (512)", ds.AckMany, []any{ids, sessions, tokens}},
		{"AckMany (one item)", ds.AckMany, []any{ids[:1], sessions[:1], tokens[:1]}},
		{"Nack", st.Nack, []any{ids[0], session, int64(1), int64(1e6), "boom"}},
		{"Release", st.Release, []any{ids[0], session, int64(1)}},
		{"DeadLetter", st.DeadLetter, []any{ids[0], session, int64(1), "boom", "failed"}},
		{"Extend", ds.Extend, []any{ids[:64], sessions[:64], tokens[:64], int64(300e6)}},
		{"ReapLeases", reapLeases, []any{"q", 1000}},
		{"ReapExhausted", st.ReapExhausted, []any{"q", 1000, "crash loop"}},
		{"ReleaseForgotten", st.ReleaseForgot, []any{"q", session, ids[:64]}},
		{"ExpiredLeaseIDs", deaths.ExpiredLeaseIDs, []any{"q", 1000}},
		{"ReapLeasesIDs", deaths.ReapLeasesIDs, []any{"q", ids[:64]}},
		{"ReapLeasesIDs (one item)", deaths.ReapLeasesIDs, []any{"q", ids[:1]}},
		{"ExhaustedIDs", deaths.ExhaustedIDs, []any{"q", 1000}},
		{"ExpiredIDs", deaths.ExpiredIDs, []any{"q", 1000}},
		{"ReapExhaustedIDs", deaths.ReapExhaustedIDs, []any{"q", ids[:64], "crash loop"}},
		{"ReapExhaustedIDs (one item)", deaths.ReapExhaustedIDs, []any{"q", ids[:1], "crash loop"}},
		{"ReapExpiredIDs", deaths.ReapExpiredIDs, []any{"q", ids[:64]}},
		{"ReapExpiredIDs (one item)", deaths.ReapExpiredIDs, []any{"q", ids[:1]}},
		{"Exhaust", deaths.Exhaust, []any{ids[0], session, int64(1), "boom"}},
		{"DeadItems", st.DeadItems, []any{"q", 100}},
		{"DeadItemsBefore", deaths.DeadItemsBefore, []any{"q", diedAt, deadID, deadDeath, 100}},
		{"Requeue", st.Requeue, []any{deadID, "q", nil}},
		{"Requeue (a death)", st.Requeue, []any{deadID, "q", deadDeath}},
		{"RequeueState", deaths.RequeueState, []any{deadID, "q", nil}},
		// Rows the database refuses (items_refused.go): one item by id.
		{"KillRefusedItem", refused.KillItem, []any{"q", ids[0], "refused by the database (leases): boom"}},
		{"CancelledIDs", refused.CancelledIDs, []any{"q", 1000}},
		{"ReapCancelledIDs", refused.ReapCancelledIDs, []any{"q", ids[:64]}},
		{"ReapCancelledIDs (one item)", refused.ReapCancelledIDs, []any{"q", ids[:1]}},
		{"TestItems", store.NewTestStatements(crsql.Tables{}).Items, []any{"q", 1001}},
		{"InsertQueueParts", st.InsertQueueParts, []any{"q-new", int64(4)}},
		{"Cancel", st.Cancel, []any{ids[0], "q", "ops", "no longer needed"}},
		{"EnqueueInsert", es.Insert, []any{"q", enqueueIDs, n64, texts, n64, n64, n64, payloads, payloads, texts, n64, amo, turns, n64, texts, n64, texts}},
		{"PostgresEnqueueInsert", es.PostgresInsert, []any{"q", enqueueIDs, n64, texts, n64, n64, n64, payloads, payloads, texts, n64, amo, turns, n64, texts, n64, texts}},
		{"EnqueueInsertUnique", es.InsertUnique, []any{"q", enqueueIDs, n64, texts, n64, n64, n64, payloads, payloads, texts, n64, amo, turns, n64, texts, n64, texts, n64}},
		{"PostgresEnqueueInsertUnique", es.PostgresInsertUnique, []any{"q", enqueueIDs, n64, texts, n64, n64, n64, payloads, payloads, texts, n64, amo, turns, n64, texts, n64, texts, n64}},
		{"EnqueueFound", es.Found, []any{"q", enqueueIDs}},
		{"PruneEnded", dedup.PruneEnded, []any{"q", 1000}},
		{"PruneEndedCandidates", refused.PruneEndedCandidates, []any{"q", 1000}},
		{"PruneEndedIDs", refused.PruneEndedIDs, []any{"q", ids[:64]}},
		{"QueueLimits", ls.QueueLimits, []any{"q"}},
		{"TenantLimits", ls.TenantLimits, []any{"q"}},
		{"SetTenantLimit", ls.SetTenantLimit, []any{"q", "t", int64(2), "1.5"}},
		{"RemoveTenantLimit", ls.RemoveTenantLimit, []any{"q", "t"}},
		{"ScheduleLast", sched.Last, []any{"q3", "schedule-3"}},
		{"ScheduleRow", sched.Row, []any{"q3", "schedule-3"}},
		{"SchedulesStored", sched.Stored, []any{"q3"}},
		{"InspectQueue", inspect.Queue, []any{"q"}},
		// The backlog counts read every item of the queue they count
		// (unclaimed, claimed, with a tenant, dead): for a queue that
		// holds most of a table, as q does, a sequential scan is the
		// planner's fair choice. What they must not do is read the other
		// queues' items: they are checked on "other", a tenth of the
		// items and of the deaths, none claimed, with the plan for the
		// given parameters only. A generic plan estimates a queue's share
		// as one over the number of queues, here a half, for which a
		// sequential scan is right; TestInspectPlans checks their generic
		// plans with many queues.
		{"InspectUnclaimed", inspect.Unclaimed, []any{"other"}},
		{"InspectClaimed", inspect.Claimed, []any{"other"}},
		{"InspectTenants", inspect.Tenants, []any{"other", 20}},
		{"InspectDeadCount", inspect.DeadCount, []any{"other"}},
		{"InspectStoredQueues", inspect.StoredQueues, []any{"", 1000}},
		{"InspectNextUnclaimedQueue", inspect.NextUnclaimedQueue, []any{"other"}},
		{"InspectNextClaimedQueue", inspect.NextClaimedQueue, []any{""}},
		{"InspectNextDeadQueue", inspect.NextDeadQueue, []any{"other"}},
		{"ScheduleAdvance", sched.Advance, []any{"q3", "schedule-3", time.Now().UTC().Truncate(time.Microsecond)}},
		// bench/internal/order's measure: TestOrderCountPlan checks it on a
		// thousand priorities; here the positions are among the first of
		// q's claim order (priorities 0 and 1 of five).
		{"OrderCountsBefore", store.OrderCountsBeforeText(store.New(crsql.Tables{})), []any{"q", []int64{0, 1}, []time.Time{time.Now().Add(-90 * time.Second), time.Now().Add(-99 * time.Second)}}},
	}
	skip := func(i int) bool { return inspectCounts[cases[i].name] }
	explainEach(t, pool, "explained_", cases, skip, func(i int, mode, text string) {
		c := cases[i]
		// PostgreSQL: "Seq Scan on crdbwork_items"; CockroachDB: a "full
		// scan" of the table's primary index.
		byKey := strings.HasPrefix(c.name, "AckMany") || strings.HasPrefix(c.name, "Extend") || strings.HasPrefix(c.name, "TakeAtMostOnce") || c.name == "ClaimPicked" ||
			strings.HasPrefix(c.name, "ReapLeasesIDs") || strings.HasPrefix(c.name, "ReapExhaustedIDs") || strings.HasPrefix(c.name, "ReapExpiredIDs") || c.name == "Exhaust" ||
			c.name == "KillRefusedItem" || strings.HasPrefix(c.name, "ReapCancelledIDs")
		switch {
		case (strings.HasPrefix(c.name, "ClaimParts") || c.name == "PickParts") && !strings.Contains(text, "crdbwork_items_part_turn"):
			t.Errorf("%s (%s) does not read the per-part index crdbwork_items_part_turn:\n%s", c.name, mode, text)
		case strings.HasPrefix(c.name, "ClaimUrgent") && !strings.Contains(text, "crdbwork_items_turn_next"):
			t.Errorf("%s (%s) does not read the claim-order index crdbwork_items_turn_next:\n%s", c.name, mode, text)
		case strings.HasPrefix(c.name, "FairLasts") && !strings.Contains(text, "crdbwork_items_tenant_turn"):
			t.Errorf("%s (%s) does not seek the tenant's last turn by index:\n%s", c.name, mode, text)
		case (c.name == "FairHead" || c.name == "FairFront" || c.name == "OrderCountsBefore" || strings.HasPrefix(c.name, "Probe")) && !strings.Contains(text, "crdbwork_items_turn_next"):
			t.Errorf("%s (%s) does not seek the head by index:\n%s", c.name, mode, text)
		case strings.Contains(text, "Seq Scan on crdbwork_items") || strings.Contains(text, "Seq Scan on crdbwork_schedules") ||
			strings.Contains(text, "Seq Scan on crdbwork_ended") || strings.Contains(text, "Seq Scan on crdbwork_dead_items") ||
			strings.Contains(text, "FULL SCAN") ||
			strings.Contains(text, "full scan"):
			t.Errorf("%s (%s) scans the items table:\n%s", c.name, mode, text)
		case byKey && testdb.Kind(t) == "postgres" &&
			(!strings.Contains(text, "crdbwork_items_pkey") || strings.Contains(text, "Merge") || strings.Contains(text, "crdbwork_items_claimed")):
			t.Errorf("%s (%s) does not find its rows by primary key:\n%s", c.name, mode, text)
		default:
			t.Logf("%s (%s):\n%s", c.name, mode, text)
		}
	})
}

// literals renders arguments as SQL literals for EXECUTE.
func literals(args []any) string {
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case nil:
			out[i] = "NULL"
		case uuid.UUID:
			out[i] = "'" + v.String() + "'::UUID"
		case string:
			out[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case int, int64, bool:
			out[i] = fmt.Sprint(v)
		case time.Time:
			out[i] = "'" + v.Format(time.RFC3339Nano) + "'::TIMESTAMPTZ"
		case []string:
			q := make([]string, len(v))
			for j, s := range v {
				q[j] = "'" + strings.ReplaceAll(s, "'", "''") + "'"
			}
			out[i] = "ARRAY[" + strings.Join(q, ",") + "]::TEXT[]"
		case []int64:
			out[i] = "ARRAY" + strings.ReplaceAll(fmt.Sprint(v), " ", ",") + "::BIGINT[]"
		case []bool:
			out[i] = "ARRAY" + strings.ReplaceAll(fmt.Sprint(v), " ", ",") + "::BOOL[]"
		case []byte:
			out[i] = fmt.Sprintf("'\\x%x'::BYTEA", v)
		case [][]byte:
			q := make([]string, len(v))
			for j, b := range v {
				q[j] = fmt.Sprintf("'\\x%x'::BYTEA", b)
			}
			out[i] = "ARRAY[" + strings.Join(q, ",") + "]::BYTEA[]"
		case []time.Time:
			q := make([]string, len(v))
			for j, t := range v {
				q[j] = "'" + t.Format(time.RFC3339Nano) + "'"
			}
			out[i] = "ARRAY[" + strings.Join(q, ",") + "]::TIMESTAMPTZ[]"
		case []*time.Time:
			q := make([]string, len(v))
			for j, t := range v {
				q[j] = "NULL"
				if t != nil {
					q[j] = "'" + t.Format(time.RFC3339Nano) + "'"
				}
			}
			out[i] = "ARRAY[" + strings.Join(q, ",") + "]::TIMESTAMPTZ[]"
		case []uuid.UUID:
			parts := make([]string, len(v))
			for j, u := range v {
				parts[j] = "'" + u.String() + "'"
			}
			out[i] = "ARRAY[" + strings.Join(parts, ",") + "]::UUID[]"
		default:
			panic(fmt.Sprintf("literals: %T", a))
		}
	}
	return strings.Join(out, ", ")
}

// TestPartClaimReadsStayFlat measures, with EXPLAIN ANALYZE, how much of the
// items table one per-part claim reads. In the sparse case 100k vested items
// wait in parts the claiming session does not own and none in its own: a
// claim that filters parts on a queue-wide index walks the whole backlog to
// find nothing. In the balanced case the items are spread over all 16 parts.
// Either way a claim of n items from k parts may read at most n entries per
// part and n primary-key lookups (its UPDATE), whatever the backlog; in the
// sparse case it may touch only a few index pages per part. On PostgreSQL it
// checks the plan for the given parameters and the generic plan a prepared
// claim ends up with. Each claim runs in a transaction that is rolled back,
// so the seeded rows stay as they are.
func TestPartClaimReadsStayFlat(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	session := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_sessions (id, expiry) VALUES ($1, INTERVAL '1 hour')`, session); err != nil {
		t.Fatal(err)
	}
	own := []int64{12, 13, 14, 15}
	for _, p := range own {
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'q', $2)`, session, p); err != nil {
			t.Fatal(err)
		}
	}
	dialect, err := store.DetectDialect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	claimParts := store.NewPartClaimStatements(crsql.Tables{}).Claim(dialect, len(own))
	const limit = 64
	bound := 2*limit*len(own) + 8
	modes := []bool{false}
	if testdb.Kind(t) == "postgres" {
		modes = append(modes, true)
	}
	for _, c := range []struct {
		name  string
		parts string // the parts the 100k items are spread over
		want  int    // items the claim must return
	}{
		{"sparse", "g % 12", 0},       // parts 0..11: none of the session's
		{"balanced", "g % 16", limit}, // every part
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, s := range []string{
				`DELETE FROM crdbwork_items`,
				`INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, turn_at, payload)
				 SELECT gen_random_uuid(), 'q', ` + c.parts + `, g % 3, now() - g * INTERVAL '1 millisecond', now() - g * INTERVAL '1 millisecond', '\x00'::BYTEA
				 FROM generate_series(1, 100000) AS g`,
				`ANALYZE crdbwork_items`,
			} {
				if _, err := pool.Exec(ctx, s); err != nil {
					t.Fatalf("%v\n%s", err, s)
				}
			}
			for _, generic := range modes {
				mode := "custom"
				if generic {
					mode = "generic"
				}
				read, blocks, claimed := explainReads(t, pool, claimParts, session, limit, own, generic)
				t.Logf("%s (%s): claimed %d, read %d rows or index entries of the items table, %d pages of its secondary indexes (bound %d)", c.name, mode, claimed, read, blocks, bound)
				if claimed != c.want {
					t.Errorf("%s (%s): the claim took %d items; want %d", c.name, mode, claimed, c.want)
				}
				if read > bound {
					t.Errorf("%s (%s): the claim read %d rows or index entries of the items table; want at most %d (2·limit·parts + 8)", c.name, mode, read, bound)
				}
				if c.want == 0 && blocks > 8*len(own) {
					t.Errorf("%s (%s): the claim touched %d pages of the items table's secondary indexes to find nothing; want at most %d (8 per part)", c.name, mode, blocks, 8*len(own))
				}
			}
		})
	}
}

// explainReads runs the per-part claim under EXPLAIN ANALYZE in a rolled-back
// transaction and returns the rows or index entries of the items table it
// read, the pages of the items table's secondary indexes and sequential scans
// it touched (PostgreSQL; -1 on CockroachDB), and the rows it claimed. With
// generic, PostgreSQL plans it as a prepared statement's generic plan.
func explainReads(t *testing.T, pool *pgxpool.Pool, stmt string, session uuid.UUID, limit int, parts []int64, generic bool) (read, blocks, claimed int) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	args := []any{session, "q", limit, int64(300e6), []string{}}
	for _, p := range parts {
		args = append(args, p)
	}
	if testdb.Kind(t) != "postgres" {
		// CockroachDB: EXPLAIN ANALYZE reports the rows the statement
		// decoded from KV (every index entry and row it read).
		rows, err := tx.Query(ctx, "EXPLAIN ANALYZE "+stmt, args...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		read = -1
		for _, l := range lines {
			l = strings.TrimSpace(l)
			if v, ok := strings.CutPrefix(l, "rows decoded from KV: "); ok {
				v, _, _ = strings.Cut(v, " ")
				if read, err = strconv.Atoi(strings.ReplaceAll(v, ",", "")); err != nil {
					t.Fatalf("EXPLAIN ANALYZE: %q: %v", l, err)
				}
			}
		}
		if read < 0 {
			t.Fatalf("EXPLAIN ANALYZE reported no rows decoded from KV:\n%s", strings.Join(lines, "\n"))
		}
		return read, -1, claimedIn(t, tx, session)
	}
	query := "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + stmt
	if generic {
		// The plan a prepared claim gets once PostgreSQL stops planning it
		// for each execution's values. (PREPARE outlives the rollback.)
		for _, s := range []string{"SET LOCAL plan_cache_mode = force_generic_plan", "PREPARE reads_claim AS " + stmt} {
			if _, err := tx.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
		query, args = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE reads_claim("+literals(args)+")", nil
	}
	var out []byte
	if err := tx.QueryRow(ctx, query, args...).Scan(&out); err != nil {
		t.Fatal(err)
	}
	if generic {
		if _, err := tx.Exec(ctx, "DEALLOCATE reads_claim"); err != nil {
			t.Fatal(err)
		}
	}
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("EXPLAIN JSON: %v\n%s", err, out)
	}
	var walk func(n planNode)
	walk = func(n planNode) {
		if n.Relation == "crdbwork_items" {
			// Rows (or index entries) returned in every loop, and those the
			// scan read and dropped (a filter on the entries or the rows).
			read += int(n.Rows*n.Loops) + int(n.Removed) + int(n.Recheck)
		}
		if n.Relation == "crdbwork_items" && n.Type == "Seq Scan" ||
			strings.HasPrefix(n.Index, "crdbwork_items_") && n.Index != "crdbwork_items_pkey" {
			blocks += int(n.Hit + n.ReadBlocks)
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(plans[0].Plan)
	claimed = claimedIn(t, tx, session)
	if read == 0 && claimed > 0 {
		t.Fatalf("no scan of the items table in the plan:\n%s", out)
	}
	t.Logf("plan:\n%s", out)
	return read, blocks, claimed
}

// claimedIn counts the items session holds as seen by tx: EXPLAIN ANALYZE
// ran the claim, so its writes are visible until the rollback.
func claimedIn(t *testing.T, tx pgx.Tx, session uuid.UUID) int {
	t.Helper()
	var n int
	if err := tx.QueryRow(context.Background(), `SELECT count(*) FROM crdbwork_items WHERE claim = $1`, session).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// planNode is a node of PostgreSQL's EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	Type       string     `json:"Node Type"`
	Relation   string     `json:"Relation Name"`
	Index      string     `json:"Index Name"`
	Rows       float64    `json:"Actual Rows"`
	Loops      float64    `json:"Actual Loops"`
	Removed    float64    `json:"Rows Removed by Filter"`
	Recheck    float64    `json:"Rows Removed by Index Recheck"`
	Hit        float64    `json:"Shared Hit Blocks"`
	ReadBlocks float64    `json:"Shared Read Blocks"`
	Plans      []planNode `json:"Plans"`
}

// inspectCounts are the Inspect statements that count one queue's items
// (see explainAll and TestInspectPlans).
var inspectCounts = map[string]bool{"InspectUnclaimed": true, "InspectClaimed": true, "InspectTenants": true, "InspectDeadCount": true}

// TestInspectPlans checks that the reads of claim.Queue.Inspect read only
// the inspected queue's items, with both the plan for the given parameters
// and, on PostgreSQL, the generic plan: 40 queues, one of them ("big")
// holding most items, claims and deaths, and a small one inspected. None
// may scan the items or dead items table sequentially, and each must use
// the index its documentation names (the queues table, 39 rows on one
// page, may be read whole: PostgreSQL does so however it is asked).
func TestInspectPlans(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	session := uuid.New()
	// Queue names: "big" for g % 2 = 0, else "q" || g % 39 (39 small
	// queues). Every tenth item claimed, every third with a tenant.
	name := `CASE WHEN g % 2 = 0 THEN 'big' ELSE 'q' || (g % 39)::TEXT END`
	seed := []string{
		`INSERT INTO crdbwork_sessions (id, expiry) VALUES ('` + session.String() + `', INTERVAL '1 hour')`,
		`INSERT INTO crdbwork_items (id, queue, part, vesting_at, turn_at, tenant, payload, claim, lease_until)
		 SELECT gen_random_uuid(), ` + name + `, g % 16, now() + (g % 3 - 1) * INTERVAL '1 minute', now(),
		        CASE WHEN g % 3 = 0 THEN 'tenant-' || (g % 500)::TEXT END, '\x00'::BYTEA,
		        CASE WHEN g % 10 = 1 THEN '` + session.String() + `'::UUID END,
		        CASE WHEN g % 10 = 1 THEN now() + INTERVAL '1 minute' END
		 FROM generate_series(1, 100000) AS g`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, reason)
		 SELECT gen_random_uuid(), ` + name + `, 0, 0, 1, 1, '\x00'::BYTEA, now(), 'failed' FROM generate_series(1, 20000) AS g`,
		`INSERT INTO crdbwork_queues (name, num_parts) SELECT 'q' || g::TEXT, 16 FROM generate_series(0, 38) AS g`,
		`INSERT INTO crdbwork_ended (queue, id, outcome) SELECT ` + name + `, gen_random_uuid(), 'acked' FROM generate_series(1, 20000) AS g`,
		`INSERT INTO crdbwork_waiting (id, queue, hash, payload, remaining) SELECT gen_random_uuid(), ` + name + `, 0, '\x00'::BYTEA, 1 FROM generate_series(1, 20000) AS g`,
		`INSERT INTO crdbwork_schedules (queue, name, last_period) SELECT ` + name + `, 's' || g::TEXT, now() FROM generate_series(1, 20000) AS g`,
		`ANALYZE crdbwork_items`, `ANALYZE crdbwork_dead_items`, `ANALYZE crdbwork_queues`,
		`ANALYZE crdbwork_ended`, `ANALYZE crdbwork_waiting`, `ANALYZE crdbwork_schedules`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	in := store.NewInspectStatements(crsql.Tables{})
	cases := []struct {
		name, stmt, index string
		args              []any
	}{
		{"Queue", in.Queue, "crdbwork_queues", []any{"q7"}},
		{"Unclaimed", in.Unclaimed, "crdbwork_items_part_turn", []any{"q7"}},
		{"Claimed", in.Claimed, "crdbwork_items_lease", []any{"q7"}},
		{"Tenants", in.Tenants, "crdbwork_items_tenant_turn", []any{"q7", 20}},
		{"DeadCount", in.DeadCount, "crdbwork_dead_items_by_queue", []any{"q7"}},
		{"StoredQueues", in.StoredQueues, "crdbwork_queues", []any{"q3", 10}},
		{"NextUnclaimedQueue", in.NextUnclaimedQueue, "crdbwork_items_", []any{"q7"}},
		{"NextClaimedQueue", in.NextClaimedQueue, "crdbwork_items_lease", []any{"q7"}},
		{"NextDeadQueue", in.NextDeadQueue, "crdbwork_dead_items_by_queue", []any{"q7"}},
		{"NextAnyQueue", in.NextAnyQueue, "crdbwork_waiting_by_queue", []any{"q7"}},
	}
	pcs := make([]planCase, len(cases))
	for i, c := range cases {
		pcs[i] = planCase{c.name, c.stmt, c.args}
	}
	explainEach(t, pool, "inspect_", pcs, nil, func(i int, mode, text string) {
		c := cases[i]
		switch {
		case strings.Contains(text, "Seq Scan on crdbwork_items") || strings.Contains(text, "Seq Scan on crdbwork_dead_items") ||
			strings.Contains(text, "Seq Scan on crdbwork_ended") || strings.Contains(text, "Seq Scan on crdbwork_waiting") ||
			strings.Contains(text, "Seq Scan on crdbwork_schedules") ||
			strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan"):
			t.Errorf("%s (%s) scans a table:\n%s", c.name, mode, text)
		case testdb.Kind(t) == "postgres" && !strings.Contains(text, c.index):
			t.Errorf("%s (%s) does not read %s:\n%s", c.name, mode, c.index, text)
		default:
			t.Logf("%s (%s):\n%s", c.name, mode, text)
		}
	})
}
