package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Checkpoints and progress (schema version 5): a claimed item's handler
// saves a checkpoint (bytes) and a progress (done of total) on the item's
// row, with a statement fenced on its claim (heldBy: the item's id, the
// claiming session and the claim's token), so that a handler that lost its
// claim cannot overwrite what the next attempt saves. The row keeps both
// across nacks, releases, reaped leases and crashes; every claim statement
// returns them (checkpointColumns, near the end of itemColumns), so the next
// attempt gets them without a round trip of its own. Items that never save
// one keep NULLs: no write, no read and no index entry more than before.
//
// A save is one UPDATE of one row found by primary key (the form of Nack
// and Release); the list for crdbwork status reads crdbwork_items_progress
// (queue, progress_at), whose predicate keeps only the items that saved a
// progress. The text is identical on CockroachDB and PostgreSQL; CockroachDB
// checked: octet_length(bytes) is one of its string functions (its
// "Functions and Operators" page), as in PostgreSQL.

// checkpointColumns are the columns every claim statement returns after the
// others (itemColumns), but for the item's timeout and kind (timeout_us,
// kind, last): the
// checkpoint and the progress.
const checkpointColumns = `i.checkpoint, i.progress_done, i.progress_total`

// checkpointStatements are the statements of checkpoints and progress,
// rendered for one set of table names.
type checkpointStatements struct {
	// SaveCheckpoint writes the checkpoint $4 (NULL clears it) of the item
	// whose claim is still ($2, $3), and stamps checkpoint_at.
	SaveCheckpoint string // $1 id, $2 session, $3 token, $4 checkpoint → rows affected
	// SaveProgress writes the progress ($4 done of $5 total) of the item
	// whose claim is still ($2, $3), and stamps progress_at.
	SaveProgress string // $1 id, $2 session, $3 token, $4 done, $5 total → rows affected
	// Progressing lists queue $1's items with a saved progress, the most
	// recently saved first, at most $2, through crdbwork_items_progress.
	Progressing string // $1 queue, $2 limit → id, part, claimed, attempts, max_attempts, done, total, progress_at, checkpoint bytes, checkpoint_at, now()
}

func newCheckpointStatements(t Tables) *checkpointStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &checkpointStatements{
		SaveCheckpoint: r(saveCheckpointSQL),
		SaveProgress:   r(saveProgressSQL),
		Progressing:    r(progressingSQL),
	}
}

// saveCheckpointSQL is the text of checkpointStatements.SaveCheckpoint
// (rendered by newCheckpointStatements).
const saveCheckpointSQL = `UPDATE crdbwork_items SET checkpoint = $4, checkpoint_at = now()
WHERE ` + heldBy

// ItemsCheckpointSave writes data as the checkpoint of the item claimed as k (nil
// clears it) and reports whether the claim was still held
// (checkpointStatements.SaveCheckpoint).
func (s *Store) ItemsCheckpointSave(ctx context.Context, db DB, k ClaimKey, data []byte) (bool, error) {
	return execOne(ctx, db, s.ckpt.SaveCheckpoint, k.ID, k.Session, k.Token, data)
}

// saveProgressSQL is the text of checkpointStatements.SaveProgress
// (rendered by newCheckpointStatements).
const saveProgressSQL = `UPDATE crdbwork_items SET progress_done = $4, progress_total = $5, progress_at = now()
WHERE ` + heldBy

// ItemsProgressSave writes done of total as the progress of the item claimed as
// k and reports whether the claim was still held
// (checkpointStatements.SaveProgress).
func (s *Store) ItemsProgressSave(ctx context.Context, db DB, k ClaimKey, done, total int64) (bool, error) {
	return execOne(ctx, db, s.ckpt.SaveProgress, k.ID, k.Session, k.Token, done, total)
}

// ProgressRow is one item with a saved progress, as Progressing reads it.
type ProgressRow struct {
	ID          uuid.UUID
	Part        int
	Claimed     bool
	Attempts    int
	MaxAttempts int
	Done, Total int64
	ProgressAt  time.Time
	// CheckpointBytes is the size of the saved checkpoint (0 if none);
	// CheckpointAt when it was saved (zero if never).
	CheckpointBytes int64
	CheckpointAt    time.Time
	// Now is the database clock when the row was read.
	Now time.Time
}

// progressingSQL is the text of checkpointStatements.Progressing
// (rendered by newCheckpointStatements).
const progressingSQL = `SELECT id, part, claim IS NOT NULL, attempts, max_attempts, progress_done, progress_total, progress_at,
       octet_length(checkpoint), checkpoint_at, now()
FROM crdbwork_items
WHERE queue = $1 AND progress_at IS NOT NULL
ORDER BY progress_at DESC
LIMIT $2`

// ItemsProgressing returns up to limit of queue's items with a saved progress,
// the most recently saved first (checkpointStatements.Progressing).
func (s *Store) ItemsProgressing(ctx context.Context, db DB, queue string, limit int) ([]ProgressRow, error) {
	rows, err := db.Query(ctx, s.ckpt.Progressing, queue, limit)
	if err != nil {
		return nil, err
	}
	var out []ProgressRow
	var r ProgressRow
	var part, attempts, maxAttempts int64
	var size *int64
	var at *time.Time
	if _, err := pgx.ForEachRow(rows, []any{&r.ID, &part, &r.Claimed, &attempts, &maxAttempts, &r.Done, &r.Total,
		&r.ProgressAt, &size, &at, &r.Now}, func() error {
		r.Part, r.Attempts, r.MaxAttempts = int(part), int(attempts), int(maxAttempts)
		r.CheckpointBytes, r.CheckpointAt = 0, time.Time{}
		if size != nil {
			r.CheckpointBytes = *size
		}
		if at != nil {
			r.CheckpointAt = *at
		}
		out = append(out, r)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}
