package sql

import "strings"

// cockroachIndexes are the claim indexes as CockroachDB gets them: covering
// the claims' residual filter columns (vesting_at, attempts, max_attempts,
// expires_at, tenant), so that a claim's scan of crdbwork_items_turn_next or
// crdbwork_items_part_turn filters its entries in the index itself and
// stops at its limit, with no lookup of the primary index for each entry
// it reads (an index join below the limit, which CockroachDB can only give
// a soft limit: it reads and locks entries in batches). CockroachDB docs
// checked: "CREATE INDEX", STORING (alias COVERING, and INCLUDE since 20.1)
// before the partial index's WHERE.
//
// PostgreSQL keeps the plain indexes of schema.sql: its index scans apply
// such filters only after fetching the heap tuple, which FOR UPDATE SKIP
// LOCKED must visit anyway to lock the row (an index-only scan cannot
// lock), so INCLUDE would gain a claim nothing there, and it doubled both
// indexes (24 MB to 47 MB for 400,000 items, measured on PostgreSQL 15).
//
// The covering indexes have names of their own (the plain name with
// "_stored"): ApplyWith runs their statements on CockroachDB in place of
// schema.sql's (and the migrations') statement that creates the plain
// index, and drops the plain one if an older version made it. Both are
// idempotent, so applying the schema again changes nothing and builds no
// index. sql/cockroach.sql carries the same statements for the cockroach
// CLI (TestCockroachIndexesMatchFiles).
var cockroachIndexes = []struct {
	portable string   // the statement of schema.sql and migration 0003 it replaces
	with     []string // what ApplyWith runs instead on CockroachDB
}{
	{
		portable: `CREATE INDEX IF NOT EXISTS crdbwork_items_turn_next
    ON crdbwork_items (queue, priority, turn_at, part) WHERE claim IS NULL;`,
		with: []string{
			`CREATE INDEX IF NOT EXISTS crdbwork_items_turn_next_stored
    ON crdbwork_items (queue, priority, turn_at, part)
    STORING (vesting_at, attempts, max_attempts, expires_at, tenant) WHERE claim IS NULL;`,
			`DROP INDEX IF EXISTS crdbwork_items_turn_next;`,
		},
	},
	{
		portable: `CREATE INDEX IF NOT EXISTS crdbwork_items_part_turn
    ON crdbwork_items (queue, part, priority, turn_at) WHERE claim IS NULL;`,
		with: []string{
			`CREATE INDEX IF NOT EXISTS crdbwork_items_part_turn_stored
    ON crdbwork_items (queue, part, priority, turn_at)
    STORING (vesting_at, attempts, max_attempts, expires_at, tenant) WHERE claim IS NULL;`,
			`DROP INDEX IF EXISTS crdbwork_items_part_turn;`,
		},
	},
}

// cockroachForms returns stmts (rendered for t) with the statements that
// have a CockroachDB form (cockroachIndexes) replaced by it.
func cockroachForms(stmts []string, t Tables) []string {
	out := make([]string, 0, len(stmts)+len(cockroachIndexes))
	for _, s := range stmts {
		replaced := false
		for _, c := range cockroachIndexes {
			if sameStatement(s, t.rewrite(c.portable)) {
				for _, w := range c.with {
					out = append(out, t.rewrite(w))
				}
				replaced = true
				break
			}
		}
		if !replaced {
			out = append(out, s)
		}
	}
	return out
}

// sameStatement compares two statements ignoring differences in white space.
func sameStatement(a, b string) bool {
	return strings.Join(strings.Fields(a), " ") == strings.Join(strings.Fields(b), " ")
}
