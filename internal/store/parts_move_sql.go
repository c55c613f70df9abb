package store

// moveStatements move the items of removed parts (partition.SetParts), in
// batches of bounded size, rendered for one set of table names. The text is
// identical on CockroachDB and PostgreSQL.
type moveStatements struct {
	// MovePage reads the next page of at most $4 rows of the items table in
	// primary-key order, after id $3, and moves those of queue $1 in parts
	// >= $2 to part % $2 → rows moved, last id of the page (NULL when the
	// page is empty: the walk is over). Each page is one statement, so the
	// move never reads or writes more than a page of rows at once, and the
	// walk reads the table once whatever the number of rows it moves.
	//
	// A claim that names a moved item's part (parts mode) is released, all
	// claim columns and the lease at once, since the part is gone; an
	// any-part claim is kept. claim_queue and claim_part are cleared in
	// every moved row (the CHECK that ties them to the part would refuse
	// the move otherwise).
	MovePage string
}

// newMoveStatements renders the move statements for t.
func newMoveStatements(t Tables) *moveStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &moveStatements{
		MovePage: r(movePageSQL),
	}
}
