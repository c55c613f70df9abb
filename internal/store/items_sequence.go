package store

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The statements of sequenced queues (sequenceStatements; docs/sequences.md):
// the sequenced claims, and the queue's switch. Errors are the driver's, as
// in items_claim.go.

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

// setSequencedSQL is the text of sequenceStatements.SetSequenced
// (rendered by newSequenceStatements).
const setSequencedSQL = `INSERT INTO crdbwork_queues AS q (name, sequenced) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET sequenced = excluded.sequenced`

// SetSequenced turns sequencing of queue on or off
// (sequenceStatements.SetSequenced).
func (s *Store) SetSequenced(ctx context.Context, db DB, queue string, on bool) error {
	_, err := db.Exec(ctx, s.seq.SetSequenced, queue, on)
	return err
}

// sequencedSQL is the text of sequenceStatements.Sequenced
// (rendered by newSequenceStatements).
const sequencedSQL = `SELECT COALESCE((SELECT sequenced FROM crdbwork_queues WHERE name = $1), false),
       EXISTS (SELECT 1 FROM (SELECT item_key FROM crdbwork_items WHERE queue = $1 AND seq_order IS NOT NULL
                              ORDER BY item_key LIMIT 1) AS first),
       COALESCE((SELECT sequence_hold FROM crdbwork_queues WHERE name = $1), false)`

// QueueSequenced reports whether queue is sequenced and whether it holds
// sequenced items (sequenceStatements.Sequenced).
func (s *Store) QueueSequenced(ctx context.Context, db DB, queue string) (on, items bool, err error) {
	var hold bool
	err = db.QueryRow(ctx, s.seq.Sequenced, queue).Scan(&on, &items, &hold)
	return on, items, err
}

// SequenceSettings is what QueueSequencing reads of a queue's sequencing.
type SequenceSettings struct {
	On    bool // the queue is sequenced
	Items bool // it holds sequenced items
	Hold  bool // a death of a sequenced item holds its key
}

// QueueSequencing reads the sequencing of queue
// (sequenceStatements.Sequenced).
func (s *Store) QueueSequencing(ctx context.Context, db DB, queue string) (SequenceSettings, error) {
	var st SequenceSettings
	err := db.QueryRow(ctx, s.seq.Sequenced, queue).Scan(&st.On, &st.Items, &st.Hold)
	return st, err
}

// setHoldSQL is the text of sequenceStatements.SetHold
// (rendered by newSequenceStatements).
const setHoldSQL = `INSERT INTO crdbwork_queues AS q (name, sequence_hold) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET sequence_hold = excluded.sequence_hold`

// releaseAllSQL is the text of sequenceStatements.ReleaseAll
// (rendered by newSequenceStatements).
const releaseAllSQL = `UPDATE crdbwork_dead_items SET seq_hold = false WHERE queue = $1 AND seq_hold RETURNING id`

// SetSequenceHold sets what a death of one of queue's sequenced items does
// to its key (sequenceStatements.SetHold); with hold false it also releases
// the keys the queue's dead items hold (ReleaseAll) and returns how many
// dead items it released. Run it in a transaction, so that both change
// together.
func (s *Store) SetSequenceHold(ctx context.Context, db DB, queue string, hold bool) (released int, err error) {
	if _, err := db.Exec(ctx, s.seq.SetHold, queue, hold); err != nil {
		return 0, err
	}
	if hold {
		return 0, nil
	}
	tag, err := db.Exec(ctx, s.seq.ReleaseAll, queue)
	return int(tag.RowsAffected()), err
}

// sequenceReleaseSQL is the text of sequenceStatements.Release
// (rendered by newSequenceStatements).
const sequenceReleaseSQL = `UPDATE crdbwork_dead_items SET seq_hold = false WHERE queue = $1 AND item_key = $2 AND seq_hold RETURNING id`

// ReleaseSequenceKey releases key of queue from the dead items that hold
// it (sequenceStatements.Release) and returns their ids (none: the key was
// not held).
func (s *Store) ReleaseSequenceKey(ctx context.Context, db DB, queue, key string) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, s.seq.Release, queue, key)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// BlockedKeyRow is one row of BlockedKeys.
type BlockedKeyRow struct {
	Key       string
	ID        uuid.UUID
	Kind      string // "dead", "retry" or "delayed"
	Reason    string // the death's reason (kind "dead")
	LastError string
	At        time.Time // when it died (dead), or when it vests (retry, delayed)
	Attempts  int
}

// blockedSQL is the text of sequenceStatements.Blocked
// (rendered by newSequenceStatements).
const blockedSQL = `SELECT key, id, kind, reason, last_error, at, attempts FROM (
    (SELECT d.item_key AS key, d.id, 'dead' AS kind, d.reason, COALESCE(d.last_error, '') AS last_error, d.died_at AS at, d.attempts
     FROM crdbwork_dead_items AS d
     WHERE d.queue = $1 AND d.seq_hold
     ORDER BY d.item_key, d.enqueued_at, d.seq_order, d.id
     LIMIT $2)
    UNION ALL
    (SELECT h.item_key, h.id, CASE WHEN h.attempts > 0 THEN 'retry' ELSE 'delayed' END, '', COALESCE(h.last_error, ''), h.vesting_at, h.attempts
     FROM crdbwork_items AS h
     WHERE h.queue = $1 AND h.seq_order IS NOT NULL AND h.claim IS NULL AND h.vesting_at > now()
       AND h.id = (SELECT sb.id FROM crdbwork_items AS sb
                   WHERE sb.queue = h.queue AND sb.item_key = h.item_key AND sb.seq_order IS NOT NULL
                   ORDER BY sb.enqueued_at, sb.seq_order, sb.id
                   LIMIT 1)
     ORDER BY h.item_key, h.enqueued_at, h.seq_order, h.id
     LIMIT $2)) AS b
ORDER BY key, kind, id
LIMIT $2`

// BlockedKeys lists up to limit blocked keys of queue
// (sequenceStatements.Blocked).
func (s *Store) BlockedKeys(ctx context.Context, db DB, queue string, limit int) ([]BlockedKeyRow, error) {
	rows, err := db.Query(ctx, s.seq.Blocked, queue, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (BlockedKeyRow, error) {
		var b BlockedKeyRow
		var attempts int64
		err := r.Scan(&b.Key, &b.ID, &b.Kind, &b.Reason, &b.LastError, &b.At, &attempts)
		b.Attempts = int(attempts)
		return b, err
	})
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
	name := prefix(s.t) + SequenceClaimedIndex
	return pgErr.ConstraintName == name || strings.Contains(pgErr.Message, name)
}
