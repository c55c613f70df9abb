package store

import (
	"context"
	"time"
)

// The Store methods of the limits a worker reads (package worker). It runs
// one statement, once, and returns the driver's error unwrapped (see
// sessions.go). The statement is limitStatements.QueueLimits.

// QueueLimitsRow is a queue's stored fleet-wide limits, as QueueLimits
// reads them: zero means no limit, for each field, and for every field of
// a queue without a row.
type QueueLimitsRow struct {
	// MaxInFlight and Rate limit all the queue's items: items claimed at
	// once, items claimed per second.
	MaxInFlight int
	Rate        float64
	// TenantMaxInFlight and TenantRate limit each tenant that has no
	// limit of its own.
	TenantMaxInFlight int
	TenantRate        float64
	// Now is the database clock when they were read.
	Now time.Time
}

// queueLimitsSQL is the text of limitStatements.QueueLimits
// (rendered by newLimitStatements).
const queueLimitsSQL = `SELECT COALESCE(q.max_in_flight, 0), COALESCE(q.rate_limit, 0),
       COALESCE(q.tenant_max_in_flight, 0), COALESCE(q.tenant_rate_limit, 0), now()
FROM (SELECT 1) AS one LEFT JOIN crdbwork_queues AS q ON q.name = $1`

// QueueLimits reads queue's stored limits and the database clock: one
// lookup of the queue's row by primary key.
func (s *Store) QueueLimits(ctx context.Context, db DB, queue string) (QueueLimitsRow, error) {
	var l QueueLimitsRow
	var maxIn, tenantMaxIn int64
	if err := db.QueryRow(ctx, s.lim.QueueLimits, queue).Scan(&maxIn, &l.Rate, &tenantMaxIn, &l.TenantRate, &l.Now); err != nil {
		return QueueLimitsRow{}, err
	}
	l.MaxInFlight, l.TenantMaxInFlight = int(maxIn), int(tenantMaxIn)
	return l, nil
}
