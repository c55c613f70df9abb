package sql

// MoveStatements move the items of removed parts (partition.SetParts), in
// batches of bounded size, rendered for one set of table names. The text is
// identical on CockroachDB and PostgreSQL.
type MoveStatements struct {
	// MoveUnclaimed moves up to $3 unclaimed items of queue $1 in parts >=
	// $2 to part % $2, through the index of unclaimed items (each batch
	// reads only the rows it moves) → rows affected.
	MoveUnclaimed string
	// MoveClaimed is MoveUnclaimed for claimed items, found through the
	// index of claimed items. A claim that names its part (parts mode) is
	// released, since the part is gone; an any-part claim is kept.
	MoveClaimed string
}

// NewMoveStatements renders the move statements for t.
func NewMoveStatements(t Tables) *MoveStatements {
	r := t.rewrite
	// claim_queue and claim_part are cleared in every moved row: the
	// CHECK that ties them to the item's part would refuse the move, and a
	// claim that named a removed part is void.
	const set = `SET part = part % $2,
    claim = CASE WHEN claim_part IS NULL THEN claim END,
    claimed_at = CASE WHEN claim_part IS NULL THEN claimed_at END,
    claim_queue = NULL, claim_part = NULL`
	return &MoveStatements{
		MoveUnclaimed: r(`UPDATE crdbwork_items ` + set + `
WHERE id IN (SELECT id FROM crdbwork_items WHERE queue = $1 AND part >= $2 AND claim IS NULL LIMIT $3)
  AND queue = $1 AND part >= $2`),
		MoveClaimed: r(`UPDATE crdbwork_items ` + set + `
WHERE id IN (SELECT id FROM crdbwork_items WHERE claim IS NOT NULL AND queue = $1 AND part >= $2 LIMIT $3)
  AND queue = $1 AND part >= $2`),
	}
}
