package store

// FleetStatementsForTest returns the texts of the Store's fleet statements
// (store_fleet.go) for t, by name, for the EXPLAIN tests of package
// store_test.
func FleetStatementsForTest(t Tables) map[string]string {
	f := newFleetStatements(t)
	return map[string]string{"FleetQueue": f.queue, "FleetLiveSessions": f.liveSessions, "FleetSessionCounts": f.sessionCounts,
		"WaitingItem": f.waitingItem, "EndedOfID": f.endedOfID, "AuditFilter": f.auditFilter, "FleetKinds": f.kinds}
}
