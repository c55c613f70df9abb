package sql

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/internal/names"
)

// TestCockroachIndexesMatchFiles: every statement that has a CockroachDB
// form (cockroachIndexes) is in schema.sql and in the migration that first
// creates the index, exactly as written there, so that ApplyWith replaces
// it on both paths (a fresh install and an upgrade); the CockroachDB forms
// are in sql/cockroach.sql for the cockroach CLI; and the rendered schema
// for CockroachDB creates no plain claim index, with default names and with
// a schema and prefix.
func TestCockroachIndexesMatchFiles(t *testing.T) {
	t.Parallel()
	count := func(list []string, s string) int {
		n := 0
		for _, l := range list {
			if sameStatement(l, s) {
				n++
			}
		}
		return n
	}
	var m3 []string
	for _, m := range Migrations() {
		if m.Version == 3 {
			m3 = statements(m.SQL)
		}
	}
	schema, crdb := statements(schemaFile), statements(cockroachFile)
	for _, c := range cockroachIndexes {
		if count(schema, c.portable) != 1 || count(m3, c.portable) != 1 {
			t.Errorf("schema.sql has %d and migration 3 has %d copies of\n%s\nwant 1 each: ApplyWith would not replace it", count(schema, c.portable), count(m3, c.portable), c.portable)
		}
		for _, w := range c.with {
			if count(crdb, w) != 1 {
				t.Errorf("sql/cockroach.sql lacks\n%s", w)
			}
		}
	}
	for _, tb := range []Tables{{}, {Schema: "Work Queue", Prefix: "app_"}} {
		for _, file := range [][]string{statements(tb.rewrite(schemaFile)), Migrations()[2].Statements(tb)} {
			out := strings.ReplaceAll(strings.Join(cockroachForms(file, tb), "\n"), `"`, "")
			for _, name := range []string{"items_turn_next", "items_part_turn"} {
				plain := tb.prefix() + name + "\n"
				stored := tb.prefix() + name + "_stored"
				if strings.Contains(out, "CREATE INDEX IF NOT EXISTS "+plain) || !strings.Contains(out, "CREATE INDEX IF NOT EXISTS "+stored) {
					t.Errorf("%+v: the CockroachDB schema creates the plain %s, or not %s:\n%s", tb, plain, stored, out)
				}
			}
			if !strings.Contains(out, "STORING (vesting_at, attempts, max_attempts, expires_at, tenant)") {
				t.Errorf("%+v: no covering index in the CockroachDB schema", tb)
			}
		}
	}
}

// gcTables are the tables sql/cockroach.sql gives a short garbage-collection
// TTL: those whose rows are deleted (or rewritten) at the rate of the work,
// and read from where the deleted entries lie (see the file's comments).
// writtenRarely are the others, with why they need none. A new table must
// be one or the other.
var (
	gcTables = []string{"sessions", "session_parts", "items", "ended", "dead_items", "waiting", "waits_for", "cancelled_items", "waits_across", "reaps", "attempt_errors"}

	writtenRarely = map[string]string{
		"queues":         "settings, written by operators",
		"tenant_limits":  "limits, written by operators",
		"schedules":      "one update per schedule run",
		"session_queues": "one row per session and queue, written when a session joins or leaves",
		"schema_version": "one row, written by upgrades",
		"audit":          "inserts by operators' actions, pruned rarely",
	}
)

// zoneStatement is the only form of the zone settings in sql/cockroach.sql.
var zoneStatement = regexp.MustCompile(`^ALTER TABLE (.+) CONFIGURE ZONE USING gc\.ttlseconds = ([0-9]+);$`)

// sql/cockroach.sql is made of the statements it should be, each
// well-formed (CockroachDB's grammar cannot be run here; the forms are
// those of its docs, "ALTER TABLE … CONFIGURE ZONE" and "CREATE INDEX …
// STORING"): the covering claim indexes and the drops of the plain ones
// (TestCockroachIndexesMatchFiles), and one zone setting per table whose
// rows churn, with a TTL of at least the 600 s CockroachDB's docs advise as
// the lowest, each on a table of the schema; the tables classified, every
// one, as churned or written rarely. Rendered for a schema and a prefix,
// every name is renamed and the tables qualified.
func TestCockroachSettingsWellFormed(t *testing.T) {
	t.Parallel()
	var indexForms []string
	for _, c := range cockroachIndexes {
		indexForms = append(indexForms, c.with...)
	}
	for _, name := range names.Tables() {
		_, rare := writtenRarely[name]
		if rare == slices.Contains(gcTables, name) {
			t.Errorf("table %s is in neither or both of gcTables and writtenRarely: decide whether sql/cockroach.sql gives it a GC TTL", name)
		}
	}
	for _, tb := range []Tables{{}, {Schema: "Work Queue", Prefix: "app_"}} {
		configured := map[string]bool{}
		for _, s := range statements(tb.rewrite(cockroachFile)) {
			if slices.ContainsFunc(indexForms, func(f string) bool { return sameStatement(s, tb.rewrite(f)) }) {
				continue
			}
			m := zoneStatement.FindStringSubmatch(s)
			if m == nil {
				t.Errorf("%+v: sql/cockroach.sql has a statement of no known form:\n%s", tb, s)
				continue
			}
			if ttl, _ := strconv.Atoi(m[2]); ttl < 600 {
				t.Errorf("%+v: %s: a GC TTL of %d s, below 600", tb, m[1], ttl)
			}
			var table string
			for _, name := range gcTables {
				if m[1] == tb.Table(name) {
					table = name
				}
			}
			if table == "" || configured[table] {
				t.Errorf("%+v: a zone setting of %s, not a table of gcTables or set twice", tb, m[1])
			}
			configured[table] = true
		}
		for _, name := range gcTables {
			if !configured[name] {
				t.Errorf("%+v: sql/cockroach.sql gives %s no GC TTL", tb, tb.Table(name))
			}
		}
	}
}
