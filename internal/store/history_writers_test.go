package store_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestOnlyFailuresWriteAttemptErrors: of the statements of the claim,
// death, dedup, move and reap sets, exactly the failure paths name
// crdbwork_attempt_errors (nack, permanent failure, dead letter, the lease
// reaper's releases, the dead item's requeue), besides the prune turn's
// read, and no ack, take or extend does: the history adds nothing to the
// ack (docs/history.md, "What it costs").
func TestOnlyFailuresWriteAttemptErrors(t *testing.T) {
	t.Parallel()
	tables := crsql.Tables{}
	sets := map[string]any{
		"core": store.NewStatements(tables), "death": store.NewDeathStatements(tables), "dedup": store.NewDedupStatements(tables),
		"move": store.NewMoveStatements(tables), "reap": store.NewReapStatements(tables),
	}
	var writers []string
	for set, st := range sets {
		v := reflect.ValueOf(st).Elem()
		for i := 0; i < v.NumField(); i++ {
			f := v.Field(i)
			if f.Kind() != reflect.String {
				continue
			}
			name := v.Type().Field(i).Name
			text := f.String()
			if !strings.Contains(text, "crdbwork_attempt_errors") {
				continue
			}
			writers = append(writers, set+"."+name)
			if strings.Contains(name, "Ack") || strings.Contains(name, "Take") || strings.Contains(name, "Extend") {
				t.Errorf("%s.%s names crdbwork_attempt_errors:\n%s", set, name, text)
			}
		}
	}
	slices.Sort(writers)
	// core.QueuePrunesDue only reads it: the prune turn's test of whether
	// its prune has rows to delete.
	want := []string{"core.DeadLetter", "core.Nack", "core.PostgresReapLeases", "core.QueuePrunesDue", "core.ReapLeases", "core.Requeue",
		"death.Exhaust", "death.ReapLeasesIDs"}
	if !slices.Equal(writers, want) {
		t.Errorf("the statements that name crdbwork_attempt_errors: %q; want %q", writers, want)
	}
}
