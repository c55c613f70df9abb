package store

// FairFrontText returns the statement of s.FairFront in dialect d, for
// the plan tests of package sql_test: the text is unexported.
func FairFrontText(s *Store, d Dialect) string { return byDialect(d, s.pace, s.pgPace) }
