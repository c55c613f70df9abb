package store

import (
	"slices"
	"testing"

	"github.com/crdbwork/crdbwork/internal/names"
)

// TestDemoDropsEveryTable: the demo's --drop-schema drops every table of the
// schema (a table added to the schema but not to demoTableOrder was left
// behind: cmd/demo's TestCleanup found three after schema version 5).
func TestDemoDropsEveryTable(t *testing.T) {
	t.Parallel()
	for _, name := range names.Tables() {
		if !slices.Contains(demoTableOrder, name) {
			t.Errorf("demoTableOrder does not drop the table %q", name)
		}
	}
	if len(demoTableOrder) != len(names.Tables()) {
		t.Errorf("demoTableOrder lists %d tables, the schema has %d", len(demoTableOrder), len(names.Tables()))
	}
}
