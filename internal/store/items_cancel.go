package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Cancel and snooze (schema version 5): statements of claim's Cancel,
// EndCancelled, Snooze and the reaper's cancel step, and of the operators'
// list of cancelled items.
//
// A cancel of an unclaimed item deletes it at once (CancelUnclaimed). A
// cancel of a claimed item asks for it (RequestCancel): it records when, by
// whom and why in the item's row, bumps the claim token and moves vesting_at
// a century ahead. The token bump fences every statement of the claim
// holder — acks, nacks, snoozes, releases, extensions, of this code and of
// version-3 and -4 code alike, which all compare (claim, claim_token) — so
// no result of the cancelled attempt can commit. The far vesting time keeps
// every claim (old ones included, which know nothing of the request) away
// from the item if its claim is released before it ends. The claim holder
// finds the request at its next heartbeat (SessionCancels, through
// crdbwork_items_cancel_requested) or at once after a notification on the
// queue's cancel channel, cancels the handler's context, and ends the item
// (EndCancelled, fenced on its session and the bumped token). If it cannot —
// it died, or its handler hangs — the reaper ends the item once its claim is
// released or its lease ran out (ReapCancelled). Every end deletes the item
// and records it in crdbwork_ended with outcome 'cancelled', who, why and
// when (unless the queue's dedup window is zero, as for every outcome).
//
// The statements on one item by id test the claim and the request inside
// IS TRUE (the same truth in a WHERE clause), as expiredUnclaimed does: a
// plain claim IS NULL (or cancel_requested_at IS NOT NULL) proves the
// predicate of a partial index, and on a table whose statistics make that
// index look empty PostgreSQL read the item through it — every unclaimed
// item of the queue — instead of by primary key (TestHotPlansInEveryState).
//
// CockroachDB checked (docs, "Partial indexes": CREATE INDEX ... WHERE,
// since v20.2, used when the query's filter implies the predicate; "Common
// Table Expressions": data-modifying statements in WITH, one modification
// of each table per statement, which is why the cancel of an unclaimed
// item and the request on a claimed one are two statements in one
// transaction). now() + INTERVAL '100 years' is used rather than the
// timestamp 'infinity', whose handling changed between CockroachDB versions
// (cockroachdb/cockroach#127141).
type cancelStatements struct {
	request    string // $1 id, $2 queue, $3 by, $4 reason → id
	state      string // $1 id, $2 queue → cancel requested, claimed
	session    string // $1 queue, $2 session, $3 limit → id, claim_token, by, reason, requested at
	end        string // $1 id, $2 session, $3 token (the bumped one) → id
	reap       string // $1 queue, $2 limit → id
	list       string // $1 queue, $2 limit → cancelled columns, newest first
	listBefore string // $1 queue, $2 ended_at, $3 id, $4 limit → cancelled columns
	ended      string // $1 queue, $2 id → live (0 or 1), outcome ('' if none)
	snooze     string // $1 id, $2 session, $3 token, $4 delay (µs), $5 max snoozes → rows affected
	counts     string // $1 queue → snoozed and waiting, cancel requested
}

// farVesting is the vesting time RequestCancel gives an item.
const farVesting = `now() + INTERVAL '100 years'`

// cancelledGone is the RETURNING list of the deletes that end cancelled
// items, read by recordCancelled.
const cancelledGone = `RETURNING id, queue, claim, cancel_requested_at, cancel_by, cancel_reason,
        part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, claim_token, tenant, seq_order, headers, kind,
        claimed_at`

// cancelHolds is the CTE, named held (followed by keepCancelled's kept),
// that keeps the cancelled items of
// the CTE gone that hold their key (docs/sequences.md, "After a death"):
// a sequenced item of a queue whose sequence_hold is on goes to the dead
// items too, reason 'cancelled', holding its key's later items until it
// is requeued, deleted or released, as a dead one would. The ended row
// ('cancelled') is written as for any cancel. Other cancelled items are
// not kept.
const cancelHolds = `held AS (
    INSERT INTO crdbwork_dead_items
        (id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, claim_token, tenant, reason, seq_order, seq_hold, kind)
    SELECT g.id, g.queue, g.part, g.item_key, g.priority, g.attempts, g.max_attempts, g.payload, g.metadata, g.last_error, g.enqueued_at, g.claim_token, g.tenant,
           '` + OutcomeCancelled + `', g.seq_order, true, g.kind
    FROM gone AS g
    WHERE g.seq_order IS NOT NULL AND g.item_key IS NOT NULL
      AND EXISTS (SELECT 1 FROM crdbwork_queues AS w WHERE w.name = g.queue AND w.sequence_hold)
    RETURNING id),
` + keepCancelled

// keepCancelled is the CTE, named kept, that keeps what a requeue of the
// cancelled items of the CTE gone needs (schema version 6:
// crdbwork_cancelled_items; Queue.Requeue with RequeueOptions.Cancelled),
// for the queue's dedup window, as their ended records: nothing for a
// queue whose window is zero, nor for an item that holds its sequence key
// (kept among the dead items by cancelHolds: requeued from there). A row
// already there (an id cancelled before, enqueued again) is replaced.
const keepCancelled = `kept AS (
    INSERT INTO crdbwork_cancelled_items AS c
        (queue, id, part, item_key, priority, max_attempts, payload, metadata, tenant, headers, enqueued_at, claim_token, seq_order, cancelled_at, kind)
    SELECT g.queue, g.id, g.part, g.item_key, g.priority, g.max_attempts, g.payload, g.metadata, g.tenant, g.headers, g.enqueued_at,
           g.claim_token, g.seq_order, now(), g.kind
    FROM gone AS g
    WHERE NOT EXISTS (SELECT 1 FROM crdbwork_queues AS w WHERE w.name = g.queue
                      AND (w.dedup_window <= INTERVAL '0 seconds' OR (w.sequence_hold AND g.seq_order IS NOT NULL AND g.item_key IS NOT NULL)))
    ON CONFLICT (id, queue) DO UPDATE SET part = excluded.part, item_key = excluded.item_key, priority = excluded.priority,
        max_attempts = excluded.max_attempts, payload = excluded.payload, metadata = excluded.metadata, tenant = excluded.tenant,
        headers = excluded.headers, enqueued_at = excluded.enqueued_at, claim_token = excluded.claim_token,
        seq_order = excluded.seq_order, cancelled_at = excluded.cancelled_at, kind = excluded.kind
    RETURNING c.id)`

// recordCancelled returns the CTE, named ended, that records the rows of
// the CTE gone as ended with outcome 'cancelled', with who cancelled them
// and why (by and reason: expressions over g, the gone row), when the
// cancel was asked for (requested) and whether a handler was running them
// (running). As recordEnded, it records nothing for a queue whose dedup
// window is zero, and refreshes a row already there.
func recordCancelled(by, reason, requested, running string) string {
	return `ended AS (
    INSERT INTO crdbwork_ended AS e (queue, id, ended_at, outcome, cancel_by, cancel_reason, cancel_requested_at, was_running, ` + endedHistoryColumns + `)
    SELECT g.queue, g.id, now(), '` + OutcomeCancelled + `', ` + by + `, ` + reason + `, ` + requested + `, ` + running + `, ` + endedFromGone + ` FROM gone AS g
    WHERE NOT ` + keepsNothing + `
    ON CONFLICT (queue, id) DO UPDATE SET ended_at = excluded.ended_at, outcome = excluded.outcome,
        cancel_by = excluded.cancel_by, cancel_reason = excluded.cancel_reason,
        cancel_requested_at = excluded.cancel_requested_at, was_running = excluded.was_running,
        ` + endedHistoryUpdate + `
    RETURNING e.id)`
}

// fromRow records a cancel that was asked for earlier, as the row holds it.
var fromRow = recordCancelled(`g.cancel_by`, `g.cancel_reason`, `g.cancel_requested_at`, `true`)

const cancelledColumns = `id, ended_at, COALESCE(cancel_by, ''), COALESCE(cancel_reason, ''), cancel_requested_at, COALESCE(was_running, false)`

// cancelledKind is the kind of a cancelled item of the list (the row e of
// crdbwork_ended), from the row a cancel kept for a requeue
// (crdbwork_cancelled_items, one primary-key lookup): NULL when none was
// kept (a queue whose dedup window is zero, code older than version 6).
// The queue is compared in IS TRUE (no index condition), as in
// cancelledRequeueSQL: with it an index condition, PostgreSQL looked the
// row up through crdbwork_cancelled_items_by_age (queue, cancelled_at),
// reading every kept row of the queue for each row of the list
// (TestExplainCancelStatements, TestExplainFleetStatements).
const cancelledKind = `(SELECT c.kind FROM crdbwork_cancelled_items AS c WHERE c.id = e.id AND (c.queue = e.queue) IS TRUE)`

// cancelUnclaimed is coreStatements.Cancel: the cancel of an item no
// session holds deletes it at once. An item whose cancel was asked for
// while it was claimed, and whose claim was released since, keeps that
// request's author, reason and time.
const cancelUnclaimed = `WITH gone AS (
    DELETE FROM crdbwork_items WHERE id = $1 AND queue = $2 AND (claim IS NULL) IS TRUE
    ` + cancelledGone + `),
` + `ended AS (
    INSERT INTO crdbwork_ended AS e (queue, id, ended_at, outcome, cancel_by, cancel_reason, cancel_requested_at, was_running, ` + endedHistoryColumns + `)
    SELECT g.queue, g.id, now(), '` + OutcomeCancelled + `', COALESCE(g.cancel_by, $3::TEXT), COALESCE(g.cancel_reason, $4::TEXT),
        COALESCE(g.cancel_requested_at, now()), g.cancel_requested_at IS NOT NULL, ` + endedFromGone + ` FROM gone AS g
    WHERE NOT ` + keepsNothing + `
    ON CONFLICT (queue, id) DO UPDATE SET ended_at = excluded.ended_at, outcome = excluded.outcome,
        cancel_by = excluded.cancel_by, cancel_reason = excluded.cancel_reason,
        cancel_requested_at = excluded.cancel_requested_at, was_running = excluded.was_running,
        ` + endedHistoryUpdate + `
    RETURNING e.id),
` + cancelHolds + `
SELECT id FROM gone`

func newCancelStatements(t Tables) *cancelStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &cancelStatements{
		request:    r(requestSQL),
		state:      r(stateSQL),
		session:    r(sessionSQL),
		end:        r(endSQL),
		reap:       r(reapSQL),
		list:       r(listSQL),
		listBefore: r(listBeforeSQL),
		ended:      r(endedSQL),
		snooze:     r(snoozeSQL),
		counts:     r(countsSQL),
	}
}

// cancel returns the Store's cancelStatements, rendered on first use.
func (s *Store) cancel() *cancelStatements { return s.lazyCancel() }

// CancelState is what CancelItem found.
type CancelState int

// What CancelItem did.
const (
	// CancelNotFound: the queue has no item with the id.
	CancelNotFound CancelState = iota
	// CancelEnded: the item was unclaimed and is gone, recorded as cancelled.
	CancelEnded
	// CancelRequested: the item is claimed; the cancel was asked for now.
	CancelRequested
	// CancelAlreadyRequested: a cancel was asked for earlier and the item
	// has not ended yet.
	CancelAlreadyRequested
)

// requestSQL is the text of cancelStatements.request
// (rendered by newCancelStatements).
const requestSQL = `UPDATE crdbwork_items
SET cancel_requested_at = now(), cancel_by = $3, cancel_reason = $4,
    claim_token = claim_token + 1, vesting_at = ` + farVesting + `
WHERE id = $1 AND queue = $2 AND (claim IS NOT NULL) IS TRUE AND cancel_requested_at IS NULL
RETURNING id`

// stateSQL is the text of cancelStatements.state
// (rendered by newCancelStatements).
const stateSQL = `SELECT cancel_requested_at IS NOT NULL, claim IS NOT NULL FROM crdbwork_items WHERE id = $1 AND queue = $2`

// ItemsCancelItem cancels item id of queue in tx, a SERIALIZABLE transaction:
// it deletes it if no session holds it, or records the request (by,
// reason) on it if one does. by and reason are stored as given ("" is
// stored as the empty text).
func (s *Store) ItemsCancelItem(ctx context.Context, tx pgx.Tx, id uuid.UUID, queue, by, reason string) (CancelState, error) {
	ended, err := s.ItemsCancel(ctx, tx, id, queue, by, reason)
	switch {
	case err != nil:
		return CancelNotFound, err
	case ended:
		return CancelEnded, nil
	}
	c := s.cancel()
	tag, err := tx.Exec(ctx, c.request, id, queue, by, reason)
	if err != nil {
		return CancelNotFound, err
	}
	if tag.RowsAffected() > 0 {
		return CancelRequested, nil
	}
	var requested, claimed bool
	err = tx.QueryRow(ctx, c.state, id, queue).Scan(&requested, &claimed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return CancelNotFound, nil
	case err != nil:
		return CancelNotFound, err
	case requested:
		return CancelAlreadyRequested, nil
	}
	// Neither deleted nor requested, yet present and not requested: it
	// changed between the statements, which SERIALIZABLE forbids.
	return CancelNotFound, errors.New("the item changed during its cancel")
}

// CancelRequest is a cancel asked of a claimed item, as SessionCancels
// returns it.
type CancelRequest struct {
	ID uuid.UUID
	// Token is the item's claim token since the request: the holder's
	// token plus one.
	Token       int64
	By, Reason  string
	RequestedAt time.Time
}

// sessionSQL is the text of cancelStatements.session
// (rendered by newCancelStatements).
//
// The claim is compared by IS NOT DISTINCT FROM for the reason
// given at heldBy: the read goes through the (normally empty)
// index of cancel-requested items.
const sessionSQL = `SELECT id, claim_token, COALESCE(cancel_by, ''), COALESCE(cancel_reason, ''), cancel_requested_at
FROM crdbwork_items
WHERE queue = $1 AND cancel_requested_at IS NOT NULL AND claim IS NOT DISTINCT FROM $2::UUID
ORDER BY cancel_requested_at
LIMIT $3`

// ItemsCancelsOfSession returns up to limit items of queue held by session whose
// cancel was asked for.
func (s *Store) ItemsCancelsOfSession(ctx context.Context, db DB, queue string, session uuid.UUID, limit int) ([]CancelRequest, error) {
	rows, err := db.Query(ctx, s.cancel().session, queue, session, limit)
	if err != nil {
		return nil, err
	}
	var out []CancelRequest
	var r CancelRequest
	if _, err := pgx.ForEachRow(rows, []any{&r.ID, &r.Token, &r.By, &r.Reason, &r.RequestedAt}, func() error {
		out = append(out, r)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// endSQL is the text of cancelStatements.end (rendered by newCancelStatements).
var endSQL = `WITH gone AS (
    DELETE FROM crdbwork_items WHERE ` + heldBy + ` AND (cancel_requested_at IS NOT NULL) IS TRUE
    ` + cancelledGone + `),
` + fromRow + `,
` + cancelHolds + `
SELECT id FROM gone`

// ItemsCancelEnd deletes a cancel-requested item whose claim is k (k.Token is
// the token since the request), recording it as cancelled, and reports
// whether it did.
func (s *Store) ItemsCancelEnd(ctx context.Context, db DB, k ClaimKey) (bool, error) {
	var id uuid.UUID
	err := db.QueryRow(ctx, s.cancel().end, k.ID, k.Session, k.Token).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// reapSQL is the text of cancelStatements.reap
// (rendered by newCancelStatements).
//
// Candidates are read through crdbwork_items_cancel_requested; the
// rows are locked (SKIP LOCKED: run it in an explicit SERIALIZABLE
// transaction, as the reaper's other steps) and checked again.
var reapSQL = `WITH picked AS MATERIALIZED (
    SELECT id FROM crdbwork_items
    WHERE queue = $1 AND cancel_requested_at IS NOT NULL AND (claim IS NULL OR lease_until < now())
    ORDER BY cancel_requested_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED),
gone AS (
    DELETE FROM crdbwork_items AS i
    WHERE i.id IN (SELECT id FROM picked) AND i.cancel_requested_at IS NOT NULL AND (i.claim IS NULL OR i.lease_until < now())
    ` + cancelledGone + `),
` + fromRow + `,
` + cancelHolds + `
SELECT id FROM gone`

// ItemsReapCancelled ends, in tx, up to limit of queue's cancel-requested items
// that no live handler will end: unclaimed ones, and those whose lease
// ran out. It returns how many it ended.
func (s *Store) ItemsReapCancelled(ctx context.Context, tx pgx.Tx, queue string, limit int) (int64, error) {
	rows, err := tx.Query(ctx, s.cancel().reap, queue, limit)
	if err != nil {
		return 0, err
	}
	ids, err := collectIDs(rows)
	return int64(len(ids)), err
}

// CancelledRow is one cancelled item, as ListCancelled returns it.
type CancelledRow struct {
	ID      uuid.UUID
	EndedAt time.Time
	// By and Reason are who cancelled it and why, as given.
	By, Reason string
	// RequestedAt is when the cancel was asked for (zero for items
	// cancelled before schema version 5).
	RequestedAt time.Time
	// WasRunning reports a cancel asked of a claimed item.
	WasRunning bool
	// Kind is the item's kind, as its kept row has it ("" if none).
	Kind string
}

// listSQL is the text of cancelStatements.list
// (rendered by newCancelStatements).
const listSQL = `SELECT ` + cancelledColumns + `, ` + cancelledKind + `
FROM crdbwork_ended AS e
WHERE queue = $1 AND outcome = '` + OutcomeCancelled + `' AND ($3 = '' OR ` + cancelledKind + ` = $3)
ORDER BY ended_at DESC, id DESC
LIMIT $2`

// listBeforeSQL is the text of cancelStatements.listBefore
// (rendered by newCancelStatements).
const listBeforeSQL = `SELECT ` + cancelledColumns + `, ` + cancelledKind + `
FROM crdbwork_ended AS e
WHERE queue = $1 AND outcome = '` + OutcomeCancelled + `' AND ended_at <= $2 AND (ended_at, id) < ($2, $3)
  AND ($5 = '' OR ` + cancelledKind + ` = $5)
ORDER BY ended_at DESC, id DESC
LIMIT $4`

// ItemsCancelled returns up to limit cancelled items of queue, the most
// recently ended first, after the position (endedAt, id) if after is set;
// only those of kind if kind is not "" (a kept item's kind: an item whose
// cancel kept nothing has none).
func (s *Store) ItemsCancelled(ctx context.Context, db DB, queue, kind string, after *CancelledRow, limit int) ([]CancelledRow, error) {
	c := s.cancel()
	var rows pgx.Rows
	var err error
	if after == nil {
		rows, err = db.Query(ctx, c.list, queue, limit, kind)
	} else {
		rows, err = db.Query(ctx, c.listBefore, queue, after.EndedAt, after.ID, limit, kind)
	}
	if err != nil {
		return nil, err
	}
	var out []CancelledRow
	var r CancelledRow
	var req *time.Time
	var rowKind *string
	if _, err := pgx.ForEachRow(rows, []any{&r.ID, &r.EndedAt, &r.By, &r.Reason, &req, &r.WasRunning, &rowKind}, func() error {
		row := r
		if req != nil {
			row.RequestedAt = *req
		}
		row.Kind = deref(rowKind)
		out = append(out, row)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// endedSQL is the text of cancelStatements.ended
// (rendered by newCancelStatements).
const endedSQL = `SELECT (SELECT count(*) FROM crdbwork_items WHERE id = $2 AND queue = $1),
       COALESCE((SELECT outcome FROM crdbwork_ended WHERE queue = $1 AND id = $2), '')`

// EndedOutcome reports whether queue has no item id any more, and the outcome
// its end recorded ("" if none is recorded: the dedup window is zero, or
// it was pruned).
func (s *Store) EndedOutcome(ctx context.Context, db DB, queue string, id uuid.UUID) (ended bool, outcome string, err error) {
	var live int64
	err = db.QueryRow(ctx, s.cancel().ended, queue, id).Scan(&live, &outcome)
	return live == 0, outcome, err
}

// snoozeSQL is the text of cancelStatements.snooze
// (rendered by newCancelStatements).
//
// A snooze gives the attempt back (as Release) and counts the
// snooze; it is refused once the item has $5 snoozes.
const snoozeSQL = `UPDATE crdbwork_items
SET ` + released + `, attempts = GREATEST(attempts - 1, 0), snoozes = snoozes + 1,
    vesting_at = now() + $4::BIGINT * INTERVAL '1 microsecond',
    turn_at = now() + $4::BIGINT * INTERVAL '1 microsecond'
WHERE ` + heldBy + ` AND snoozes < $5`

// ItemsSnooze releases a held claim without counting its attempt, the item
// vesting again after delay, its snoozes counted, unless it has max
// snoozes already. It reports whether it did (false: the claim was lost,
// or the item was snoozed max times).
func (s *Store) ItemsSnooze(ctx context.Context, db DB, k ClaimKey, delay time.Duration, max int) (bool, error) {
	return execOne(ctx, db, s.cancel().snooze, k.ID, k.Session, k.Token, delay.Microseconds(), int64(max))
}

// countsSQL is the text of cancelStatements.counts
// (rendered by newCancelStatements).
const countsSQL = `SELECT (SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND snoozes > 0 AND claim IS NULL),
       (SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND cancel_requested_at IS NOT NULL)`

// ItemsCancelSnoozeCounts counts queue's unclaimed items that were snoozed, and
// its items whose cancel was asked for and which have not ended yet.
func (s *Store) ItemsCancelSnoozeCounts(ctx context.Context, db DB, queue string) (snoozed, cancelling int64, err error) {
	err = db.QueryRow(ctx, s.cancel().counts, queue).Scan(&snoozed, &cancelling)
	return snoozed, cancelling, err
}

// NotifyCancelChannel returns the PostgreSQL notification channel on which
// cancel requests of queue's running items are announced (beside
// NotifyChannel's wake-ups, which idle claimers wait for): 48 bytes,
// within the 63 of an identifier.
func (s *Store) NotifyCancelChannel(queue string) string {
	return s.NotifyChannel(queue) + "_cancel"
}
