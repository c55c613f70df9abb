package partition_test

import (
	"context"
	"sync"
	"testing"

	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestEnsureParts: a queue without a stored count gets the one asked for;
// a stored count wins over later calls; racing callers all get the same
// count; bad counts are refused.
func TestEnsureParts(t *testing.T) {
	t.Parallel()
	pool := testschema.New(t)
	ctx := context.Background()
	if n, err := partition.EnsureParts(ctx, pool, crsql.Tables{}, "new", 12); err != nil || n != 12 {
		t.Fatalf("EnsureParts on a new queue: %d, %v; want 12", n, err)
	}
	if n, err := partition.EnsureParts(ctx, pool, crsql.Tables{}, "new", 3); err != nil || n != 12 {
		t.Fatalf("EnsureParts with another count: %d, %v; want the stored 12", n, err)
	}
	if n, err := partition.Parts(ctx, pool, crsql.Tables{}, "new"); err != nil || n != 12 {
		t.Fatalf("Parts: %d, %v; want 12", n, err)
	}
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "set", 5); err != nil {
		t.Fatal(err)
	}
	if n, err := partition.EnsureParts(ctx, pool, crsql.Tables{}, "set", 16); err != nil || n != 5 {
		t.Fatalf("EnsureParts after SetParts(5): %d, %v; want 5", n, err)
	}
	// Racing callers with different counts agree on one of them.
	var wg sync.WaitGroup
	got := make([]int, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := partition.EnsureParts(ctx, pool, crsql.Tables{}, "race", i+1)
			if err != nil {
				t.Error(err)
			}
			got[i] = n
		}()
	}
	wg.Wait()
	for _, n := range got {
		if n != got[0] || n < 1 || n > len(got) {
			t.Fatalf("racing EnsureParts returned %v, want one count for all", got)
		}
	}
	for _, bad := range []int{0, -1, partition.MaxParts + 1} {
		if _, err := partition.EnsureParts(ctx, pool, crsql.Tables{}, "bad", bad); err == nil {
			t.Errorf("EnsureParts(%d) succeeded", bad)
		}
	}
}
