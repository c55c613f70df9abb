package store

// DemoStatementsForTest returns the text of the Store's demo statements by
// name, for the EXPLAIN tests of package sql_test.
func DemoStatementsForTest(s *Store) map[string]string {
	d := s.demoSQL()
	return map[string]string{
		"countItems":      d.countItems,
		"itemFates":       d.itemFates,
		"workedQueues":    d.workedQueues,
		"deleteItems":     d.deleteItems,
		"deleteDeadItems": d.deleteDeadItems,
		"deleteEnded":     d.deleteEnded,
	}
}
