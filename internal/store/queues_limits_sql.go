package store

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
