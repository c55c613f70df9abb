package sql

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// The statements of sequenced queues (sequenceStatements; docs/sequences.md):
// the sequenced claims, and the queue's switch. Errors are the driver's, as
// in store_claim.go.

// ClaimAnySequenced is ClaimAny for a sequenced queue: an item with a
// sequence order is claimed only if it is its key's first and no item of its
// key is claimed (sequenceStatements.ClaimAny). Run it as ClaimAny; a unique
// violation on the sequence index (IsSequenceConflict) means another claim
// took an item of the same key at the same time: nothing was claimed, run it
// again.
func (s *Store) ClaimAnySequenced(ctx context.Context, db DB, d Dialect, a ClaimArgs) ([]ClaimedRow, error) {
	return queryClaimed(ctx, db, a.Limit, s.seq.ClaimAnyFor(d), a.params()...)
}

// ClaimPartsSequenced is ClaimParts for a sequenced queue
// (sequenceStatements.ClaimParts): 1 to MaxPartBranches distinct owned
// parts (it panics otherwise). Run it as ClaimAnySequenced.
func (s *Store) ClaimPartsSequenced(ctx context.Context, db DB, d Dialect, a ClaimArgs, parts []int64) ([]ClaimedRow, error) {
	args := a.params()
	for _, p := range parts {
		args = append(args, p)
	}
	return queryClaimed(ctx, db, a.Limit, s.seq.ClaimParts(d, len(parts)), args...)
}

// ClaimUrgentSequenced is ClaimUrgent for a sequenced queue
// (sequenceStatements.ClaimUrgent). Run it as ClaimAnySequenced.
func (s *Store) ClaimUrgentSequenced(ctx context.Context, db DB, d Dialect, a UrgentArgs) ([]ClaimedRow, error) {
	owned := make([]int64, len(a.OwnedParts))
	for i, p := range a.OwnedParts {
		owned[i] = int64(p)
	}
	args := append(a.params(), int64(a.MaxPriority), a.AllTenantsLimited, orEmpty(a.LimitedTenants), owned)
	return queryClaimed(ctx, db, a.Limit, s.seq.ClaimUrgentFor(d), args...)
}

// SetSequenced turns sequencing of queue on or off
// (sequenceStatements.SetSequenced).
func (s *Store) SetSequenced(ctx context.Context, db DB, queue string, on bool) error {
	_, err := db.Exec(ctx, s.seq.SetSequenced, queue, on)
	return err
}

// QueueSequenced reports whether queue is sequenced and whether it holds
// sequenced items (sequenceStatements.Sequenced).
func (s *Store) QueueSequenced(ctx context.Context, db DB, queue string) (on, items bool, err error) {
	err = db.QueryRow(ctx, s.seq.Sequenced, queue).Scan(&on, &items)
	return on, items, err
}

// IsSequenceConflict reports whether err is a unique violation on the index
// that holds at most one claimed item per key of sequenced items
// (SequenceClaimedIndex, under this Store's prefix): a claim that would have
// put a second item of a key in flight, and changed nothing.
func (s *Store) IsSequenceConflict(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		return false
	}
	name := s.t.prefix() + SequenceClaimedIndex
	return pgErr.ConstraintName == name || strings.Contains(pgErr.Message, name)
}
