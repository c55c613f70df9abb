package store

// CancelStatementsForTest returns the texts of the cancel and snooze
// statements for t, by name, for the EXPLAIN tests of package sql_test.
func CancelStatementsForTest(t Tables) map[string]string {
	c, k := newCancelStatements(t), newCancelledStatements(t)
	return map[string]string{
		"Request": c.request, "State": c.state, "SessionCancels": c.session, "EndCancelled": c.end,
		"ReapCancelled": c.reap, "ListCancelled": c.list, "ListCancelledBefore": c.listBefore,
		"ItemEnded": c.ended, "Snooze": c.snooze, "Counts": c.counts,
		"CancelUnclaimed": newCoreStatements(t).Cancel,
		// The cancelled items kept for a requeue (items_cancelled.go).
		"RequeueCancelled": k.requeue, "RequeueCancelledState": k.state, "ListKeptCancelled": k.list,
		"PruneKeptCancelled": k.prune,
	}
}
