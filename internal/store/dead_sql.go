package store

// deathStatements are the statements that keep the reaper and the nacks
// going when an item cannot be moved to the dead items (schema version 4
// keys dead items by (id, death), so a reused id no longer conflicts; a
// move may still be refused for something about one item: a constraint, a
// trigger, a row over a size limit), and that page through every death of
// the dead items. Rendered for one set of table names.
//
// The reaper's batches (coreStatements.ReapLeases, ReapExhausted and
// ReapExpired) stay as they are; when one fails for an item,
// claim.Queue.Reap reads the batch's candidates (ExpiredLeaseIDs,
// ExhaustedIDs, ExpiredIDs) and releases or moves them by id
// (ReapLeasesIDs, ReapExhaustedIDs, ReapExpiredIDs), splitting the list
// until each refused item fails alone.
// The by-id moves are the batches' statements with the candidates given
// instead of picked: the same conditions (rechecked on the locked rows), the
// same columns, the same reasons. Any CTE added to the batch statements (the
// ended ids of crdbwork_ended, for instance) belongs in these too.
//
// CockroachDB: the by-id moves have the batches' shape (a MATERIALIZED CTE
// that selects FOR UPDATE SKIP LOCKED, a DELETE ... RETURNING, an INSERT
// from it), which the batches' comments cite the docs for, and take their
// list of keys as id IN (SELECT unnest($2::UUID[])), the form of the fenced
// acks (see fenced in statements.go: a lookup semi-join by primary key).
// Not checked on a cluster (no CockroachDB binary here). The page of dead
// items compares row values, (a, b, c) < (x, y, z), which both engines order
// lexicographically, and bounds the leading column (died_at <= $2) so that
// the index on (queue, died_at) is seeked, not scanned, whichever way the
// engine treats the row comparison.
// PostgreSQL checked: the plans of every statement here are in
// internal/store/explain_test.go (no sequential scan of the items or dead items; the
// by-id moves look their ids up by primary key, or, when the planner expects
// few candidates, read them from the step's partial index).
type deathStatements struct {
	// ExhaustedIDs lists up to $2 ids of queue $1's unclaimed items whose
	// attempts are used up (the candidates of ReapExhausted), through
	// crdbwork_items_exhausted. It locks nothing.
	ExhaustedIDs string // $1 queue, $2 limit → id
	// ExpiredIDs lists up to $2 ids of queue $1's unclaimed items past
	// their deadline, earliest deadline first (the candidates of
	// ReapExpired), through crdbwork_items_expiry. It locks nothing.
	ExpiredIDs string // $1 queue, $2 limit → id
	// ExpiredLeaseIDs lists up to $2 ids of queue $1's claimed items whose
	// lease ended, oldest lease first (the candidates of ReapLeases),
	// through crdbwork_items_lease. It locks nothing.
	ExpiredLeaseIDs string // $1 queue, $2 limit → id
	// ReapLeasesIDs is ReapLeases for the given ids: it releases those
	// that are still claimed with an ended lease, skipping rows another
	// transaction holds.
	ReapLeasesIDs string // $1 queue, $2 ids → ids released
	// ReapExhaustedIDs is ReapExhausted for the given ids: it moves those
	// that are still unclaimed with their attempts used up, skipping rows
	// another transaction holds.
	ReapExhaustedIDs string // $1 queue, $2 ids, $3 error → ids moved (reason 'crash loop')
	// ReapExpiredIDs is ReapExpired for the given ids.
	ReapExpiredIDs string // $1 queue, $2 ids → ids moved (reason 'expired')
	// Exhaust is Nack's fallback when the move of a claimed item to the
	// dead items is refused: it releases the claim (fenced like
	// DeadLetter) with the item's attempts used up and its last error
	// set, so that no claim hands it out again and the reaper moves it
	// once it can.
	Exhaust string // $1 id, $2 session, $3 token, $4 error → rows affected
	// DeadItemsBefore is coreStatements.DeadItems' next page: the dead items
	// of queue $1 after the death ($2 died_at, $3 id, $4 death) in its
	// order (died_at, id, death, all descending), through
	// crdbwork_dead_items_by_queue.
	DeadItemsBefore string // $1 queue, $2 died_at, $3 id, $4 death, $5 limit → dead item columns
	// RequeueState says why Requeue moved nothing: the queue of the live
	// item with id $1 (NULL if none), the queue of the waiting item with id
	// $1 (NULL if none) and how many deaths of $1 in queue $2 match $3
	// (NULL: any).
	RequeueState string // $1 id, $2 queue, $3 death or NULL → live queue, waiting queue, deaths
}

// newDeathStatements renders the statements for t.
func newDeathStatements(t Tables) *deathStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &deathStatements{
		ExhaustedIDs:     r(exhaustedIDsSQL),
		ExpiredIDs:       r(expiredIDsSQL),
		ExpiredLeaseIDs:  r(expiredLeaseIDsSQL),
		ReapLeasesIDs:    r(reapLeasesIDsSQL),
		ReapExhaustedIDs: r(reapExhaustedIDsSQL),
		ReapExpiredIDs:   r(reapExpiredIDsSQL),
		Exhaust:          r(exhaustSQL),
		DeadItemsBefore:  r(deadItemsBeforeSQL),
		RequeueState:     r(requeueStateSQL),
	}
}
