package store

// AdminStatementsForTest returns the texts of the Store's admin statements
// for t, by name, for the EXPLAIN tests of package sql_test.
func AdminStatementsForTest(t Tables) map[string]string {
	a := newAdminStatements(t)
	m := map[string]string{
		"DeadFirst": a.deadFirst, "DeadAfter": a.deadAfter, "DeadCount": a.deadCount, "EndedCount": a.endedCount,
		"ScheduleCount": a.schedCount, "OwnerCount": a.ownerCount, "PickUnclaimed": a.pickFree, "PickClaimed": a.pickHeld,
		"PickDead": a.pickDead, "PickEnded": a.pickEnded, "PurgeItems": a.purgeItems, "PurgeDead": a.purgeDead, "PurgeEnded": a.purgeEnded, "PurgeQueueRow": a.purgeQueues,
	}
	for i, s := range a.purgeRest {
		m[[]string{"PurgeOwnedParts", "PurgeTenantLimits", "PurgeSchedules"}[i]] = s
	}
	return m
}
