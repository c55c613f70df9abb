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

// limitStatements are the statements of the queues' fleet-wide limits
// (claim.Queue.SetTenantLimit and the workers' reads), rendered for one set
// of table names. Every one reads or writes rows by primary key (the
// queues table's name, the tenant limits table's (queue, tenant)), so each
// is a point lookup or a range of one queue's tenants on both engines.
// CockroachDB accepts each form: INSERT … ON CONFLICT (pk) DO UPDATE SET c
// = excluded.c is its documented equivalent of UPSERT
// (https://www.cockroachlabs.com/docs/v21.2/upsert, "UPSERT vs. INSERT ON
// CONFLICT"); the LEFT JOIN of a one-row subquery constrains the queues
// table by its primary key (q.name = $1), checked here on PostgreSQL's plans
// (internal/store/explain_test.go), not on CockroachDB's, which cannot run here.
type limitStatements struct {
	// QueueLimits returns queue $1's max_in_flight, rate_limit,
	// tenant_max_in_flight and tenant_rate_limit (zeros when the queue has
	// no row) and the database clock, now().
	QueueLimits string
	// TenantLimits returns queue $1's tenant limits: tenant, max_in_flight,
	// rate_limit, ordered by tenant.
	TenantLimits string
	// SetTenantLimit stores tenant $2's limit for queue $1: $3
	// max_in_flight, $4 rate_limit (INSERT … ON CONFLICT, which both
	// engines accept; it runs again harmlessly after an unknown outcome).
	SetTenantLimit string
	// RemoveTenantLimit deletes tenant $2's limit for queue $1 → rows
	// affected.
	RemoveTenantLimit string
}

// newLimitStatements renders the limit statements for t.
func newLimitStatements(t Tables) *limitStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &limitStatements{
		QueueLimits:       r(queueLimitsSQL),
		TenantLimits:      r(tenantLimitsSQL),
		SetTenantLimit:    r(setTenantLimitSQL),
		RemoveTenantLimit: r(removeTenantLimitSQL),
	}
}
