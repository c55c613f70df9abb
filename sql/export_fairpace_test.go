package sql

// FairFrontText returns the statement of s.FairFront, for the plan tests
// of package sql_test: the text is unexported.
func FairFrontText(s *Store) string { return s.pace }
