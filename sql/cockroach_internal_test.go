package sql

import (
	"strings"
	"testing"
)

// TestCockroachIndexesMatchFiles: every statement that has a CockroachDB
// form (cockroachIndexes) is in schema.sql and in the migration that first
// creates the index, exactly as written there, so that ApplyWith replaces
// it on both paths (a fresh install and an upgrade); the CockroachDB forms
// are in sql/cockroach.sql for the cockroach CLI; and the rendered schema
// for CockroachDB creates no plain claim index, with default names and with
// a schema and prefix.
func TestCockroachIndexesMatchFiles(t *testing.T) {
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
