package store

// History (schema version 6, issue 33): what happened to an item, attempt
// by attempt, with no statement added to any path and nothing added to an
// ack.
//
// An item's attempts that ended without success are kept in a table of
// their own, crdbwork_attempt_errors, one row per item keyed by (queue,
// id): errors, a JSON array of objects, oldest first, appended by the
// statement that ends the attempt (a nack, a permanent failure, a lease
// that ran out, a death), in a CTE of that statement (historyWrite), each
// with the attempt's number, its start (the claim's time), its end, its
// session and its error (historyEntry). The array keeps the last
// HistoryMaxEntries entries and each error's first HistoryMaxError
// characters (longer ones end with a marker that says how long they were).
// An item keeps its id wherever it goes (the dead items, the kept
// cancelled items, back to the items table on a requeue, which appends a
// requeue marker: historyRequeued), so the moves carry nothing and the
// lookup joins the row by (queue, id). crdbwork_items has no column for
// it: PostgreSQL estimates a never-analyzed table's size from its columns'
// widths, and a wider items table looked small enough that the hot
// statements' generic plans scanned it (TestHotPlansInEveryState).
//
// The ended record (crdbwork_ended) keeps the item's attempts, its enqueue
// time, its last attempt's start and session, and its kind
// (endedFromGone), from the item row's own columns: an ack's ended record,
// inserted by the ack's statement anyway, carries them, and the ack does
// not touch crdbwork_attempt_errors.
//
// What no statement records is derived when the history is read (package
// claim): an attempt whose session ended without ending it (its process
// was killed or cut off; the foreign keys released the claim) has no
// entry, and is shown as lost.
//
// The reapers delete an item's row once the item is in none of the items,
// waiting, dead and kept cancelled tables and its ended record is gone or
// older than the history window (pruneAttemptErrorsSQL).
//
// CockroachDB checked against its docs' JSONB functions and operators:
// jsonb_build_object, jsonb_build_array, jsonb_array_length, JSONB || JSONB
// (array concatenation) and JSONB - INT (removes an array element) exist
// with PostgreSQL's meaning; INSERT ... ON CONFLICT ... DO UPDATE with the
// table's alias and excluded, in a CTE, too. The text is identical on both
// engines.

// HistoryMaxEntries bounds an item's attempt_errors: the newest entries
// are kept.
const HistoryMaxEntries = 20

// HistoryMaxError bounds an entry's error, in characters.
const HistoryMaxError = 4096

// boundedError is the text expression e cut to HistoryMaxError characters,
// with a marker when it was longer.
func boundedError(e string) string {
	return `CASE WHEN length(` + e + `) > 4096 THEN substr(` + e + `, 1, 4096) || ' …[cut: ' || length(` + e + `)::TEXT || ' characters in all]' ELSE ` + e + ` END`
}

// historyEntry is the JSON object of an attempt that ends now with error e
// (a TEXT expression), read from the item row's columns attempts,
// claimed_at and claim, prefixed with p ("", "i." or "g."), and kind
// (failed, lease, dead, ...).
func historyEntry(p, kind, e string) string {
	return `jsonb_build_object('attempt', ` + p + `attempts, 'started_at', ` + p + `claimed_at, 'ended_at', now(), 'session', ` +
		p + `claim, 'kind', '` + kind + `', 'error', ` + boundedError(e) + `)`
}

// historyWrite returns a CTE, named name, that appends to
// crdbwork_attempt_errors, for each row o of the relation from (columns
// queue and id, and what entry reads), the JSON object entry (an
// expression over o), dropping the row's oldest entry when it holds
// HistoryMaxEntries. A statement's ids are distinct items: no row is
// written twice.
func historyWrite(name, from, entry string) string {
	return name + ` AS (
    INSERT INTO crdbwork_attempt_errors AS h (queue, id, errors, updated_at)
    SELECT o.queue, o.id, jsonb_build_array(` + entry + `), now() FROM ` + from + ` AS o
    ON CONFLICT (queue, id) DO UPDATE
    SET errors = (CASE WHEN jsonb_array_length(h.errors) >= 20 THEN h.errors - 0 ELSE h.errors END) || excluded.errors,
        updated_at = excluded.updated_at
    RETURNING h.id)`
}

// historyRequeued is the requeue marker (an entry without attempt): the
// item left the dead or the cancelled items (from) for the items table,
// and its attempts count from one again.
func historyRequeued(from string) string {
	return `jsonb_build_object('kind', 'requeued', 'from', '` + from + `', 'ended_at', now())`
}

// heldOld is the CTE, named old, that reads the item row a nack or a
// permanent failure ends the attempt of (heldBy) as the statement's
// snapshot has it: the columns its history entry reads before the
// statement's UPDATE (a CTE named upd, RETURNING id) releases the claim,
// which sets claim and claimed_at to NULL. It locks nothing: in
// PostgreSQL a CTE only its history's INSERT reads runs after the UPDATE,
// and a FOR UPDATE there skipped the row the UPDATE had just changed (no
// entry was written). heldEnded keeps the rows the UPDATE changed (the
// claim still held when it ran): a nack that lost its claim to the lease
// reaper meanwhile writes no entry of its own.
const heldOld = `old AS MATERIALIZED (
    SELECT queue, id, attempts, claimed_at, claim FROM crdbwork_items WHERE ` + heldBy + `)`

// heldEnded is the relation, for historyWrite, of the rows of heldOld the
// statement's UPDATE (upd) changed.
const heldEnded = `(SELECT * FROM old WHERE id IN (SELECT id FROM upd))`

// Kinds of history entries (attempt_errors[].kind).
const (
	HistoryFailed    = "failed"    // a nack: the handler returned an error (retried)
	HistoryPermanent = "permanent" // the handler failed for good (its item dies)
	HistoryLease     = "lease"     // its lease ran out before the handler ended it
	HistoryDead      = "dead"      // the attempt's failure ended the item dead
	HistoryRequeued  = "requeued"  // a marker: requeued from the dead or cancelled items
)

// goneHistory are the columns of an items-table delete's RETURNING that
// endedFromGone reads.
const goneHistory = `attempts, enqueued_at, claimed_at, claim, kind`

// endedFromGone is the history an ended record takes from the gone row
// g of an items-table delete (goneHistory): with the attempts, the
// enqueue time and the last attempt's start and session, the item's kind
// (NULL: none), so that an acked or taken item's record says what it was.
const endedFromGone = `g.attempts, g.enqueued_at, g.claimed_at, g.claim, g.kind`

// endedFromWaiting is the history of an item that ended while it waited
// (it never ran): no attempt; g has the columns enqueued_at and kind.
const endedFromWaiting = `0::BIGINT, g.enqueued_at, NULL::TIMESTAMPTZ, NULL::UUID, g.kind`

// endedHistoryColumns are crdbwork_ended's history columns, in the order
// of endedFromGone. Code of versions 3 to 5 writes none of them: its
// records read as no history and no kind.
const endedHistoryColumns = `attempts, enqueued_at, started_at, session, kind`

// endedHistoryUpdate refreshes the history columns of an ended row already
// there (ON CONFLICT ... DO UPDATE SET).
const endedHistoryUpdate = `attempts = excluded.attempts, enqueued_at = excluded.enqueued_at, started_at = excluded.started_at,
        session = excluded.session, kind = excluded.kind`

// keepWindow is queue $1's window for ended records: the longer of its
// dedup and history windows (a queue without a row: a day each).
const keepWindow = `COALESCE((SELECT GREATEST(dedup_window, history_window) FROM crdbwork_queues WHERE name = $1), ` + DefaultDedupWindow + `)`

// keepsNothing is the condition, on the gone row g, that its queue keeps no
// ended records: its dedup window is off (zero). Such a queue keeps no
// history of ended items either, whatever its history window: an id ended
// while the window was off must not be taken for a duplicate once it is
// turned on again, and a queue that turned dedup off to spare its acks the
// ended record keeps that saving.
const keepsNothing = `EXISTS (SELECT 1 FROM crdbwork_queues AS w WHERE w.name = g.queue AND w.dedup_window <= INTERVAL '0 seconds')`

// leaseRanOut is the CTE, named hist, of the lease reaper's release: the
// attempt whose lease ran out (a row of picked, which has the columns
// historyEntry reads) gets an entry (its handler may still run: a later
// ack of it fails, its claim being gone).
var leaseRanOut = historyWrite("hist", "picked", historyEntry("o.", HistoryLease, `'lease expired: the handler neither ended the attempt nor extended its lease in time'`))

// attemptErrorsOf is the item's errors array read at lookup time: a
// subquery over crdbwork_attempt_errors for the row alias r (columns queue
// and id); NULL when it has none.
func attemptErrorsOf(r string) string {
	return `(SELECT h.errors FROM crdbwork_attempt_errors AS h WHERE h.queue = ` + r + `.queue AND h.id = ` + r + `.id)`
}
