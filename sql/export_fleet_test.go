package sql

// FleetStatementsForTest returns the texts of the Store's fleet statements
// (store_fleet.go) for t, by name, for the EXPLAIN tests of package
// sql_test.
func FleetStatementsForTest(t Tables) map[string]string {
	return map[string]string{"FleetQueue": t.rewrite(fleetQueue), "FleetLiveSessions": t.rewrite(fleetLiveSessions),
		"FleetSessionCounts": t.rewrite(fleetSessionCounts)}
}
