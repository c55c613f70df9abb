package sql

import (
	"slices"
	"testing"

	"github.com/crdbwork/crdbwork/internal/names"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// The test harness's CockroachDB fault model (internal/testdb) reaches
// every crdbwork table but the version table: its list is the schema's.
func TestFaultModelTables(t *testing.T) {
	t.Parallel()
	var want []string
	for _, name := range names.Tables() {
		if name != "schema_version" {
			want = append(want, name)
		}
	}
	got := testdb.FaultTableSuffixes()
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("testdb.FaultTableSuffixes() = %v, want the schema's tables but the version table: %v", got, want)
	}
}
