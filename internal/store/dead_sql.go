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
		ExhaustedIDs: r(`SELECT id FROM crdbwork_items
WHERE queue = $1 AND claim IS NULL AND attempts >= max_attempts AND ` + noCancelAsked + `
LIMIT $2`),
		ExpiredIDs: r(`SELECT id FROM crdbwork_items
WHERE ` + expiredUnclaimed + `
ORDER BY expires_at
LIMIT $2`),
		ExpiredLeaseIDs: r(`SELECT id FROM crdbwork_items
WHERE queue = $1 AND claim IS NOT NULL AND lease_until < now() AND ` + noCancelAsked + `
ORDER BY lease_until
LIMIT $2`),
		ReapLeasesIDs: r(`WITH picked AS MATERIALIZED (
    SELECT id FROM crdbwork_items
    WHERE id IN (SELECT unnest($2::UUID[])) AND queue = $1 AND claim IS NOT NULL AND lease_until < now() AND ` + noCancelAsked + `
    FOR UPDATE SKIP LOCKED)
UPDATE crdbwork_items AS i
SET ` + released + `
WHERE i.id IN (SELECT id FROM picked) AND i.claim IS NOT NULL AND i.lease_until < now()
RETURNING i.id`),
		ReapExhaustedIDs: r(`WITH picked AS MATERIALIZED (
    SELECT id FROM crdbwork_items
    WHERE id IN (SELECT unnest($2::UUID[])) AND queue = $1 AND claim IS NULL AND attempts >= max_attempts AND ` + noCancelAsked + `
    FOR UPDATE SKIP LOCKED),
` + moveExhausted),
		ReapExpiredIDs: r(`WITH picked AS MATERIALIZED (
    SELECT id FROM crdbwork_items
    WHERE id IN (SELECT unnest($2::UUID[])) AND queue = $1 AND expires_at IS NOT NULL AND expires_at <= now() AND claim IS NULL AND ` + noCancelAsked + `
    FOR UPDATE SKIP LOCKED),
` + moveExpired),
		Exhaust: r(`UPDATE crdbwork_items
SET ` + released + `, attempts = GREATEST(attempts, max_attempts), last_error = $4
WHERE ` + heldBy),
		DeadItemsBefore: r(`SELECT id, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, died_at, tenant, reason, death
FROM crdbwork_dead_items
WHERE queue = $1 AND died_at <= $2 AND (died_at, id, death) < ($2, $3, $4)
ORDER BY died_at DESC, id DESC, death DESC
LIMIT $5`),
		RequeueState: r(`SELECT (SELECT queue FROM crdbwork_items WHERE id = $1),
       (SELECT queue FROM crdbwork_waiting WHERE id = $1),
       (SELECT count(*) FROM crdbwork_dead_items WHERE id = $1 AND queue = $2 AND ($3::UUID IS NULL OR death = $3))`),
	}
}
