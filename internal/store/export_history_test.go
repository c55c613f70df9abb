package store

// HistoryStatementsForTest returns the item list's statements rendered for
// t, by name.
func HistoryStatementsForTest(t Tables) map[string]string {
	h := newHistoryStatements(t)
	return map[string]string{
		"ListUnclaimed": h.Unclaimed, "ListClaimed": h.Claimed, "ListWaiting": h.Waiting,
		"ListDead": h.Dead, "ListEnded": h.Ended, "ListCancelled": h.Cancelled,
	}
}

// AttemptErrorsPruneForTest returns the text of the retention of
// crdbwork_attempt_errors rendered for t.
func AttemptErrorsPruneForTest(t Tables) string { return newHistoryStatements(t).PruneErrors }
