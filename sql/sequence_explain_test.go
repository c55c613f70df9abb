package sql_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestSequencedStatements: each sequenced claim is its plain claim with the
// scan aliased h and the sequence condition added, nothing else, so that
// it follows every change made to the plain claims; the texts are rendered
// for other table names too.
func TestSequencedStatements(t *testing.T) {
	for _, tables := range []crsql.Tables{{}, {Schema: "work", Prefix: "jobs_"}} {
		seq := crsql.NewSequenceStatements(tables)
		st := crsql.NewStatements(tables)
		parts := crsql.NewPartClaimStatements(tables)
		urgent := crsql.NewUrgentStatements(tables)
		prefix := "crdbwork_"
		if tables.Prefix != "" {
			prefix = tables.Prefix
		}
		for _, d := range []crsql.Dialect{crsql.Cockroach, crsql.Postgres} {
			pairs := map[string][2]string{
				"ClaimAny":     {seq.ClaimAnyFor(d), st.ForDialect(d).ClaimAny},
				"ClaimUrgent":  {seq.ClaimUrgentFor(d), urgent.ForDialect(d)},
				"ClaimParts1":  {seq.ClaimParts(d, 1), parts.Claim(d, 1)},
				"ClaimParts16": {seq.ClaimParts(d, crsql.MaxPartBranches), parts.Claim(d, crsql.MaxPartBranches)},
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
					i := strings.Index(back, "NOT EXISTS (SELECT 1 FROM ")
					j := strings.Index(back[i:], "sc.claim IS NOT NULL)\n              AND ")
					if i < 0 || j < 0 {
						t.Fatalf("%v %s: condition not found:\n%s", d, name, back)
					}
					back = back[:i] + back[i+j+len("sc.claim IS NOT NULL)\n              AND "):]
					back = strings.Replace(back, " AS h\n", "\n", 1)
				}
				if back != plain {
					t.Errorf("%v %s: the sequenced claim differs from the plain one by more than its condition:\n%s\nplain:\n%s", d, name, back, plain)
				}
			}
		}
	}
}

// TestSequencedPlansUseIndexes seeds a sequenced queue of 100k items over
// 1,000 keys (half of the keys with their head claimed, 16 parts) beside a
// plain queue, ANALYZEs, and EXPLAINs the sequenced claims: each reads the
// claim order through its index as the plain claim does, and tests every
// candidate through the two sequence indexes (lookups, never a scan of the
// items table), in the plans for the given parameters and, on PostgreSQL,
// the generic plans.
func TestSequencedPlansUseIndexes(t *testing.T) {
	pool := testdb.New(t)
	ctx := context.Background()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	session := uuid.New()
	dialect, err := crsql.DetectDialect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	seq := crsql.NewSequenceStatements(crsql.Tables{})
	lease := int64(300e6)
	cases := []planCase{
		{"ClaimAnySequenced", seq.ClaimAnyFor(dialect), []any{session, "q", 64, lease, []string{}}},
		{"ClaimAnySequenced (1000)", seq.ClaimAnyFor(dialect), []any{session, "q", 1000, lease, []string{}}},
		{"ClaimAnySequenced (tenants skipped)", seq.ClaimAnyFor(dialect), []any{session, "q", 64, lease, []string{"tenant-7", "tenant-14"}}},
		{"ClaimPartsSequenced", seq.ClaimParts(dialect, 4), []any{session, "q", 64, lease, []string{}, int64(3), int64(4), int64(5), int64(6)}},
		{"ClaimPartsSequenced (one part)", seq.ClaimParts(dialect, 1), []any{session, "q", 64, lease, []string{}, int64(7)}},
		{"ClaimUrgentSequenced", seq.ClaimUrgentFor(dialect), []any{session, "q", 64, lease, []string{}, int64(1), false, []string{}, []int64{}}},
		{"QueueSequenced", seq.Sequenced, []any{"q"}},
		{"SetSequenced", seq.SetSequenced, []any{"q", true}},
	}
	check := func(state, prefix string) {
		explainEach(t, pool, prefix, cases, nil, func(i int, mode, text string) {
			c := cases[i]
			claims := strings.HasPrefix(c.name, "Claim")
			switch {
			case strings.Contains(text, "Seq Scan on crdbwork_items") || strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan"):
				t.Errorf("%s (%s, %s) scans the items table:\n%s", c.name, state, mode, text)
			case strings.HasPrefix(c.name, "ClaimParts") && !strings.Contains(text, "crdbwork_items_part_turn"):
				t.Errorf("%s (%s, %s) does not read the per-part index crdbwork_items_part_turn:\n%s", c.name, state, mode, text)
			case (strings.HasPrefix(c.name, "ClaimAny") || strings.HasPrefix(c.name, "ClaimUrgent")) && !strings.Contains(text, "crdbwork_items_turn_next"):
				t.Errorf("%s (%s, %s) does not read the claim-order index crdbwork_items_turn_next:\n%s", c.name, state, mode, text)
			case claims && (!strings.Contains(text, "crdbwork_items_sequence_order") || !strings.Contains(text, "crdbwork_items_sequence_claimed")):
				t.Errorf("%s (%s, %s) does not test its candidates through both sequence indexes:\n%s", c.name, state, mode, text)
			case claims && testdb.Kind(t) == "postgres" && strings.Contains(text, "Hash"):
				t.Errorf("%s (%s, %s) hashes a side of its anti-joins (a scan of every sequenced item):\n%s", c.name, state, mode, text)
			case c.name == "QueueSequenced" && !strings.Contains(text, "crdbwork_items_sequence_order"):
				t.Errorf("%s (%s, %s) does not probe the sequence index:\n%s", c.name, state, mode, text)
			default:
				t.Logf("%s (%s, %s):\n%s", c.name, state, mode, text)
			}
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
		`ANALYZE crdbwork_items`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	check("seeded", "explained_seq_")
}
