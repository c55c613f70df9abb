package store

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The Store methods of package partition: a queue's stored number of parts,
// part ownership, and the move of the items of removed parts. Each runs one
// statement, once, and returns the driver's error unwrapped (see
// sessions.go). The statements are those of coreStatements and
// moveStatements.

// queuePartsSQL is the text of coreStatements.QueueParts
// (rendered by newCoreStatements).
const queuePartsSQL = `SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $1), 1)`

// PartsCount returns queue's stored number of parts: 1 when it has none.
func (s *Store) PartsCount(ctx context.Context, db DB, queue string) (int, error) {
	var n int64
	err := db.QueryRow(ctx, s.st.QueueParts, queue).Scan(&n)
	return int(n), err
}

// insertQueuePartsSQL is the text of coreStatements.InsertQueueParts
// (rendered by newCoreStatements).
const insertQueuePartsSQL = `INSERT INTO crdbwork_queues (name, num_parts) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`

// PartsCountInsert stores n parts for queue if it has no stored count (a
// stored count wins) and reports whether it stored n.
func (s *Store) PartsCountInsert(ctx context.Context, db DB, queue string, n int) (bool, error) {
	tag, err := db.Exec(ctx, s.st.InsertQueueParts, queue, int64(n))
	return tag.RowsAffected() > 0, err
}

// upsertQueuePartsSQL is the text of coreStatements.UpsertQueueParts
// (rendered by newCoreStatements).
const upsertQueuePartsSQL = `INSERT INTO crdbwork_queues AS q (name, num_parts) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET num_parts = excluded.num_parts`

// PartsCountUpsert stores n parts for queue, replacing any stored count.
// It moves no item and releases no part: partition.SetParts does, with
// DropPartsAbove and MovePartItems.
func (s *Store) PartsCountUpsert(ctx context.Context, db DB, queue string, n int) error {
	_, err := db.Exec(ctx, s.st.UpsertQueueParts, queue, int64(n))
	return err
}

// dropPartsAboveSQL is the text of coreStatements.DropPartsAbove
// (rendered by newCoreStatements).
const dropPartsAboveSQL = `DELETE FROM crdbwork_session_parts WHERE queue = $1 AND part >= $2`

// PartsDropAbove deletes the ownership rows of queue's parts n and above,
// which releases the claims made in those parts, and returns how many it
// deleted.
func (s *Store) PartsDropAbove(ctx context.Context, db DB, queue string, n int) (int64, error) {
	tag, err := db.Exec(ctx, s.st.DropPartsAbove, queue, int64(n))
	return tag.RowsAffected(), err
}

// acquirePartSQL is the text of coreStatements.AcquirePart
// (rendered by newCoreStatements).
const acquirePartSQL = `WITH acquired AS (
    INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, $3)
    ON CONFLICT DO NOTHING
    RETURNING queue),
bump AS (UPDATE crdbwork_queues SET changes = changes + 1 WHERE name IN (SELECT queue FROM acquired) RETURNING 1)
SELECT count(*) FROM acquired`

// PartsAcquire makes session the owner of queue's part and reports whether
// it did (false: another session owns the part); an acquisition records a
// change in the queue (see QueueChangesBump).
func (s *Store) PartsAcquire(ctx context.Context, db DB, session uuid.UUID, queue string, part int) (bool, error) {
	var n int64
	err := db.QueryRow(ctx, s.st.AcquirePart, session, queue, int64(part)).Scan(&n)
	return n > 0, err
}

// releasePartSQL is the text of coreStatements.ReleasePart
// (rendered by newCoreStatements).
const releasePartSQL = `WITH released AS (
    DELETE FROM crdbwork_session_parts WHERE session_id = $1 AND queue = $2 AND part = $3
    RETURNING queue)
UPDATE crdbwork_queues SET changes = changes + 1 WHERE name IN (SELECT queue FROM released)`

// queueChangesBumpSQL is the text of coreStatements.QueueChangesBump
// (rendered by newCoreStatements).
const queueChangesBumpSQL = `UPDATE crdbwork_queues SET changes = changes + 1 WHERE name = $1`

// QueueChangesBump records a change in queue's members, part owners or
// number of parts: it raises the queue's change counter (the `changes`
// column of its row, schema version 6), which every session that joined
// the queue reads with its heartbeat (the marker SessionsHeartbeat
// returns). A rebalancer reads the queue's members and owners only when
// the marker moved (package partition). Every statement of this package
// that changes them records it in the same statement: a join or leave, a
// session's deletion (graceful, or a reap), a part acquired or released;
// package partition's SetParts calls QueueChangesBump. Code of schema
// versions 3 to 5 records nothing: package partition reads on a slow
// safety interval too. A queue without a row (no parts) records nothing.
func (s *Store) QueueChangesBump(ctx context.Context, db DB, queue string) error {
	_, err := db.Exec(ctx, s.st.QueueChangesBump, queue)
	return err
}

// PartsRelease deletes session's ownership of queue's part, which releases
// the claims made in it, and records a change in the queue (see
// QueueChangesBump). Releasing a part the session does not own does
// nothing.
func (s *Store) PartsRelease(ctx context.Context, db DB, session uuid.UUID, queue string, part int) error {
	_, err := db.Exec(ctx, s.st.ReleasePart, session, queue, int64(part))
	return err
}

// ownedPartsSQL is the text of coreStatements.OwnedParts
// (rendered by newCoreStatements).
const ownedPartsSQL = `SELECT part FROM crdbwork_session_parts WHERE session_id = $1 AND queue = $2 ORDER BY part`

// PartsOwned returns the parts of queue that session owns, ordered.
func (s *Store) PartsOwned(ctx context.Context, db DB, session uuid.UUID, queue string) ([]int, error) {
	rows, err := db.Query(ctx, s.st.OwnedParts, session, queue)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (int, error) {
		var p int64
		err := row.Scan(&p)
		return int(p), err
	})
}

// partOwnersSQL is the text of coreStatements.PartOwners
// (rendered by newCoreStatements).
const partOwnersSQL = `SELECT session_id, part FROM crdbwork_session_parts WHERE queue = $1 ORDER BY part`

// PartsOwners returns the owner of each owned part of queue, by part.
func (s *Store) PartsOwners(ctx context.Context, db DB, queue string) (map[int]uuid.UUID, error) {
	rows, err := db.Query(ctx, s.st.PartOwners, queue)
	if err != nil {
		return nil, err
	}
	out := map[int]uuid.UUID{}
	var owner uuid.UUID
	var part int64
	if _, err := pgx.ForEachRow(rows, []any{&owner, &part}, func() error {
		out[int(part)] = owner
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// MovedPage is what one MovePartItems did.
type MovedPage struct {
	// Moved is the number of items it moved.
	Moved int64
	// Last is the last id of the page it read, where the next page starts;
	// Done (Last is then the nil UUID) when the page was empty: the walk of
	// the items table is over.
	Last uuid.UUID
	Done bool
}

// movePageSQL is the text of moveStatements.MovePage
// (rendered by newMoveStatements).
const movePageSQL = `WITH page AS MATERIALIZED (
    SELECT id FROM crdbwork_items WHERE id > $3 ORDER BY id LIMIT $4),
moved AS (
    UPDATE crdbwork_items
    SET part = part % $2,
        claim = CASE WHEN claim_part IS NULL THEN claim END,
        claimed_at = CASE WHEN claim_part IS NULL THEN claimed_at END,
        lease_until = CASE WHEN claim_part IS NULL THEN lease_until END,
        claim_queue = NULL, claim_part = NULL
    WHERE id IN (SELECT id FROM page) AND queue = $1 AND part >= $2
    RETURNING id)
SELECT (SELECT count(*) FROM moved), (SELECT id FROM page ORDER BY id DESC LIMIT 1)`

// PartsMoveItems reads the next page of at most limit rows of the items
// table in primary-key order, after id after (the nil UUID: from the
// start), and moves those of queue in parts n and above to part % n (see
// moveStatements.MovePage for what happens to their claims).
func (s *Store) PartsMoveItems(ctx context.Context, db DB, queue string, n int, after uuid.UUID, limit int) (MovedPage, error) {
	var page MovedPage
	var last *uuid.UUID
	if err := db.QueryRow(ctx, s.move.MovePage, queue, int64(n), after, int64(limit)).Scan(&page.Moved, &last); err != nil {
		return MovedPage{}, err
	}
	if last == nil {
		page.Done = true
		return page, nil
	}
	page.Last = *last
	return page, nil
}

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
