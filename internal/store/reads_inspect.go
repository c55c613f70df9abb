package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The reads of one queue's state (claim.Queue.Inspect, claim.Queues), its
// settings, pause and tenant limits, and their writes. Errors are the
// driver's, as in items_claim.go.

// QueueRow is a queue's stored row, as InspectQueue reads it.
type QueueRow struct {
	// Stored reports whether the queue has a row in the queues table.
	Stored bool
	// NumParts is the stored part count (1 without a row).
	NumParts int
	// Paused reports a paused queue (false without a row).
	Paused bool
}

// InspectQueue reads queue's stored row (inspectStatements.Queue): a
// primary-key lookup.
func (s *Store) InspectQueue(ctx context.Context, db DB, queue string) (QueueRow, error) {
	var r QueueRow
	var numParts int64
	if err := db.QueryRow(ctx, s.insp.Queue, queue).Scan(&r.Stored, &numParts, &r.Paused); err != nil {
		return QueueRow{}, err
	}
	r.NumParts = int(numParts)
	return r, nil
}

// UnclaimedPart is one part's unclaimed items, as InspectUnclaimed reads
// them.
type UnclaimedPart struct {
	Part int
	// Unclaimed items, of which Due are past their vesting time.
	Unclaimed, Due int64
	// OldestDue is the vesting time of the oldest due item (nil if none is
	// due), and Now the database clock when it was read.
	OldestDue *time.Time
	Now       time.Time
}

// InspectUnclaimed reads queue's unclaimed items by part, ordered by part
// (inspectStatements.Unclaimed). It reads every unclaimed item of the
// queue: its entries in crdbwork_items_part_turn, and each row's
// vesting_at.
func (s *Store) InspectUnclaimed(ctx context.Context, db DB, queue string) ([]UnclaimedPart, error) {
	rows, err := db.Query(ctx, s.insp.Unclaimed, queue)
	if err != nil {
		return nil, err
	}
	var out []UnclaimedPart
	var p int64
	var oldest *time.Time
	var u UnclaimedPart
	if _, err := pgx.ForEachRow(rows, []any{&p, &u.Unclaimed, &u.Due, &oldest, &u.Now}, func() error {
		u.Part, u.OldestDue = int(p), nil
		if oldest != nil {
			t := *oldest // a copy of its own: the scan may reuse oldest
			u.OldestDue = &t
		}
		out = append(out, u)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// ClaimedPart counts the items of one part that one session holds, as
// InspectClaimed reads them.
type ClaimedPart struct {
	Part    int
	Session uuid.UUID
	Claimed int64
}

// InspectClaimed reads queue's claimed items by part and session, ordered
// by part and session (inspectStatements.Claimed): only the queue's
// claimed items, through crdbwork_items_lease.
func (s *Store) InspectClaimed(ctx context.Context, db DB, queue string) ([]ClaimedPart, error) {
	rows, err := db.Query(ctx, s.insp.Claimed, queue)
	if err != nil {
		return nil, err
	}
	var out []ClaimedPart
	var p int64
	var c ClaimedPart
	if _, err := pgx.ForEachRow(rows, []any{&p, &c.Session, &c.Claimed}, func() error {
		c.Part = int(p)
		out = append(out, c)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// TenantBacklog is one tenant's unclaimed items, as InspectTenants reads
// them.
type TenantBacklog struct {
	Tenant string
	// Unclaimed items, of which Due are past their vesting time.
	Unclaimed, Due int64
}

// InspectTenants reads the at most limit tenants of queue with the most
// unclaimed items, most first, then by name (inspectStatements.Tenants).
// Items without a tenant are not counted. It reads every unclaimed item of
// the queue that has a tenant (crdbwork_items_tenant_turn and each row's
// vesting_at).
func (s *Store) InspectTenants(ctx context.Context, db DB, queue string, limit int) ([]TenantBacklog, error) {
	rows, err := db.Query(ctx, s.insp.Tenants, queue, limit)
	if err != nil {
		return nil, err
	}
	var out []TenantBacklog
	var t TenantBacklog
	if _, err := pgx.ForEachRow(rows, []any{&t.Tenant, &t.Unclaimed, &t.Due}, func() error {
		out = append(out, t)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// InspectDead counts the deaths of queue (inspectStatements.DeadCount):
// the queue's entries of crdbwork_dead_items_by_queue.
func (s *Store) InspectDead(ctx context.Context, db DB, queue string) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, s.insp.DeadCount, queue).Scan(&n)
	return n, err
}

// StoredQueues returns the names of the queues with a row in the queues
// table after after, in order, at most limit of them
// (inspectStatements.StoredQueues).
func (s *Store) StoredQueues(ctx context.Context, db DB, after string, limit int) ([]string, error) {
	rows, err := db.Query(ctx, s.insp.StoredQueues, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// NextUnclaimedQueue returns the smallest queue name after after that has
// unclaimed items, and false if there is none: one index seek
// (inspectStatements.NextUnclaimedQueue).
func (s *Store) NextUnclaimedQueue(ctx context.Context, db DB, after string) (string, bool, error) {
	return nextQueue(ctx, db, s.insp.NextUnclaimedQueue, after)
}

// NextClaimedQueue is NextUnclaimedQueue for claimed items
// (inspectStatements.NextClaimedQueue).
func (s *Store) NextClaimedQueue(ctx context.Context, db DB, after string) (string, bool, error) {
	return nextQueue(ctx, db, s.insp.NextClaimedQueue, after)
}

// NextDeadQueue is NextUnclaimedQueue for dead items
// (inspectStatements.NextDeadQueue).
func (s *Store) NextDeadQueue(ctx context.Context, db DB, after string) (string, bool, error) {
	return nextQueue(ctx, db, s.insp.NextDeadQueue, after)
}

func nextQueue(ctx context.Context, db DB, stmt, after string) (string, bool, error) {
	var n *string
	if err := db.QueryRow(ctx, stmt, after).Scan(&n); err != nil || n == nil {
		return "", false, err
	}
	return *n, true, nil
}

// QueueSettingsRow is a queue's stored settings.
type QueueSettingsRow struct {
	Fair, AtMostOnce  bool
	MaxInFlight       int64
	Rate              float64
	TenantMaxInFlight int64
	TenantRate        float64
	// DedupWindow is how long the queue remembers ended ids, at
	// microsecond precision (0: none).
	DedupWindow time.Duration
}

// QueueSettings reads queue's settings, and false if it has no row
// (coreStatements.QueueSettings).
func (s *Store) QueueSettings(ctx context.Context, db DB, queue string) (QueueSettingsRow, bool, error) {
	var r QueueSettingsRow
	var window int64
	err := db.QueryRow(ctx, s.st.QueueSettings, queue).Scan(&r.Fair, &r.AtMostOnce, &r.MaxInFlight, &r.Rate,
		&r.TenantMaxInFlight, &r.TenantRate, &window)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return QueueSettingsRow{}, false, nil
	case err != nil:
		return QueueSettingsRow{}, false, err
	}
	r.DedupWindow = time.Duration(window) * time.Microsecond
	return r, true, nil
}

// ConfigureQueue stores queue's settings, replacing all of them; a queue
// without a row gets one, with one part (coreStatements.ConfigureQueue).
func (s *Store) ConfigureQueue(ctx context.Context, db DB, queue string, r QueueSettingsRow) error {
	_, err := db.Exec(ctx, s.st.ConfigureQueue, queue, r.Fair, r.AtMostOnce,
		r.MaxInFlight, r.Rate, r.TenantMaxInFlight, r.TenantRate, r.DedupWindow.Microseconds())
	return err
}

// QueuePaused reads whether queue is paused (coreStatements.QueuePaused).
func (s *Store) QueuePaused(ctx context.Context, db DB, queue string) (bool, error) {
	var paused bool
	err := db.QueryRow(ctx, s.st.QueuePaused, queue).Scan(&paused)
	return paused, err
}

// PauseQueue pauses or resumes queue (coreStatements.PauseQueue).
func (s *Store) PauseQueue(ctx context.Context, db DB, queue string, paused bool) error {
	_, err := db.Exec(ctx, s.st.PauseQueue, queue, paused)
	return err
}

// TenantLimitRow is one tenant's own limit on a queue.
type TenantLimitRow struct {
	Tenant      string
	MaxInFlight int64
	Rate        float64
}

// TenantLimits reads queue's tenant limits, ordered by tenant
// (limitStatements.TenantLimits).
func (s *Store) TenantLimits(ctx context.Context, db DB, queue string) ([]TenantLimitRow, error) {
	rows, err := db.Query(ctx, s.lim.TenantLimits, queue)
	if err != nil {
		return nil, err
	}
	var out []TenantLimitRow
	var l TenantLimitRow
	if _, err := pgx.ForEachRow(rows, []any{&l.Tenant, &l.MaxInFlight, &l.Rate}, func() error {
		out = append(out, l)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// SetTenantLimit stores tenant's own limit on queue
// (limitStatements.SetTenantLimit).
func (s *Store) SetTenantLimit(ctx context.Context, db DB, queue, tenant string, maxInFlight int64, rate float64) error {
	_, err := db.Exec(ctx, s.lim.SetTenantLimit, queue, tenant, maxInFlight, rate)
	return err
}

// RemoveTenantLimit deletes tenant's own limit on queue and reports whether
// there was one (limitStatements.RemoveTenantLimit).
func (s *Store) RemoveTenantLimit(ctx context.Context, db DB, queue, tenant string) (bool, error) {
	tag, err := db.Exec(ctx, s.lim.RemoveTenantLimit, queue, tenant)
	return tag.RowsAffected() > 0, err
}
