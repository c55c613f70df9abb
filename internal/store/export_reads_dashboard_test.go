package store

// DashboardStatementsForTest returns the texts of the Store's dashboard
// statements for t, by name, for the EXPLAIN tests of package sql_test.
func DashboardStatementsForTest(t Tables) map[string]string {
	d := newDashboardStatements(t)
	return map[string]string{
		"PartBacklog":    d.partBacklog,
		"UnclaimedFirst": d.unclaimedFirst, "UnclaimedAfter": d.unclaimedAfter,
		"TenantFirst": d.tenantFirst, "TenantAfter": d.tenantAfter,
		"ClaimedFirst": d.claimedFirst, "ClaimedAfter": d.claimedAfter,
		"DeadFirst": d.deadFirst, "DeadAfter": d.deadAfter,
		"Item": d.item, "Deaths": d.deaths, "DeleteDead": d.deleteDead, "TenantHeads": d.tenantHeads,
		"WaitingQueue": d.waitingQueue,
		"AuditInsert":  d.auditInsert, "AuditFirst": d.auditFirst, "AuditAfter": d.auditAfter,
		"SearchUnclaimed": d.search.unclaimed, "SearchUnclaimedAfter": d.search.unclaimedAfter,
		"SearchUnclaimedAll": d.search.unclaimedAll, "SearchUnclaimedAllAfter": d.search.unclaimedAllAfter,
		"SearchClaimed": d.search.claimed, "SearchClaimedAfter": d.search.claimedAfter,
		"SearchClaimedAll": d.search.claimedAll, "SearchClaimedAllAfter": d.search.claimedAllAfter,
		"SearchDead": d.search.dead, "SearchDeadAfter": d.search.deadAfter,
		"SearchDeadAll": d.search.deadAll, "SearchDeadAllAfter": d.search.deadAllAfter,
	}
}

// DashboardPartBacklogForTest returns CockroachDB's backlog read of k parts
// for t.
func DashboardPartBacklogForTest(t Tables, k int) string {
	return newDashboardStatements(t).crdbPartBacklog(k)
}

// DashboardTenantHeadsForTest returns CockroachDB's head read of k tenants
// for t.
func DashboardTenantHeadsForTest(t Tables, k int) string {
	return newDashboardStatements(t).crdbTenantHeads(k)
}
