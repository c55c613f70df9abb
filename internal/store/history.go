package store

// History (schema version 6, issue 33): what happened to an item, attempt
// by attempt, with no statement added to any path.
//
// An item's attempts that ended without success are kept on the item row,
// in attempt_errors: a JSON array of objects, oldest first, appended by the
// statement that ends the attempt (a nack, a permanent failure, a lease
// that ran out, a death), each with the attempt's number, its start (the
// claim's time), its end, its session and its error (historyEntry). The
// array keeps the last HistoryMaxEntries entries and each error's first
// HistoryMaxError characters (longer ones end with a marker that says how
// long they were). It moves with the item wherever the item goes: to the
// dead items, to the kept cancelled items, back to the items table on a
// requeue (with a requeue marker: the attempts count from one again), and
// into the ended record (crdbwork_ended), which also keeps the item's
// attempts, its enqueue time and its last attempt's start and session
// (endedFromGone): an ack's ended record, inserted by the ack's statement
// anyway, carries the history of a successful item.
//
// What no statement records is derived when the history is read (package
// claim): an attempt whose session ended without ending it (its process
// was killed or cut off; the foreign keys released the claim) has no
// entry, and is shown as lost.
//
// CockroachDB checked against its source (not run here: no server): its
// binary operators include JSONB - INT (JSON.RemoveIndex, pkg/sql/sem/tree's
// BinOps) and JSONB || JSONB, and its builtins jsonb_build_object,
// jsonb_build_array and jsonb_array_length, with PostgreSQL's meaning; the
// text is identical on both engines.

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

// historyAppend is the array expression arr with the JSON object entry
// appended, its oldest entry dropped when it holds HistoryMaxEntries.
func historyAppend(arr, entry string) string {
	return `(CASE WHEN jsonb_array_length(` + arr + `) >= 20 THEN ` + arr + ` - 0 ELSE COALESCE(` + arr + `, '[]'::JSONB) END || jsonb_build_array(` + entry + `))`
}

// historyRequeued is arr (a row's attempt_errors) with a requeue marker
// appended: the item left the dead or the cancelled items (from) for the
// items table, and its attempts count from one again.
func historyRequeued(arr, from string) string {
	return historyAppend(arr, `jsonb_build_object('kind', 'requeued', 'from', '`+from+`', 'ended_at', now())`)
}

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
const goneHistory = `attempts, enqueued_at, claimed_at, claim, attempt_errors`

// endedFromGone is the history an ended record takes from the gone row
// g of an items-table delete (goneHistory).
const endedFromGone = `g.attempts, g.enqueued_at, g.claimed_at, g.claim, g.attempt_errors`

// endedFromWaiting is the history of an item that ended while it waited
// (it never ran): no attempt; g has the column enqueued_at.
const endedFromWaiting = `0::BIGINT, g.enqueued_at, NULL::TIMESTAMPTZ, NULL::UUID, NULL::JSONB`

// endedHistoryColumns are crdbwork_ended's history columns, in the order
// of endedFromGone.
const endedHistoryColumns = `attempts, enqueued_at, started_at, session, attempt_errors`

// endedHistoryUpdate refreshes the history columns of an ended row already
// there (ON CONFLICT ... DO UPDATE SET).
const endedHistoryUpdate = `attempts = excluded.attempts, enqueued_at = excluded.enqueued_at, started_at = excluded.started_at,
        session = excluded.session, attempt_errors = excluded.attempt_errors`

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

// leaseRanOut is the assignment of the lease reaper's release: the attempt
// whose lease ran out gets an entry (its handler may still run: a later
// ack of it fails, its claim being gone).
var leaseRanOut = `attempt_errors = ` + historyAppend("i.attempt_errors", historyEntry("i.", HistoryLease, `'lease expired: the handler neither ended the attempt nor extended its lease in time'`))
