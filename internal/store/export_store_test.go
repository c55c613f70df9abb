package store

// OrderCountsBeforeText returns the statement of s.OrderCountsBefore, for
// the plan tests of package sql_test: the text is unexported.
func OrderCountsBeforeText(s *Store) string { return s.order }
