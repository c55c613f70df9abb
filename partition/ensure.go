package partition

import (
	"context"
	"fmt"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// EnsureParts gives queue n parts if it has no stored part count yet, and
// returns the count stored afterwards: n, or the count stored before, which
// wins (change it with SetParts). Two callers racing with different counts
// both get the one that was stored first.
func EnsureParts(ctx context.Context, db crsql.DB, t crsql.Tables, queue string, n int) (int, error) {
	if n < 1 || n > MaxParts {
		return 0, fmt.Errorf("partition: %d parts for %q: the number of parts must be between 1 and %d", n, queue, MaxParts)
	}
	stmts := store.New(t)
	var stored int
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		if _, err := stmts.PartsCountInsert(ctx, db, queue, n); err != nil {
			return err
		}
		var err error
		stored, err = stmts.PartsCount(ctx, db, queue)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("partition: storing %d parts for %q: %w", n, queue, store.Classify(err))
	}
	return stored, nil
}
