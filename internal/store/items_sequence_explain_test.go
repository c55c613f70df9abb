package store_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/lived"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestSequencedStatements: each sequenced claim is its plain claim with the
// scan aliased h and the sequence condition added, nothing else, so that
// it follows every change made to the plain claims; the texts are rendered
// for other table names too.
func TestSequencedStatements(t *testing.T) {
	t.Parallel()
	for _, tables := range []crsql.Tables{{}, {Schema: "work", Prefix: "jobs_"}} {
		seq := store.NewSequenceStatements(tables)
		st := store.NewStatements(tables)
		parts := store.NewPartClaimStatements(tables)
		urgent := store.NewUrgentStatements(tables)
		prefix := "crdbwork_"
		if tables.Prefix != "" {
			prefix = tables.Prefix
		}
		for _, d := range []store.Dialect{store.Cockroach, store.Postgres} {
			pairs := map[string][2]string{
				"ClaimAny":    {seq.ClaimAnyFor(d), st.ForDialect(d).ClaimAny},
				"ClaimUrgent": {seq.ClaimUrgentFor(d), urgent.ForDialect(d)},
				// PostgreSQL's plain per-part claims lock lazily, the
				// sequenced ones in their branches (pgLockLazily).
				"ClaimParts1":  {seq.ClaimParts(d, 1), undoLazyLock(parts.Claim(d, 1))},
				"ClaimParts16": {seq.ClaimParts(d, store.MaxPartBranches), undoLazyLock(parts.Claim(d, store.MaxPartBranches))},
			}
			for name, p := range pairs {
				got, plain := p[0], p[1]
				branches := strings.Count(plain, "FOR UPDATE SKIP LOCKED")
				if n := strings.Count(got, "AS sb\n"); n != branches {
					t.Errorf("%v %s: %d sequence conditions for %d scans:\n%s", d, name, n, branches, got)
				}
				if !strings.Contains(got, prefix+"items_sequence_claimed") && !strings.Contains(got, "sc.claim IS NOT NULL") {
					t.Errorf("%v %s: no test of the key's claimed items:\n%s", d, name, got)
				}
				// Removing the condition and the alias gives the plain text back.
				back := got
				for strings.Contains(back, " AS h\n") {
					const end = "LIMIT 1), true) END\n              AND "
					i := strings.Index(back, "CASE WHEN h.seq_order IS NULL THEN true ELSE")
					j := strings.Index(back[max(i, 0):], end)
					if i < 0 || j < 0 {
						t.Fatalf("%v %s: condition not found:\n%s", d, name, back)
					}
					back = back[:i] + back[i+j+len(end):]
					back = strings.Replace(back, " AS h\n", "\n", 1)
				}
				if back != plain {
					t.Errorf("%v %s: the sequenced claim differs from the plain one by more than its condition:\n%s\nplain:\n%s", d, name, back, plain)
				}
			}
		}
	}
}

// sequencedPlanCases are the sequenced claims (and the queue's setting
// reads) with arguments for queue q.
func sequencedPlanCases(t *testing.T, pool *pgxpool.Pool, session uuid.UUID, q string) []planCase {
	t.Helper()
	dialect, err := store.DetectDialect(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	seq := store.NewSequenceStatements(crsql.Tables{})
	lease := int64(300e6)
	return []planCase{
		{"ClaimAnySequenced", seq.ClaimAnyFor(dialect), []any{session, q, 64, lease, []string{}}},
		{"ClaimAnySequenced (1000)", seq.ClaimAnyFor(dialect), []any{session, q, 1000, lease, []string{}}},
		{"ClaimAnySequenced (tenants skipped)", seq.ClaimAnyFor(dialect), []any{session, q, 64, lease, []string{"tenant-7", "tenant-14"}}},
		{"ClaimPartsSequenced", seq.ClaimParts(dialect, 4), []any{session, q, 64, lease, []string{}, int64(3), int64(4), int64(5), int64(6)}},
		{"ClaimPartsSequenced (one part)", seq.ClaimParts(dialect, 1), []any{session, q, 64, lease, []string{}, int64(7)}},
		{"ClaimUrgentSequenced", seq.ClaimUrgentFor(dialect), []any{session, q, 64, lease, []string{}, int64(1), false, []string{}, []int64{}}},
		{"QueueSequenced", seq.Sequenced, []any{q}},
		{"SetSequenced", seq.SetSequenced, []any{q, true}},
		{"SetSequenceHold", seq.SetHold, []any{q, true}},
		{"ReleaseSequenceKey", seq.Release, []any{q, "key-7"}},
		{"BlockedKeys", seq.Blocked, []any{q, 100}},
	}
}

// sequenceIndexes are the indexes a sequenced claim tests its candidates
// through: each read of them must be one seek per candidate, by the
// candidate's key, that stops at its first entry.
var sequenceIndexes = []string{"crdbwork_items_sequence_order", "crdbwork_dead_items_sequence_held"}

// sequenceReads are the aliases of a sequenced claim's per-candidate
// subqueries' tables (as EXPLAIN names them, maybe with a suffix _N in
// the branches of a per-part claim) and the index each must read.
var sequenceReads = map[*regexp.Regexp]string{
	regexp.MustCompile(` on crdbwork_items sb(_[0-9]+)?( |$)`):      "crdbwork_items_sequence_order",
	regexp.MustCompile(` on crdbwork_dead_items sd(_[0-9]+)?( |$)`): "crdbwork_dead_items_sequence_held",
}

// candidateScan is a plan line that reads a sequenced claim's candidates
// (the scan aliased h, or h_1, h_2... in the branches of a per-part claim).
var candidateScan = regexp.MustCompile(` on crdbwork_items h(_[0-9]+)?( |$)`)

// candidateSeek is the index condition of a seek by a candidate's queue
// and key (h, or h_1, h_2... in the branches of a per-part claim).
var candidateSeek = regexp.MustCompile(`Index Cond: \(\(queue = (h(_[0-9]+)?)\.queue\) AND \(item_key = (h(_[0-9]+)?)\.item_key\)`)

// checkSequencedPlan fails t if the plan text of case c (in state, mode)
// is not the shape the sequenced claims must keep whatever the estimates:
// the claim order read through its index as the plain claim reads it; the
// head and held tests each a read of their index once per candidate by
// the candidate's queue and key, under a LIMIT (on PostgreSQL: a SubPlan
// whose index condition names the candidate's key, never another index,
// never a scan of the queue's entries with the key as a join filter, never
// a hash join or a materialized side); and the claimed keys read once per
// statement into a hashed SubPlan.
func checkSequencedPlan(t *testing.T, c planCase, state, mode, text string) {
	t.Helper()
	claims := strings.HasPrefix(c.name, "Claim")
	postgres := testdb.Kind(t) == "postgres"
	// BlockedKeys, an operator's read, may read the queue's sequenced items
	// whole (its documentation says so), by whichever access PostgreSQL
	// finds cheaper; the held dead items it must read through their index.
	itemsScan := strings.Contains(text, "Seq Scan on crdbwork_items") && c.name != "BlockedKeys"
	switch {
	case itemsScan || strings.Contains(text, "Seq Scan on crdbwork_dead_items") ||
		strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan"):
		t.Errorf("%s (%s, %s) scans a table:\n%s", c.name, state, mode, text)
		return
	case strings.HasPrefix(c.name, "ClaimParts") && !strings.Contains(text, "crdbwork_items_part_turn"):
		t.Errorf("%s (%s, %s) does not read the per-part index crdbwork_items_part_turn:\n%s", c.name, state, mode, text)
		return
	case (strings.HasPrefix(c.name, "ClaimAny") || strings.HasPrefix(c.name, "ClaimUrgent")) && !strings.Contains(text, "crdbwork_items_turn_next"):
		t.Errorf("%s (%s, %s) does not read the claim-order index crdbwork_items_turn_next:\n%s", c.name, state, mode, text)
		return
	case c.name == "QueueSequenced" && !strings.Contains(text, "crdbwork_items_sequence_order"):
		t.Errorf("%s (%s, %s) does not probe the sequence index:\n%s", c.name, state, mode, text)
		return
	case c.name == "BlockedKeys" && !strings.Contains(text, "crdbwork_dead_items_sequence_held"):
		t.Errorf("%s (%s, %s) does not read the held dead items through their index:\n%s", c.name, state, mode, text)
		return
	}
	if claims && postgres {
		// The candidates are read in claim order, through the claim index,
		// so that the claim stops at its limit: never a bitmap scan (or a
		// sequential one) of the queue sorted afterwards.
		for _, line := range strings.Split(text, "\n") {
			if candidateScan.MatchString(line) && !strings.Contains(line, "Index Scan using crdbwork_items_turn_next on") &&
				!strings.Contains(line, "Index Scan using crdbwork_items_part_turn on") {
				t.Errorf("%s (%s, %s) reads its candidates by %q, not in claim order through the claim index:\n%s", c.name, state, mode, strings.TrimSpace(line), text)
				return
			}
		}
		if !strings.Contains(text, "hashed SubPlan") {
			t.Errorf("%s (%s, %s) does not read the queue's claimed keys once, into a hashed SubPlan:\n%s", c.name, state, mode, text)
			return
		}
		for _, bad := range []string{"Hash Join", "Hash Anti", "Hash Semi", "Materialize", "Join Filter", "Anti Join", "Merge"} {
			if strings.Contains(text, bad) {
				t.Errorf("%s (%s, %s) joins its candidates with the sequence indexes (%s) instead of one seek per candidate:\n%s", c.name, state, mode, bad, text)
				return
			}
		}
		// Every read of a sequence index is a seek by the candidate's key
		// (the index condition names h.item_key), under a Limit, in a SubPlan.
		lines := strings.Split(text, "\n")
		for _, line := range lines {
			for alias, index := range sequenceReads {
				if alias.MatchString(line) && !strings.Contains(line, "using "+index+" ") {
					t.Errorf("%s (%s, %s) reads %q other than through %s:\n%s", c.name, state, mode, strings.TrimSpace(line), index, text)
					return
				}
			}
		}
		for i, line := range lines {
			used := ""
			for _, index := range sequenceIndexes {
				if strings.Contains(line, "using "+index+" ") {
					used = index
				}
			}
			if used == "" {
				continue
			}
			cond := ""
			for j := i + 1; j < len(lines) && !strings.Contains(lines[j], "->"); j++ {
				if strings.Contains(lines[j], "Index Cond:") {
					cond = lines[j]
				}
			}
			if !candidateSeek.MatchString(cond) {
				t.Errorf("%s (%s, %s) reads %s by %q, not by the candidate's queue and key (a read of the queue's entries per candidate):\n%s",
					c.name, state, mode, used, strings.TrimSpace(cond), text)
				return
			}
			if i == 0 || !strings.Contains(lines[i-1], "Limit") {
				t.Errorf("%s (%s, %s) reads %s without a LIMIT above the seek:\n%s", c.name, state, mode, used, text)
				return
			}
		}
		if n := strings.Count(text, "SubPlan"); n < 2*3 { // each SubPlan is named twice (in the filter and as a node)
			t.Errorf("%s (%s, %s) has %d SubPlan mentions, want the three per-candidate tests as SubPlans:\n%s", c.name, state, mode, n, text)
			return
		}
	}
	if claims {
		for _, index := range sequenceIndexes {
			if !strings.Contains(text, index) {
				t.Errorf("%s (%s, %s) does not test its candidates through %s:\n%s", c.name, state, mode, index, text)
				return
			}
		}
	}
	t.Logf("%s (%s, %s):\n%s", c.name, state, mode, text)
}

// TestSequencedPlansUseIndexes seeds a sequenced queue of 100k items over
// 1,000 keys (half of the keys with their head claimed, 16 parts) beside a
// plain queue, ANALYZEs, and EXPLAINs the sequenced claims: each reads the
// claim order through its index as the plain claim does, and tests every
// candidate through the sequence indexes, one seek per candidate
// (checkSequencedPlan), in the plans for the given parameters and, on
// PostgreSQL, the generic plans.
func TestSequencedPlansUseIndexes(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	session := uuid.New()
	cases := sequencedPlanCases(t, pool, session, "q")
	check := func(state, prefix string) {
		explainEach(t, pool, prefix, cases, nil, func(i int, mode, text string) {
			checkSequencedPlan(t, cases[i], state, mode, text)
		})
	}
	// An empty, never analyzed table (where PostgreSQL may believe any
	// scan cheap), then the seeded, analyzed one.
	check("empty", "explained_seq_empty_")
	seed := []string{
		`INSERT INTO crdbwork_sessions (id, expiry) VALUES ('` + session.String() + `', INTERVAL '1 hour')`,
		`INSERT INTO crdbwork_queues (name, num_parts, sequenced) VALUES ('q', 16, true)`,
		// Key key-(g % 1000); g ascending is enqueue order, so the heads are
		// g = 1..1000. The even heads are claimed (one per key, as the
		// unique index allows).
		`INSERT INTO crdbwork_items (id, queue, part, item_key, priority, vesting_at, turn_at, enqueued_at, seq_order, tenant, payload,
		                            attempts, claim, claim_token, lease_until)
		 SELECT gen_random_uuid(), 'q', g % 16, 'key-' || (g % 1000)::TEXT, g % 3,
		        now() - (100001 - g) * INTERVAL '1 millisecond', now() - (100001 - g) * INTERVAL '1 millisecond',
		        now() - (100001 - g) * INTERVAL '1 millisecond', g,
		        CASE WHEN g % 7 = 0 THEN 'tenant-' || (g % 100)::TEXT END, '\x00'::BYTEA,
		        CASE WHEN g <= 1000 AND g % 2 = 0 THEN 1 ELSE 0 END,
		        CASE WHEN g <= 1000 AND g % 2 = 0 THEN '` + session.String() + `'::UUID END,
		        CASE WHEN g <= 1000 AND g % 2 = 0 THEN 1 ELSE 0 END,
		        CASE WHEN g <= 1000 AND g % 2 = 0 THEN now() + INTERVAL '1 minute' END
		 FROM generate_series(1, 100000) AS g`,
		`INSERT INTO crdbwork_items (id, queue, part, item_key, priority, payload)
		 SELECT gen_random_uuid(), 'other', g % 16, 'key-' || (g % 1000)::TEXT, 0, '\x00'::BYTEA FROM generate_series(1, 20000) AS g`,
		// Dead items of another queue (a dead items table of a few pages is
		// read whole, rightly), and keys key-3, key-13, ... held by a dead item.
		`INSERT INTO crdbwork_dead_items (id, queue, part, item_key, priority, attempts, max_attempts, payload, enqueued_at, reason)
		 SELECT gen_random_uuid(), 'other', 0, 'key-' || (g % 1000)::TEXT, 0, 25, 25, '\x00'::BYTEA, now() - INTERVAL '1 day', 'failed'
		 FROM generate_series(1, 20000) AS g`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, item_key, priority, attempts, max_attempts, payload, enqueued_at, reason, seq_order, seq_hold)
		 SELECT gen_random_uuid(), 'q', 0, 'key-' || (3 + 10 * g)::TEXT, 0, 25, 25, '\x00'::BYTEA, now() - INTERVAL '1 day', 'failed', 0, true
		 FROM generate_series(0, 49) AS g`,
		`ANALYZE crdbwork_items`,
		`ANALYZE crdbwork_dead_items`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	check("seeded", "explained_seq_")
}

// TestSequencedPlansInLivedDatabase: in a database that has lived (other
// queues with 120,000 items analyzed before the sequenced queue existed,
// dead tuples; internal/lived, in both states of livedOptions: the queue
// empty or holding a handful of items when the statistics were taken), a
// quiet sequenced queue gets a burst of 5,000 items over 100 keys (some
// heads claimed, some keys held by a dead item) that no statistics know
// of: PostgreSQL believes the queue holds about one row, or a handful.
// Every sequenced claim must still test each candidate with one seek by
// its key (checkSequencedPlan). The NOT EXISTS anti-joins of version 5
// failed here: PostgreSQL read every sequenced item of the queue once per
// candidate, the key being a join filter (issue 29, item 5).
func TestSequencedPlansInLivedDatabase(t *testing.T) {
	t.Parallel()
	for _, state := range []string{"tiny", "empty"} {
		t.Run(state, func(t *testing.T) {
			t.Parallel()
			pool := testdb.NewLived(t, applySchema, livedOptions[state])
			ctx := context.Background()
			session := lived.Sessions()[0]
			burst := []string{
				`INSERT INTO crdbwork_queues (name, num_parts, sequenced) VALUES ('qs', 16, true)`,
				// 5,000 items over 100 keys in enqueue order g; the heads
				// of the keys divisible by 4 are claimed.
				`INSERT INTO crdbwork_items (id, queue, part, item_key, priority, vesting_at, turn_at, enqueued_at, seq_order, payload,
				                            attempts, claim, claim_token, lease_until)
				 SELECT gen_random_uuid(), 'qs', (g % 100) % 16, 'key-' || (g % 100)::TEXT, 0,
				        now() - (5001 - g) * INTERVAL '1 millisecond', now() - (5001 - g) * INTERVAL '1 millisecond',
				        now() - (5001 - g) * INTERVAL '1 millisecond', g, '\x00'::BYTEA,
				        CASE WHEN g <= 100 AND g % 4 = 0 THEN 1 ELSE 0 END,
				        CASE WHEN g <= 100 AND g % 4 = 0 THEN '` + session.String() + `'::UUID END,
				        CASE WHEN g <= 100 AND g % 4 = 0 THEN 1 ELSE 0 END,
				        CASE WHEN g <= 100 AND g % 4 = 0 THEN now() + INTERVAL '1 minute' END
				 FROM generate_series(1, 5000) AS g`,
				`INSERT INTO crdbwork_dead_items (id, queue, part, item_key, priority, attempts, max_attempts, payload, enqueued_at, reason, seq_order, seq_hold)
				 SELECT gen_random_uuid(), 'qs', 0, 'key-' || (1 + 10 * g)::TEXT, 0, 25, 25, '\x00'::BYTEA, now() - INTERVAL '1 day', 'failed', 0, true
				 FROM generate_series(0, 9) AS g`,
			}
			for _, s := range burst {
				if _, err := pool.Exec(ctx, s); err != nil {
					t.Fatalf("%v\n%s", err, s)
				}
			}
			cases := sequencedPlanCases(t, pool, session, "qs")
			explainEach(t, pool, "explained_seq_lived_", cases, nil, func(i int, mode, text string) {
				checkSequencedPlan(t, cases[i], "lived "+state, mode, text)
			})
		})
	}
}

// TestSequencedPlansWhileDraining: the state of a drain that the bench's
// sequences experiment reaches. Statistics were taken when the sequenced
// queue held 20,000 unclaimed items over 100 keys (beside the dead tuples
// of a plain queue drained before); since, 3,000 items were acked and
// every key's head is claimed. PostgreSQL then believes that few
// candidates pass the sequence tests: with a shape whose tests it
// estimates as rare (an equality with a SubPlan's id, IS NULL of a
// SubPlan), it read the whole queue by a sequential scan and sorted it, in
// every claim, instead of reading the claim order and stopping at the
// limit (a drain at a fifth of the speed). Every sequenced claim must keep
// the shape of checkSequencedPlan.
func TestSequencedPlansWhileDraining(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	session := uuid.New()
	for _, s := range []string{
		`ALTER TABLE crdbwork_items SET (autovacuum_enabled = false)`,
		`INSERT INTO crdbwork_sessions (id, expiry) VALUES ('` + session.String() + `', INTERVAL '1 hour')`,
		`INSERT INTO crdbwork_items (id, queue, part, item_key, priority, payload)
		 SELECT gen_random_uuid(), 'plain', 0, 'key-' || (g % 100)::TEXT, 0, '\x00'::BYTEA FROM generate_series(1, 20000) AS g`,
		`DELETE FROM crdbwork_items WHERE queue = 'plain'`,
		`INSERT INTO crdbwork_queues (name, sequenced) VALUES ('q', true)`,
		`INSERT INTO crdbwork_items (id, queue, part, item_key, priority, vesting_at, turn_at, enqueued_at, seq_order, payload)
		 SELECT gen_random_uuid(), 'q', 0, 'key-' || (g % 100)::TEXT, 0,
		        now() - INTERVAL '1 minute' + (g / 5000) * INTERVAL '1 second', now() - INTERVAL '1 minute' + (g / 5000) * INTERVAL '1 second',
		        now() - INTERVAL '1 minute' + (g / 5000) * INTERVAL '1 second', g, '\x00'::BYTEA
		 FROM generate_series(0, 19999) AS g`,
		`ANALYZE crdbwork_items`,
		`DELETE FROM crdbwork_items WHERE queue = 'q' AND seq_order < 1432`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	cases := sequencedPlanCases(t, pool, session, "q")
	explainEach(t, pool, "explained_seq_draining_", cases, nil, func(i int, mode, text string) {
		checkSequencedPlan(t, cases[i], "draining", mode, text)
	})
}
