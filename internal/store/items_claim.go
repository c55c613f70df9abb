package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The protocol of package claim: claims, acks, nacks, releases, leases, the
// reaper's moves and the dead items. Every method returns the driver's
// error as it is (Classify is the caller's, once, where it wraps the
// error): a method adds no context of its own, so that the callers' error
// texts stay theirs.

// ClaimKey names one claim of one item: the item's id, the session that
// holds the claim and the claim's fencing token. Every statement that acts
// on a claimed item acts only if (ID, Session, Token) still match.
type ClaimKey struct {
	ID      uuid.UUID
	Session uuid.UUID
	Token   int64
}

// ClaimArgs are the parameters every claim takes.
type ClaimArgs struct {
	// Session is the session that claims.
	Session uuid.UUID
	// Queue is the queue claimed from.
	Queue string
	// Limit is the most items to claim.
	Limit int
	// Lease is the lease the claims take, at microsecond precision.
	Lease time.Duration
	// SkipTenants lists tenants whose items are left unclaimed (nil: none).
	SkipTenants []string
	// PartLimit, if above zero and below Limit, is the most items
	// ClaimParts reads from each part (partClaimStatements.ClaimShares);
	// zero: Limit. The other claims ignore it.
	PartLimit int
}

// UrgentArgs are the parameters of the urgent lane's claim (ClaimUrgent).
type UrgentArgs struct {
	ClaimArgs
	// MaxPriority is the lane's threshold: items with a priority above it
	// are left.
	MaxPriority int
	// OwnedParts are the parts the session owns; items of limited tenants
	// are taken only from these: every tenant's if AllTenantsLimited,
	// otherwise those of LimitedTenants. The zero values restrict nothing.
	OwnedParts        []int
	AllTenantsLimited bool
	LimitedTenants    []string
}

// ClaimedRow is one item a claim returned: the columns every claim
// statement returns (see itemColumns), as Go values.
type ClaimedRow struct {
	ID          uuid.UUID
	Queue       string
	Part        int
	Key         string // "" if none
	Priority    int
	Attempts    int
	MaxAttempts int
	Payload     []byte
	Metadata    []byte
	EnqueuedAt  time.Time
	VestingAt   time.Time
	LastError   string // "" if none
	// InPart reports a parts-mode claim (claim_part is set).
	InPart     bool
	Token      int64
	LeaseUntil time.Time
	Tenant     string    // "" if none
	ExpiresAt  time.Time // zero if none
	AtMostOnce bool
	TurnAt     time.Time
	// Checkpoint is the item's saved checkpoint (nil if none), and
	// ProgressDone and ProgressTotal its saved progress (HasProgress false
	// if none): see items_checkpoint.go.
	Checkpoint                  []byte
	HasProgress                 bool
	ProgressDone, ProgressTotal int64
	Headers                     []byte // the JSON object of the headers column; nil if NULL
	// Timeout is the item's own handler timeout (timeout_us; zero: none).
	Timeout time.Duration
	// Kind is the item's kind ("" if NULL).
	Kind string
}

// PickedRow is one item PickParts locked: its id and its place in claim
// order.
type PickedRow struct {
	ID       uuid.UUID
	Priority int64
	TurnAt   time.Time
}

// DeadItemRow is one death of a dead item, as DeadItems and
// DeadItemsBefore return it.
type DeadItemRow struct {
	ID          uuid.UUID
	Death       uuid.UUID
	Part        int
	Key         string // "" if none
	Priority    int
	Attempts    int
	MaxAttempts int
	Payload     []byte
	Metadata    []byte
	LastError   string // "" if none
	EnqueuedAt  time.Time
	DiedAt      time.Time
	Tenant      string // "" if none
	Reason      string
	Kind        string // "" if none
	// History is its errors of crdbwork_attempt_errors (schema version 6; read by DeadOfID
	// only, nil otherwise or if none): read it with ParseHistory.
	History []byte
}

// RequeueResult says what Requeue did.
type RequeueResult struct {
	// Moved reports that the death went back into the items table.
	Moved bool
	// LiveQueue is the queue of the item with the id that is in the items
	// table, or else of the waiting item with the id (Waiting true), if any
	// ("" and Live false otherwise); read only when nothing moved.
	LiveQueue string
	Live      bool
	// Waiting reports that the live id is a waiting item's (an item
	// enqueued again with prerequisites not yet acked), not an item's.
	Waiting bool
	// Deaths counts the deaths of the id in the queue that matched the
	// request; read only when nothing moved.
	Deaths int64
}

// byDialect returns postgres on PostgreSQL and common otherwise.
func byDialect(d Dialect, common, postgres string) string {
	if d == Postgres {
		return postgres
	}
	return common
}

// orEmpty returns s, or an empty list for nil (NULL in an ANY would
// match, or exclude, nothing at all).
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// rawIDs returns ids as [16]byte values, which pgx encodes directly
// (uuid.UUID goes through its text form, a fifth of a worker's client CPU
// in the bench).
func rawIDs(ids []uuid.UUID) [][16]byte {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// fenceArrays returns the arrays of the fenced statements ($1 ids, $2
// sessions, $3 tokens).
func fenceArrays(keys []ClaimKey) (ids, sessions uuidArray, tokens []int64) {
	ids = make(uuidArray, len(keys))
	sessions = make(uuidArray, len(keys))
	tokens = make([]int64, len(keys))
	for i, k := range keys {
		ids[i], sessions[i], tokens[i] = k.ID, k.Session, k.Token
	}
	return ids, sessions, tokens
}

// collectIDs reads one id per row, scanned as [16]byte (see rawIDs).
func collectIDs(rows pgx.Rows) ([]uuid.UUID, error) {
	defer rows.Close()
	var ids []uuid.UUID
	var id [16]byte
	dst := []any{&id} // once per statement, not per row
	for rows.Next() {
		if err := rows.Scan(dst...); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// params returns the first five parameters of the claim statements.
func (a ClaimArgs) params() []any {
	return []any{a.Session, a.Queue, a.Limit, a.Lease.Microseconds(), orEmpty(a.SkipTenants)}
}

// claimAnySQL is the text of coreStatements.ClaimAny
// (rendered by newCoreStatements).
//
// Acks and takes record the ended ids in the same statement (see ended.go).
var claimAnySQL = fmt.Sprintf(claimTemplate, joinPicked)

// postgresClaimAnySQL is the text of coreStatements.PostgresClaimAny
// (rendered by newCoreStatements).
var postgresClaimAnySQL = pgClaimTwin(fmt.Sprintf(pgClaimOrder(claimTemplate), anyPicked))

// ItemsClaimAny claims up to a.Limit claimable items of a.Queue in any part
// (coreStatements.ClaimAny, or its PostgreSQL twin), in claim order per
// statement (not sorted here). Run it in an explicit SERIALIZABLE
// transaction on CockroachDB, and by itself on PostgreSQL (see
// claimTemplate).
func (s *Store) ItemsClaimAny(ctx context.Context, db DB, d Dialect, a ClaimArgs) ([]ClaimedRow, error) {
	return queryClaimed(ctx, db, a.Limit, byDialect(d, s.st.ClaimAny, s.st.PostgresClaimAny), a.params()...)
}

// ItemsClaimParts claims up to a.Limit claimable items of a.Queue in the given
// parts, which the session must own (partClaimStatements.Claim, or
// ClaimShares with a.PartLimit): 1 to MaxPartBranches distinct parts (it
// panics otherwise). Run it as ClaimAny.
func (s *Store) ItemsClaimParts(ctx context.Context, db DB, d Dialect, a ClaimArgs, parts []int64) ([]ClaimedRow, error) {
	args := a.params()
	for _, p := range parts {
		args = append(args, p)
	}
	if a.PartLimit > 0 && a.PartLimit < a.Limit {
		return queryClaimed(ctx, db, a.Limit, s.parts.ClaimShares(d, len(parts)), append(args, a.PartLimit)...)
	}
	return queryClaimed(ctx, db, a.Limit, s.parts.Claim(d, len(parts)), args...)
}

// ItemsPickParts locks, in tx, up to limit claimable items of queue in the given
// parts (1 to MaxPartBranches of them; it panics otherwise), the best in
// claim order, skipping the items of skipTenants, and returns them
// (partClaimStatements.Pick). ClaimPicked claims those chosen.
func (s *Store) ItemsPickParts(ctx context.Context, tx pgx.Tx, queue string, limit int, skipTenants []string, parts []int64) ([]PickedRow, error) {
	args := []any{queue, limit, orEmpty(skipTenants)}
	for _, p := range parts {
		args = append(args, p)
	}
	rows, err := tx.Query(ctx, s.parts.Pick(len(parts)), args...)
	if err != nil {
		return nil, err
	}
	var out []PickedRow
	var r PickedRow
	if _, err := pgx.ForEachRow(rows, []any{&r.ID, &r.Priority, &r.TurnAt}, func() error {
		out = append(out, r)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// ItemsClaimPicked claims for session, with lease, the items with the given ids
// that PickParts locked in the same transaction
// (partClaimStatements.ClaimPickedFor).
func (s *Store) ItemsClaimPicked(ctx context.Context, tx pgx.Tx, d Dialect, session uuid.UUID, lease time.Duration, ids []uuid.UUID) ([]ClaimedRow, error) {
	// Planned for its parameters at every run (no cached generic plan):
	// on PostgreSQL the plan of this join depends on the table's size, and
	// a generic plan made while the table was small (a scan, then the
	// cheapest) would be kept as it grows. A custom plan reads the table's
	// size at each run (one round trip more, to describe it). It serves only sessions owning more than
	// MaxPartBranches parts, once per claim.
	return queryClaimed(ctx, tx, len(ids), s.parts.ClaimPickedFor(d), pgx.QueryExecModeDescribeExec, session, lease.Microseconds(), ids)
}

// ItemsClaimUrgent is the urgent lane's claim (urgentStatements): ClaimAny
// restricted to items with priority at most a.MaxPriority, and the items of
// limited tenants to the session's own parts. Run it as ClaimAny.
func (s *Store) ItemsClaimUrgent(ctx context.Context, db DB, d Dialect, a UrgentArgs) ([]ClaimedRow, error) {
	owned := make([]int64, len(a.OwnedParts))
	for i, p := range a.OwnedParts {
		owned[i] = int64(p)
	}
	args := append(a.params(), int64(a.MaxPriority), a.AllTenantsLimited, orEmpty(a.LimitedTenants), owned)
	return queryClaimed(ctx, db, a.Limit, s.urgent.ForDialect(d), args...)
}

// queryClaimed runs a claim statement and reads its item columns. The
// scan's destinations are declared once per statement, not per row (each
// would be a heap allocation per item), and the id is scanned as 16 bytes
// (uuid.UUID's sql.Scanner goes through a string). limit, the most rows the
// statement returns, sizes the result once the first row came (up to
// maxClaimHint rows).
func queryClaimed(ctx context.Context, db DB, limit int, stmt string, args ...any) ([]ClaimedRow, error) {
	rows, err := db.Query(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ClaimedRow
	var it ClaimedRow
	var part, prio, attempts, maxAttempts int64
	var key, lastErr, tenant, kind *string
	var claimPart *int64
	var expires *time.Time
	var done, total, timeout *int64
	dst := []any{(*[16]byte)(&it.ID), &it.Queue, &part, &key, &prio, &attempts, &maxAttempts,
		&it.Payload, &it.Metadata, &it.EnqueuedAt, &it.VestingAt, &lastErr, &claimPart, &it.Token, &it.LeaseUntil,
		&tenant, &expires, &it.AtMostOnce, &it.TurnAt, &it.Headers, &it.Checkpoint, &done, &total, &timeout, &kind}
	for rows.Next() {
		it = ClaimedRow{}
		key, lastErr, tenant, claimPart, expires, done, total, timeout, kind = nil, nil, nil, nil, nil, nil, nil, nil, nil
		if err := rows.Scan(dst...); err != nil {
			return nil, err
		}
		if timeout != nil && *timeout > 0 {
			it.Timeout = time.Duration(*timeout) * time.Microsecond
		}
		if done != nil && total != nil {
			it.HasProgress, it.ProgressDone, it.ProgressTotal = true, *done, *total
		}
		if tenant != nil {
			it.Tenant = *tenant
		}
		if kind != nil {
			it.Kind = *kind
		}
		if expires != nil {
			it.ExpiresAt = *expires
		}
		it.Part, it.Priority, it.Attempts, it.MaxAttempts = int(part), int(prio), int(attempts), int(maxAttempts)
		if key != nil {
			it.Key = *key
		}
		if lastErr != nil {
			it.LastError = *lastErr
		}
		it.InPart = claimPart != nil
		if out == nil {
			out = make([]ClaimedRow, 0, max(1, min(limit, maxClaimHint)))
		}
		out = append(out, it)
	}
	return out, rows.Err()
}

// maxClaimHint bounds the rows queryClaimed makes room for up front.
const maxClaimHint = 1024

// takeAtMostOnceSQL is the text of coreStatements.TakeAtMostOnce
// (rendered by newCoreStatements).
var takeAtMostOnceSQL = deleteEnded(`DELETE FROM crdbwork_items WHERE `+fenced+` AND at_most_once`, OutcomeTaken)

// postgresTakeAtMostOnceSQL is the text of coreStatements.PostgresTakeAtMostOnce
// (rendered by newCoreStatements).
var postgresTakeAtMostOnceSQL = deleteEnded(`DELETE FROM crdbwork_items AS i USING `+pgKeys+` WHERE `+pgFencedTake, OutcomeTaken)

// ItemsTakeAtMostOnce deletes the at-most-once items among the given claims
// that are still held, recording them as taken, and returns their ids
// (coreStatements.TakeAtMostOnce, or its PostgreSQL twin).
func (s *Store) ItemsTakeAtMostOnce(ctx context.Context, db DB, d Dialect, keys []ClaimKey) ([]uuid.UUID, error) {
	ids, sessions, tokens := fenceArrays(keys)
	rows, err := db.Query(ctx, byDialect(d, s.st.TakeAtMostOnce, s.st.PostgresTakeAtMostOnce), ids, sessions, tokens)
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// AckTxOptions returns the options of an ack's transaction on d (claim.Queue
// runs AckMany and the handlers' records in it): SERIALIZABLE on both
// engines. The function stays so that the ack's isolation is decided in one
// place, beside the ack's statements.
//
// SERIALIZABLE is what the ack promises (DESIGN.md section 3): the item's
// delete, checked against the claim and token the acker holds, and the
// records that write its result commit in one SERIALIZABLE transaction or
// not at all, and the records see one snapshot, as any serializable
// transaction does. On PostgreSQL, whose default is READ COMMITTED, it must
// be asked for explicitly (DESIGN.md section 7).
//
// What made SERIALIZABLE acks slow on PostgreSQL (issue #19: 6–7 rollbacks
// and re-prepares per 1,000 items) was the delete's plan, not the
// isolation level: the old plan scanned every claimed row, so the SIRead
// (predicate) locks of one acker's read covered the rows the other ackers
// deleted, and two ackers aborted each other at COMMIT though they never
// touched the same item. PostgresAckMany is a primary-key nested loop
// (TestHotPlansInEveryState), so an ack reads, and predicate-locks, only
// the rows of its own items, and concurrent ackers no longer conflict.
//
// A row the delete finds changed or deleted by a transaction that
// committed after the ack's snapshot (a reaper's release, a re-claim, a
// nack, a Cancel, another ack) is a serialization failure on PostgreSQL
// ("could not serialize access due to concurrent update/delete"): the ack
// is retried whole, and the retry's snapshot checks the claim and token on
// the newest row, so a claim released and taken again (every claim bumps
// the token) is reported lost and nothing is written.
func AckTxOptions(d Dialect) pgx.TxOptions {
	return pgx.TxOptions{IsoLevel: pgx.Serializable}
}

// ItemsAck deletes, in tx, the items whose claims are still held, recording
// them as acked, and returns their ids (coreStatements.AckMany, or its
// PostgreSQL twin).
func (s *Store) ItemsAck(ctx context.Context, tx pgx.Tx, d Dialect, keys []ClaimKey) ([]uuid.UUID, error) {
	acked, _, err := s.ItemsAckDependents(ctx, tx, d, keys)
	return acked, err
}

// ackManySQL is the text of coreStatements.AckMany
// (rendered by newCoreStatements).
var ackManySQL = deleteEndedAck(`DELETE FROM crdbwork_items WHERE ` + fenced)

// postgresAckManySQL is the text of coreStatements.PostgresAckMany
// (rendered by newCoreStatements).
var postgresAckManySQL = deleteEndedAck(`DELETE FROM crdbwork_items AS i USING ` + pgKeys + ` WHERE ` + pgFenced)

// ItemsAckDependents is AckMany that also returns which of the acked items
// other items wait for (NewItem.After in package claim): read by the same
// statement, in the ack's snapshot, one primary-key seek of the edges per
// acked item. Release their dependents once tx committed.
func (s *Store) ItemsAckDependents(ctx context.Context, tx pgx.Tx, d Dialect, keys []ClaimKey) (acked, waitedFor []uuid.UUID, err error) {
	ids, sessions, tokens := fenceArrays(keys)
	rows, err := tx.Query(ctx, byDialect(d, s.st.AckMany, s.st.PostgresAckMany), ids, sessions, tokens)
	if err != nil {
		return nil, nil, err
	}
	return scanAcked(rows)
}

// ItemsAckBegin returns the batch that begins an ack's transaction with
// opts (AckTxOptions) and runs in it the ack of keys (AckMany, or its
// PostgreSQL twin, as ItemsAckDependents): one round trip for both. With no
// keys it only begins the transaction. Send it on a connection that is not
// in a transaction; read it with ReadAckBegin, then close it: the
// transaction is BatchResults.Tx, open unless the batch failed.
//
// Both engines take BEGIN as a statement of a pipeline (the extended
// protocol), PostgreSQL always and CockroachDB with its options honoured
// since cockroachdb/cockroach#87047 (22.2); SERIALIZABLE is CockroachDB's
// default isolation anyway unless the cluster's default was changed.
func (s *Store) ItemsAckBegin(d Dialect, opts pgx.TxOptions, keys []ClaimKey) *pgx.Batch {
	b := &pgx.Batch{}
	b.BeginTx(opts)
	if len(keys) > 0 {
		ids, sessions, tokens := fenceArrays(keys)
		b.Queue(byDialect(d, s.st.AckMany, s.st.PostgresAckMany), ids, sessions, tokens)
	}
	return b
}

// ReadAckBegin reads the results of the batch ItemsAckBegin returned: the
// BEGIN's, then (if b holds the ack) the acked ids and those that items
// wait for, as ItemsAckDependents returns them.
func ReadAckBegin(br pgx.BatchResults, b *pgx.Batch) (acked, waitedFor []uuid.UUID, err error) {
	if _, err := br.Exec(); err != nil {
		return nil, nil, err
	}
	if b.Len() < 2 {
		return nil, nil, nil
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, err
	}
	return scanAcked(rows)
}

// scanAcked reads the rows of an ack statement: each deleted item's id and
// whether items wait for it.
func scanAcked(rows pgx.Rows) (acked, waitedFor []uuid.UUID, err error) {
	var id [16]byte
	var deps bool
	_, err = pgx.ForEachRow(rows, []any{&id, &deps}, func() error {
		acked = append(acked, id)
		if deps {
			waitedFor = append(waitedFor, id)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return acked, waitedFor, nil
}

// extendSQL is the text of coreStatements.Extend
// (rendered by newCoreStatements).
const extendSQL = `UPDATE crdbwork_items SET lease_until = now() + $4::BIGINT * INTERVAL '1 microsecond'
WHERE ` + fenced + ` RETURNING id, lease_until`

// postgresExtendSQL is the text of coreStatements.PostgresExtend
// (rendered by newCoreStatements).
const postgresExtendSQL = `UPDATE crdbwork_items AS i SET lease_until = now() + $4::BIGINT * INTERVAL '1 microsecond'
FROM ` + pgKeys + `
WHERE ` + pgFenced + ` RETURNING i.id, i.lease_until`

// ItemsExtend moves to now()+lease the leases of the given claims that are still
// held and returns their new ends by id (coreStatements.Extend, or its
// PostgreSQL twin).
func (s *Store) ItemsExtend(ctx context.Context, db DB, d Dialect, keys []ClaimKey, lease time.Duration) (map[uuid.UUID]time.Time, error) {
	ids, sessions, tokens := fenceArrays(keys)
	rows, err := db.Query(ctx, byDialect(d, s.st.Extend, s.st.PostgresExtend), ids, sessions, tokens, lease.Microseconds())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	until := make(map[uuid.UUID]time.Time, len(keys))
	for rows.Next() {
		var id [16]byte
		var t time.Time
		if err := rows.Scan(&id, &t); err != nil {
			return nil, err
		}
		until[id] = t
	}
	return until, rows.Err()
}

// nackSQL is the text of coreStatements.Nack (rendered by newCoreStatements).
var nackSQL = `WITH ` + heldOld + `,
upd AS (
    UPDATE crdbwork_items
    SET ` + released + `,
        vesting_at = now() + $4::BIGINT * INTERVAL '1 microsecond',
        turn_at = now() + $4::BIGINT * INTERVAL '1 microsecond', last_error = $5
    WHERE ` + heldBy + `
    RETURNING id),
` + historyWrite("hist", heldEnded, historyEntry("o.", HistoryFailed, "$5::TEXT")) + `
SELECT id FROM upd`

// ItemsNack releases a held claim with its attempt counted: the item vests again
// after delay (at microsecond precision), with lastError. It reports whether
// the claim was held (coreStatements.Nack).
func (s *Store) ItemsNack(ctx context.Context, db DB, k ClaimKey, delay time.Duration, lastError string) (bool, error) {
	return execOne(ctx, db, s.st.Nack, k.ID, k.Session, k.Token, delay.Microseconds(), lastError)
}

// coreReleaseSQL is the text of coreStatements.Release
// (rendered by newCoreStatements).
//
// Release gives the attempt back (retry accounting); the token stays.
const coreReleaseSQL = `UPDATE crdbwork_items
SET ` + released + `, attempts = GREATEST(attempts - 1, 0)
WHERE ` + heldBy

// ItemsRelease releases a held claim and gives its attempt back. It reports
// whether the claim was held (coreStatements.Release).
func (s *Store) ItemsRelease(ctx context.Context, db DB, k ClaimKey) (bool, error) {
	return execOne(ctx, db, s.st.Release, k.ID, k.Session, k.Token)
}

// exhaustSQL is the text of deathStatements.Exhaust
// (rendered by newDeathStatements).
var exhaustSQL = `WITH ` + heldOld + `,
upd AS (
    UPDATE crdbwork_items
    SET ` + released + `, attempts = GREATEST(attempts, max_attempts), last_error = $4
    WHERE ` + heldBy + `
    RETURNING id),
` + historyWrite("hist", heldEnded, historyEntry("o.", HistoryPermanent, "$4::TEXT")) + `
SELECT id FROM upd`

// ItemsExhaust releases a held claim with the item's attempts used up and
// lastError set, for the reaper to move it to the dead items. It reports
// whether the claim was held (deathStatements.Exhaust).
func (s *Store) ItemsExhaust(ctx context.Context, db DB, k ClaimKey, lastError string) (bool, error) {
	return execOne(ctx, db, s.death.Exhaust, k.ID, k.Session, k.Token, lastError)
}

// execOne runs a statement on one row and reports whether it changed one.
func execOne(ctx context.Context, db DB, stmt string, args ...any) (bool, error) {
	tag, err := db.Exec(ctx, stmt, args...)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() > 0, nil
}

// deadLetterSQL is the text of coreStatements.DeadLetter
// (rendered by newCoreStatements).
var deadLetterSQL = `WITH gone AS (
    DELETE FROM crdbwork_items WHERE ` + heldBy + `
    RETURNING id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, enqueued_at, claim_token, tenant, seq_order, kind,
        claimed_at, claim),
` + recordEnded(OutcomeDead, endedFromGone) + `,
` + historyWrite("hist", "gone", historyEntry("o.", HistoryDead, "$4::TEXT")) + `
INSERT INTO crdbwork_dead_items
    (id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, claim_token, tenant, reason, ` + deadSeqColumns + `)
SELECT id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, $4, enqueued_at, claim_token, tenant, $5, ` + deadSeqValues + ` FROM gone
RETURNING id`

// ItemsDeadLetter moves a held claim's item to the dead items with lastError and
// reason, recording it as ended. It reports whether the claim was held
// (coreStatements.DeadLetter).
func (s *Store) ItemsDeadLetter(ctx context.Context, db DB, k ClaimKey, lastError, reason string) (bool, error) {
	var id uuid.UUID
	err := db.QueryRow(ctx, s.st.DeadLetter, k.ID, k.Session, k.Token, lastError, reason).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// releaseForgotSQL is the text of coreStatements.ReleaseForgot
// (rendered by newCoreStatements).
//
// Items claimed by the session but not in the keep list: a claim whose
// answer was lost. The attempt is given back, as by Release.
const releaseForgotSQL = `UPDATE crdbwork_items
SET ` + released + `, attempts = GREATEST(attempts - 1, 0)
WHERE claim = $2 AND queue = $1 AND NOT (id = ANY($3::UUID[]))`

// ItemsReleaseForgotten releases the items of queue claimed by session whose ids
// are not in keep, giving their attempts back, and returns how many it
// released (coreStatements.ReleaseForgot).
func (s *Store) ItemsReleaseForgotten(ctx context.Context, db DB, queue string, session uuid.UUID, keep []uuid.UUID) (int64, error) {
	tag, err := db.Exec(ctx, s.st.ReleaseForgot, queue, session, orEmpty(keep))
	return tag.RowsAffected(), err
}

// cancelSQL is the text of coreStatements.Cancel
// (rendered by newCoreStatements).
const cancelSQL = cancelUnclaimed

// ItemsCancel deletes item id of queue if no session holds it, recording it as
// cancelled by by for reason, and reports whether it did
// (coreStatements.Cancel). CancelItem asks a claimed item to stop.
func (s *Store) ItemsCancel(ctx context.Context, db DB, id uuid.UUID, queue, by, reason string) (bool, error) {
	tag, err := db.Exec(ctx, s.st.Cancel, id, queue, by, reason)
	return tag.RowsAffected() == 1, err
}

// The reaper's steps. Each batch runs in an explicit SERIALIZABLE
// transaction (its statement locks with SKIP LOCKED) and returns the rows it
// released or moved; the candidates' reads lock nothing.

// reapLeasesSQL is the text of coreStatements.ReapLeases
// (rendered by newCoreStatements).
var reapLeasesSQL = fmt.Sprintf(reapLeasesTemplate, joinPicked+` AND i.claim IS NOT NULL AND i.lease_until < now()`)

// postgresReapLeasesSQL is the text of coreStatements.PostgresReapLeases
// (rendered by newCoreStatements).
var postgresReapLeasesSQL = fmt.Sprintf(reapLeasesTemplate, `FROM picked
WHERE i.id = ANY(ARRAY[picked.id]) AND ((i.claim IS NOT NULL AND i.lease_until < now()) OR picked.id IS NULL) IS TRUE`)

// ItemsReapLeases releases up to limit of queue's claims whose lease ended, their
// attempts counted (coreStatements.ReapLeases, or its PostgreSQL twin).
func (s *Store) ItemsReapLeases(ctx context.Context, tx pgx.Tx, d Dialect, queue string, limit int) (int64, error) {
	tag, err := tx.Exec(ctx, byDialect(d, s.st.ReapLeases, s.st.PostgresReapLeases), queue, limit)
	return tag.RowsAffected(), err
}

// reapExhaustedSQL is the text of coreStatements.ReapExhausted
// (rendered by newCoreStatements).
//
// Unclaimed items whose attempts are used up (a crash loop: every claim
// ended without an ack or a nack) move to the dead items, through
// crdbwork_items_exhausted.
var reapExhaustedSQL = `WITH picked AS MATERIALIZED (
    SELECT id FROM crdbwork_items
    WHERE queue = $1 AND claim IS NULL AND attempts >= max_attempts AND ` + noCancelAsked + `
    LIMIT $2
    FOR UPDATE SKIP LOCKED),
` + moveExhausted

// ItemsReapExhausted moves up to limit of queue's unclaimed items whose attempts
// are used up to the dead items, with lastError and reason 'crash loop'
// (coreStatements.ReapExhausted).
func (s *Store) ItemsReapExhausted(ctx context.Context, tx pgx.Tx, queue string, limit int, lastError string) (int64, error) {
	tag, err := tx.Exec(ctx, s.st.ReapExhausted, queue, limit, lastError)
	return tag.RowsAffected(), err
}

// reapExpiredSQL is the text of coreStatements.ReapExpired
// (rendered by newCoreStatements).
//
// An item past its deadline that no session holds moves to the dead
// items. (A claimed one is left to its holder: its ack may still
// come; once released, nacked or reaped, it is moved here.) The
// candidates are read through crdbwork_items_expiry
// (expiredUnclaimed).
var reapExpiredSQL = `WITH picked AS MATERIALIZED (
    SELECT id FROM crdbwork_items
    WHERE ` + expiredUnclaimed + `
    ORDER BY expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED),
` + moveExpired

// ItemsReapExpired moves up to limit of queue's unclaimed items past their
// deadline to the dead items, with reason 'expired' (coreStatements.ReapExpired).
func (s *Store) ItemsReapExpired(ctx context.Context, tx pgx.Tx, queue string, limit int) (int64, error) {
	tag, err := tx.Exec(ctx, s.st.ReapExpired, queue, limit)
	return tag.RowsAffected(), err
}

// expiredLeaseIDsSQL is the text of deathStatements.ExpiredLeaseIDs
// (rendered by newDeathStatements).
const expiredLeaseIDsSQL = `SELECT id FROM crdbwork_items
WHERE queue = $1 AND claim IS NOT NULL AND lease_until < now() AND ` + noCancelAsked + `
ORDER BY lease_until
LIMIT $2`

// ItemsReapLeasesCandidates lists up to limit candidates of ReapLeases
// (deathStatements.ExpiredLeaseIDs).
func (s *Store) ItemsReapLeasesCandidates(ctx context.Context, db DB, queue string, limit int) ([]uuid.UUID, error) {
	return queryIDs(ctx, db, s.death.ExpiredLeaseIDs, queue, limit)
}

// exhaustedIDsSQL is the text of deathStatements.ExhaustedIDs
// (rendered by newDeathStatements).
const exhaustedIDsSQL = `SELECT id FROM crdbwork_items
WHERE queue = $1 AND claim IS NULL AND attempts >= max_attempts AND ` + noCancelAsked + `
LIMIT $2`

// ItemsReapExhaustedCandidates lists up to limit candidates of ReapExhausted
// (deathStatements.ExhaustedIDs).
func (s *Store) ItemsReapExhaustedCandidates(ctx context.Context, db DB, queue string, limit int) ([]uuid.UUID, error) {
	return queryIDs(ctx, db, s.death.ExhaustedIDs, queue, limit)
}

// expiredIDsSQL is the text of deathStatements.ExpiredIDs
// (rendered by newDeathStatements).
const expiredIDsSQL = `SELECT id FROM crdbwork_items
WHERE ` + expiredUnclaimed + `
ORDER BY expires_at
LIMIT $2`

// ItemsReapExpiredCandidates lists up to limit candidates of ReapExpired
// (deathStatements.ExpiredIDs).
func (s *Store) ItemsReapExpiredCandidates(ctx context.Context, db DB, queue string, limit int) ([]uuid.UUID, error) {
	return queryIDs(ctx, db, s.death.ExpiredIDs, queue, limit)
}

func queryIDs(ctx context.Context, db DB, stmt string, args ...any) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// reapLeasesIDsSQL is the text of deathStatements.ReapLeasesIDs
// (rendered by newDeathStatements).
var reapLeasesIDsSQL = `WITH picked AS MATERIALIZED (
    SELECT id, queue, attempts, claimed_at, claim FROM crdbwork_items
    WHERE id IN (SELECT unnest($2::UUID[])) AND queue = $1 AND claim IS NOT NULL AND lease_until < now() AND ` + noCancelAsked + `
    FOR UPDATE SKIP LOCKED),
` + leaseRanOut + `
UPDATE crdbwork_items AS i
SET ` + released + `
WHERE i.id IN (SELECT id FROM picked) AND i.claim IS NOT NULL AND i.lease_until < now()
RETURNING i.id`

// ItemsReapLeasesIDs is ReapLeases for the given candidates
// (deathStatements.ReapLeasesIDs).
func (s *Store) ItemsReapLeasesIDs(ctx context.Context, tx pgx.Tx, queue string, ids []uuid.UUID) (int64, error) {
	tag, err := tx.Exec(ctx, s.death.ReapLeasesIDs, queue, rawIDs(ids))
	return tag.RowsAffected(), err
}

// reapExhaustedIDsSQL is the text of deathStatements.ReapExhaustedIDs
// (rendered by newDeathStatements).
var reapExhaustedIDsSQL = `WITH picked AS MATERIALIZED (
    SELECT id FROM crdbwork_items
    WHERE id IN (SELECT unnest($2::UUID[])) AND queue = $1 AND claim IS NULL AND attempts >= max_attempts AND ` + noCancelAsked + `
    FOR UPDATE SKIP LOCKED),
` + moveExhausted

// ItemsReapExhaustedIDs is ReapExhausted for the given candidates
// (deathStatements.ReapExhaustedIDs).
func (s *Store) ItemsReapExhaustedIDs(ctx context.Context, tx pgx.Tx, queue string, ids []uuid.UUID, lastError string) (int64, error) {
	tag, err := tx.Exec(ctx, s.death.ReapExhaustedIDs, queue, rawIDs(ids), lastError)
	return tag.RowsAffected(), err
}

// reapExpiredIDsSQL is the text of deathStatements.ReapExpiredIDs
// (rendered by newDeathStatements).
var reapExpiredIDsSQL = `WITH picked AS MATERIALIZED (
    SELECT id FROM crdbwork_items
    WHERE id IN (SELECT unnest($2::UUID[])) AND queue = $1 AND expires_at IS NOT NULL AND expires_at <= now() AND claim IS NULL AND ` + noCancelAsked + `
    FOR UPDATE SKIP LOCKED),
` + moveExpired

// ItemsReapExpiredIDs is ReapExpired for the given candidates
// (deathStatements.ReapExpiredIDs).
func (s *Store) ItemsReapExpiredIDs(ctx context.Context, tx pgx.Tx, queue string, ids []uuid.UUID) (int64, error) {
	tag, err := tx.Exec(ctx, s.death.ReapExpiredIDs, queue, rawIDs(ids))
	return tag.RowsAffected(), err
}

// deadItemsSQL is the text of coreStatements.DeadItems
// (rendered by newCoreStatements).
const deadItemsSQL = `SELECT id, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, died_at, tenant, reason, death, kind
FROM crdbwork_dead_items WHERE queue = $1
ORDER BY died_at DESC, id DESC, death DESC
LIMIT $2`

// DeadPage returns up to limit deaths of queue's dead items, newest first
// (coreStatements.DeadItems).
func (s *Store) DeadPage(ctx context.Context, db DB, queue string, limit int) ([]DeadItemRow, error) {
	return queryDead(ctx, db, s.st.DeadItems, queue, limit)
}

// deadItemsBeforeSQL is the text of deathStatements.DeadItemsBefore
// (rendered by newDeathStatements).
const deadItemsBeforeSQL = `SELECT id, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, died_at, tenant, reason, death, kind
FROM crdbwork_dead_items
WHERE queue = $1 AND died_at <= $2 AND (died_at, id, death) < ($2, $3, $4)
ORDER BY died_at DESC, id DESC, death DESC
LIMIT $5`

// DeadPageBefore returns up to limit deaths of queue's dead items after
// the death (diedAt, id, death) in DeadItems' order
// (deathStatements.DeadItemsBefore).
func (s *Store) DeadPageBefore(ctx context.Context, db DB, queue string, diedAt time.Time, id, death uuid.UUID, limit int) ([]DeadItemRow, error) {
	return queryDead(ctx, db, s.death.DeadItemsBefore, queue, diedAt, id, death, limit)
}

func queryDead(ctx context.Context, db DB, stmt string, args ...any) ([]DeadItemRow, error) {
	rows, err := db.Query(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []DeadItemRow
	for rows.Next() {
		var d DeadItemRow
		var key, lastErr, tenant, kind *string
		var part, prio, attempts, maxAttempts int64
		if err := rows.Scan(&d.ID, &part, &key, &prio, &attempts, &maxAttempts, &d.Payload, &d.Metadata,
			&lastErr, &d.EnqueuedAt, &d.DiedAt, &tenant, &d.Reason, &d.Death, &kind); err != nil {
			return nil, err
		}
		if kind != nil {
			d.Kind = *kind
		}
		d.Part, d.Priority, d.Attempts, d.MaxAttempts = int(part), int(prio), int(attempts), int(maxAttempts)
		if key != nil {
			d.Key = *key
		}
		if lastErr != nil {
			d.LastError = *lastErr
		}
		if tenant != nil {
			d.Tenant = *tenant
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// requeueStateSQL is the text of deathStatements.RequeueState
// (rendered by newDeathStatements).
const requeueStateSQL = `SELECT (SELECT queue FROM crdbwork_items WHERE id = $1),
       (SELECT queue FROM crdbwork_waiting WHERE id = $1),
       (SELECT count(*) FROM crdbwork_dead_items WHERE id = $1 AND queue = $2 AND ($3::UUID IS NULL OR death = $3))`

// requeueSQL is the text of coreStatements.Requeue
// (rendered by newCoreStatements).
//
// A requeued item keeps its id, key, tenant, priority, enqueue time
// and claim token (so tokens keep growing), gets fresh attempts, no
// deadline, at-least-once delivery, and is claimable at once. Its part is taken modulo
// the queue's current number of parts, as SetParts does for items.
// The death is picked only if the id is not live anywhere: no item
// has it, and no waiting item (an item enqueued again with
// prerequisites, in any queue), which the move would otherwise
// shadow: its release would find the id taken and be lost. The
// checks and the DELETE see one snapshot (an item inserted since
// makes the INSERT fail, and the whole statement with it; a waiting
// item inserted since is a serialization failure of the
// SERIALIZABLE transaction Requeue runs in): a refused requeue
// deletes nothing. The requeued id is no longer ended (revived).
var requeueSQL = `WITH victim AS MATERIALIZED (
    SELECT death FROM crdbwork_dead_items
    WHERE id = $1 AND queue = $2 AND ($3::UUID IS NULL OR death = $3)
      AND NOT EXISTS (SELECT 1 FROM crdbwork_items WHERE id = $1)
      AND NOT EXISTS (SELECT 1 FROM crdbwork_waiting WHERE id = $1)
    ORDER BY died_at DESC, death DESC
    LIMIT 1),
gone AS (
    DELETE FROM crdbwork_dead_items WHERE id = $1 AND death IN (SELECT death FROM victim)
    RETURNING id, queue, part, item_key, priority, max_attempts, payload, metadata, last_error, enqueued_at, claim_token, tenant, seq_order, kind),
revived AS (DELETE FROM crdbwork_ended WHERE queue = $2 AND id IN (SELECT id FROM gone) RETURNING id),
` + historyWrite("hist", "gone", historyRequeued(OutcomeDead)) + `
INSERT INTO crdbwork_items
    (id, queue, part, item_key, priority, vesting_at, turn_at, max_attempts, payload, metadata, last_error, enqueued_at, claim_token, tenant, seq_order, kind)
SELECT g.id, g.queue, g.part % n.parts, g.item_key, g.priority, now(), now(), g.max_attempts, g.payload, g.metadata, g.last_error, g.enqueued_at, g.claim_token, g.tenant,
       ` + requeuedSeqOrder + `, g.kind
FROM gone AS g,
     (SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $2 FOR SHARE), 1) AS parts,
             COALESCE((SELECT sequenced FROM crdbwork_queues WHERE name = $2), false) AS sequenced) AS n
RETURNING id`

// DeadRequeue moves, in tx, a death of dead item id of queue back into the
// items table (coreStatements.Requeue): death, or the newest death of id if
// death is nil. If nothing moved, it reads why (deathStatements.RequeueState):
// the queue of a live item, or waiting item, with the id, and how many
// deaths matched. Run it in a SERIALIZABLE transaction.
func (s *Store) DeadRequeue(ctx context.Context, tx pgx.Tx, id uuid.UUID, queue string, death *uuid.UUID) (RequeueResult, error) {
	var r RequeueResult
	tag, err := tx.Exec(ctx, s.st.Requeue, id, queue, death)
	if err != nil {
		return r, err
	}
	if r.Moved = tag.RowsAffected() == 1; r.Moved {
		return r, nil
	}
	var live, waiting *string
	if err := tx.QueryRow(ctx, s.death.RequeueState, id, queue, death).Scan(&live, &waiting, &r.Deaths); err != nil {
		return RequeueResult{}, err
	}
	switch {
	case live != nil:
		r.LiveQueue, r.Live = *live, true
	case waiting != nil:
		r.LiveQueue, r.Live, r.Waiting = *waiting, true, true
	}
	return r, nil
}

// MaxPartBranches bounds the owned parts one per-part claim statement
// reads (partClaimStatements.Claim and Pick take 1 to MaxPartBranches
// parts). A session that owns more parts claims in one transaction with
// Pick per group of MaxPartBranches parts and ClaimPicked (claim.Queue does).
const MaxPartBranches = 16

// partClaimStatements are the per-part claim statements, rendered for one
// set of table names and a number of parts: one limited, locked index scan
// per owned part, combined by UNION ALL.
//
// The shape is chosen so that no decorrelation rule can turn it into a
// scan: nothing in it is correlated. The part numbers are parameters, one
// per branch, and each branch is a plain SELECT ... WHERE queue = $2 AND
// part = $k ... ORDER BY priority, turn_at LIMIT $3 FOR UPDATE SKIP LOCKED
// over crdbwork_items_part_turn (queue, part, priority, turn_at) WHERE claim
// IS NULL: a seek into one part that stops after $3 unlocked, claimable
// entries. The former shape, a LATERAL subquery over unnest of an array of
// parts, is a correlated ORDER BY ... LIMIT n, which CockroachDB's optimizer
// may decorrelate (since 21.2, cockroachdb/cockroach#68299: a row_number
// window partitioned by the outer row, filtered to the first n) into a
// scan of every unclaimed row of the listed parts, all of them locked under
// FOR UPDATE (cockroachdb/cockroach#165983, open, shows that rule applied to
// a LATERAL over unnest). Each branch is a derived table with its own
// locking clause, the form both engines document: a locking clause applies
// to the tables in its own SELECT's FROM (PostgreSQL refuses one on a UNION
// as a whole; CockroachDB docs checked: "SELECT FOR UPDATE", SKIP LOCKED
// since 22.2; "Selection Queries": UNION ALL of parenthesized selects).
//
// The statement then keeps the best $3 of the branches' rows in (priority,
// turn_at) order, as the former one did, and claims them: on CockroachDB
// it may lock up to $3 rows per owned part and hand out only $3 in all,
// which is harmless (a part is owned by one session, and the locks end with
// the claim's transaction); PostgreSQL's twin locks only the rows it claims
// (pgLockLazily). Rendered texts are cached per number of parts, so at most
// MaxPartBranches texts per dialect exist.
type partClaimStatements struct {
	t Tables
	// claims[d][k] is the claim for k parts in dialect d, shares[d][k] the
	// same with a limit per part (ClaimShares); picks[k] the pick.
	claims [2][MaxPartBranches + 1]atomic.Pointer[string]
	shares [2][MaxPartBranches + 1]atomic.Pointer[string]
	picks  [MaxPartBranches + 1]atomic.Pointer[string]
	// ClaimPicked claims the items Pick returned (chosen by the caller
	// across several Picks), in the transaction that picked them:
	// $1 session, $2 lease (µs), $3 ids → item columns. Its PostgreSQL twin
	// is PostgresClaimPicked (see ClaimPickedFor).
	ClaimPicked, PostgresClaimPicked string
}

// newPartClaimStatements returns the per-part claim statements for t.
func newPartClaimStatements(t Tables) *partClaimStatements {
	p := &partClaimStatements{t: t}
	p.ClaimPicked = rewrite(t, claimPickedSQL)
	p.PostgresClaimPicked = rewrite(t, postgresClaimPickedSQL)
	return p
}

// claimPickedSQL is the text of partClaimStatements.ClaimPicked
// (rendered by newPartClaimStatements).
var claimPickedSQL = fmt.Sprintf(claimPickedTemplate, `FROM (SELECT unnest($3::UUID[]) AS id) AS picked
WHERE i.id = picked.id AND i.claim IS NULL`)

// postgresClaimPickedSQL is the text of partClaimStatements.PostgresClaimPicked
// (rendered by newPartClaimStatements).
var postgresClaimPickedSQL = fmt.Sprintf(claimPickedTemplate, `FROM unnest($3::UUID[]) AS k (key_id)
WHERE i.id = ANY(ARRAY[k.key_id]) AND (i.claim IS NULL OR k.key_id IS NULL)`)

// ClaimPickedFor returns ClaimPicked, or its PostgreSQL twin on PostgreSQL.
func (p *partClaimStatements) ClaimPickedFor(d Dialect) string {
	if d == Postgres {
		return p.PostgresClaimPicked
	}
	return p.ClaimPicked
}

// Claim returns the per-part claim for k owned parts (1 to
// MaxPartBranches; it panics otherwise) in dialect d. Parameters: $1
// session, $2 queue, $3 limit, $4 lease (µs), $5 tenants to skip (TEXT[]),
// $6 to $(5+k) the parts → item columns, at most $3 rows, the best in
// (priority, turn_at) order across the parts. Run it as the any-part claim
// is run (see claimTemplate): in an explicit SERIALIZABLE transaction on
// CockroachDB. On PostgreSQL the UPDATE finds the picked rows by the row
// versions it locked, and the queue, the parts, the tenants and
// the limits are hidden from the plan, as in the other PostgreSQL claim
// twins (pgClaimTwin), and each candidate is locked only when the claim's
// order reaches it (pgLockLazily).
func (p *partClaimStatements) Claim(d Dialect, k int) string {
	checkParts(k)
	return p.claim(&p.claims[d][k], d, k, "$3")
}

// ClaimShares returns Claim for k owned parts in dialect d with each
// part's branch limited to its own parameter, $(6+k) (its share, at most
// $3), instead of $3: the claim locks at most k·$(6+k) rows rather than
// k·$3, and still hands out the best $3 of them in (priority, turn_at)
// order. It serves claims over parts that each hold an even share of the
// queue's turns (a fair queue's spread tenants, claim's fairspread.go), where
// the best $3 across the parts are about $3/k of each. The parameters are
// Claim's, then the share; the text is the same but for each branch's LIMIT.
func (p *partClaimStatements) ClaimShares(d Dialect, k int) string {
	checkParts(k)
	return p.claim(&p.shares[d][k], d, k, fmt.Sprintf("$%d", 6+k))
}

// claim returns the claim for k parts in dialect d whose branches are
// limited to limit (a parameter), rendered once into slot.
func (p *partClaimStatements) claim(slot *atomic.Pointer[string], d Dialect, k int, limit string) string {
	if s := slot.Load(); s != nil {
		return *s
	}
	text := fmt.Sprintf(partUnionClaimTemplate, partBranches(k, "$2", limit, "$5", 6), joinPicked)
	if d == Postgres {
		text = pgLockLazily(pgClaimTwin(fmt.Sprintf(partUnionClaimTemplate, partBranches(k, "$2", limit, "$5", 6), anyPicked)), k)
	}
	s := rewrite(p.t, text)
	slot.Store(&s)
	return s
}

// Pick returns the locking read of the per-part claim for k parts (1 to
// MaxPartBranches; it panics otherwise), for sessions owning more parts
// than one Claim reads: $1 queue, $2 limit, $3 tenants to skip (TEXT[]), $4
// to $(3+k) the parts → id, priority, turn_at of at most $2 rows, the best
// in (priority, turn_at) order, locked (FOR UPDATE SKIP LOCKED) until the
// transaction ends. The same text on both engines.
func (p *partClaimStatements) Pick(k int) string {
	checkParts(k)
	slot := &p.picks[k]
	if s := slot.Load(); s != nil {
		return *s
	}
	s := rewrite(p.t, fmt.Sprintf(partPickTemplate, partBranches(k, "$1", "$2", "$3", 4)))
	slot.Store(&s)
	return s
}

func checkParts(k int) {
	if k < 1 || k > MaxPartBranches {
		panic(fmt.Sprintf("sql: a per-part claim of %d parts (1 to %d)", k, MaxPartBranches))
	}
}

// partBranches renders the UNION ALL of k per-part scans: queue, limit and
// skip (the tenants to skip) are parameters such as "$2", and the parts are
// parameters $first to $(first+k-1).
func partBranches(k int, queue, limit, skip string, first int) string {
	var b strings.Builder
	for j := range k {
		if j > 0 {
			b.WriteString("\n        UNION ALL\n")
		}
		fmt.Fprintf(&b, partBranch, queue, first+j, skip, limit, j)
	}
	return b.String()
}

// pgLockLazily rewrites the PostgreSQL twin of a per-part claim of k parts
// (partUnionClaimTemplate after pgClaimTwin) so that it locks only the rows
// it claims: its branches read their parts' best candidates without a lock,
// and each candidate is locked (FOR UPDATE SKIP LOCKED, by its row version)
// as the claim's order reaches it, until the claim has its limit.
//
// Why: PostgreSQL returns the rows of a locking subquery unsorted as far as
// its planner knows (a lock may hand back a newer version of the row), so
// it merges the branches of partUnionClaimTemplate only by sorting all their
// rows, and every branch locks up to its limit first: a claim of n items
// over k owned parts locked up to k·n rows and claimed n (a heap write and a
// WAL record per extra lock; issue #32: the demo's shape, four owned parts
// and 86–108 items a claim, locked up to four times what it claimed). Unlocked, each branch is an ordered scan of its part
// (crdbwork_items_part_turn, stopped at its limit, as before), PostgreSQL
// merges them in claim order (a Merge Append), and the nested loop over
// the merge locks each candidate through a TID scan of its version, the
// LIMIT above it stopping the merge once n rows are locked: at most n locks
// (TestPartClaimLocksOnlyWhatItClaims).
//
// What the lock sees: a candidate comes from the statement's snapshot. A
// candidate another transaction holds is skipped (SKIP LOCKED), as the
// locking scan skipped it; one that another transaction changed and
// committed since the snapshot no longer has the candidate's version
// (READ COMMITTED rechecks the newest version, whose ctid differs) and is
// skipped too, for the next claim to take; the UPDATE still rechecks claim
// IS NULL. A branch's limit now counts the candidates it read, locked by
// others or not: in parts mode only the owner claims a part's items (the
// urgent lane aside), so skipped candidates are rare, and a worker whose
// claim came back short claims again when a handler ends, at a wake-up or
// at its poll.
//
// CockroachDB keeps the locking branches: it locks the rows its scans read
// (SKIP LOCKED since 22.2) and is not measured here.
func pgLockLazily(text string, k int) string {
	text = replaceCounted(text, "\n            FOR UPDATE SKIP LOCKED) AS p", ") AS p", k)
	text = replaceCounted(text, "SELECT c.ctid FROM (", "SELECT l.ctid FROM (", 1)
	return replaceCounted(text, ") AS c\n    WHERE NOT EXISTS", ") AS c\n    "+lazyLock+"\n    WHERE NOT EXISTS", 1)
}

// lazyLock locks one candidate of pgLockLazily's claim, by its row version.
const lazyLock = `CROSS JOIN LATERAL (SELECT x.ctid FROM crdbwork_items AS x WHERE x.ctid = c.ctid AND x.claim IS NULL FOR UPDATE SKIP LOCKED) AS l`

// partBranch is one part's scan: the queue's parameter, the part's
// parameter's number, the tenants' parameter, the limit's parameter and the
// alias's number.
const partBranch = `        SELECT id, priority, turn_at FROM (
            SELECT id, priority, turn_at FROM crdbwork_items
            WHERE queue = %s AND part = $%d AND claim IS NULL AND vesting_at <= now() AND attempts < max_attempts
              AND (expires_at IS NULL OR expires_at > now()) AND (tenant IS NULL OR NOT (tenant = ANY(%s::TEXT[])))
            ORDER BY priority, turn_at
            LIMIT %s
            FOR UPDATE SKIP LOCKED) AS p%d`

// partUnionClaimTemplate is the claim over the branches (first %s) with
// the UPDATE finding the picked rows (second %s), as in partClaimTemplate.
const partUnionClaimTemplate = `WITH picked AS MATERIALIZED (
    SELECT c.id FROM (
%s) AS c
    WHERE NOT EXISTS (SELECT 1 FROM crdbwork_queues WHERE name = $2 AND paused)
    ORDER BY c.priority, c.turn_at
    LIMIT $3)
UPDATE crdbwork_items AS i
SET claim = $1, claim_queue = i.queue, claim_part = i.part, claimed_at = now(),
    attempts = i.attempts + 1, claim_token = i.claim_token + 1,
    lease_until = now() + $4::BIGINT * INTERVAL '1 microsecond'
%s AND i.claim IS NULL
RETURNING ` + itemColumns

// partPickTemplate is Pick over the branches (%s; queue $1, limit $2).
const partPickTemplate = `SELECT c.id, c.priority, c.turn_at FROM (
%s) AS c
WHERE NOT EXISTS (SELECT 1 FROM crdbwork_queues WHERE name = $1 AND paused)
ORDER BY c.priority, c.turn_at
LIMIT $2`

// claimPickedTemplate claims picked rows by id (%s: how the UPDATE finds
// them and rechecks claim IS NULL; on CockroachDB a join with the unnested
// ids, which it plans as primary-key lookups, on PostgreSQL a nested loop of
// primary-key lookups shaped as the fenced twins are (see fenced in
// statements.go), with the recheck in a condition that names k too (k.key_id
// is never NULL where i.id matched it): a join condition, which neither
// proves the predicate of the partial indexes of unclaimed items nor makes
// a scan of the table look cheap. With id = ANY(ARRAY(...)) and a plain
// claim IS NULL, PostgreSQL read an empty table's rows through
// crdbwork_items_part_turn, whole; with the recheck alone in IS TRUE, it
// scanned the table.) The rows are locked by the Picks of the same
// transaction; the recheck of claim IS NULL is for READ COMMITTED.
const claimPickedTemplate = `UPDATE crdbwork_items AS i
SET claim = $1, claim_queue = i.queue, claim_part = i.part, claimed_at = now(),
    attempts = i.attempts + 1, claim_token = i.claim_token + 1,
    lease_until = now() + $2::BIGINT * INTERVAL '1 microsecond'
%s
RETURNING ` + itemColumns

// urgentStatements are the urgent lane's claim, rendered for one set of
// table names: the any-part claim restricted to items with priority at most
// a threshold, which any live session may run in parts mode, whoever owns
// the item's part. It bounds how far out of order urgent items are claimed
// (their popped element index; see bench/internal/order and docs/parts-and-order.md,
// "How relaxed the order is").
type urgentStatements struct {
	// ClaimUrgent claims for session $1 up to $3 vested, unexpired,
	// unclaimed items of queue $2 with priority <= $6, leaving out the
	// tenants of $5 (TEXT[]), lowest priority first, then earliest turn,
	// with a lease of $4 microseconds → the item columns. The
	// claims name no part (claim_queue and claim_part NULL, as Claim's):
	// giving up a part does not release them, deleting the session does.
	//
	// Items of limited tenants are taken only from the parts in $9
	// (BIGINT[]: the parts the session owns): every tenant's if $7 (BOOL:
	// a default tenant limit applies to all), otherwise those of the
	// tenants in $8 (TEXT[]). In parts mode a tenant's limit is enforced
	// by the owner of the tenant's part, which sees all of the tenant's
	// items there; a lane claim from any part would let every session run
	// up to the whole limit. Items without a tenant, and of tenants not
	// limited, come from any part. Empty $8 and $9 with $7 false restrict
	// nothing.
	//
	// It is the any-part claim with one more condition, priority <= $6, a
	// range on the second column of crdbwork_items_turn_next (queue,
	// priority, turn_at, part) WHERE claim IS NULL: the scan reads the
	// urgent items in claim order and stops after $3 unlocked ones, and
	// reads nothing past the threshold (internal/store/explain_test.go checks the plan;
	// CockroachDB docs "Indexes: selection" — a range on a column after
	// equality-constrained ones constrains the index span).
	//
	// Part claims scan crdbwork_items_part_turn instead. On PostgreSQL SKIP
	// LOCKED skips rows (heap tuples) locked by either claim, so the two
	// never pick the same row. On CockroachDB SKIP LOCKED sees only the locks
	// of the index it scans (cockroachdb/cockroach#57031): a lane claim and
	// the part owner's claim may pick the same urgent row, and the UPDATE's
	// recheck (i.claim IS NULL) gives it to one of them; the other waits for
	// the row's lock or retries (counted in claim.Stats.Retries["claim"]).
	// No item is ever claimed twice.
	ClaimUrgent string
	// PostgresClaimUrgent is its PostgreSQL twin: the UPDATE finds the
	// picked rows by the row versions the CTE locked, and the scan compares
	// the queue with (SELECT $2::TEXT), as the other PostgreSQL claims do
	// (see dialectStatements, pgClaimOrder and pgClaimTwin).
	PostgresClaimUrgent string
}

// urgentCondition is the lane's condition, added to the any-part claim's
// WHERE clause after claim IS NULL: the priority bound, and the parts the
// items of limited tenants may come from. (Residual filters on the rows
// the scan of crdbwork_items_turn_next reads: the scan is still bounded by
// the priority range, as TestStatementPlansUseIndexes checks.)
const (
	urgentAnchor    = "WHERE queue = $2 AND claim IS NULL AND "
	urgentCondition = "priority <= $6 AND (tenant IS NULL OR part = ANY($9::BIGINT[]) OR (NOT $7::BOOL AND NOT (tenant = ANY($8::TEXT[])))) AND "
)

// urgentTemplate returns the any-part claim template with the lane's
// condition. It panics if the template no longer has the anchor it is
// added after (a change to claimTemplate that this file must follow;
// TestUrgentClaimStatement would fail first).
func urgentTemplate() string {
	if strings.Count(claimTemplate, urgentAnchor) != 1 {
		panic("sql: the any-part claim template changed: the urgent lane's condition has no place")
	}
	return strings.Replace(claimTemplate, urgentAnchor, urgentAnchor+urgentCondition, 1)
}

// newUrgentStatements renders the urgent lane's statements for t.
func newUrgentStatements(t Tables) *urgentStatements {
	tmpl := urgentTemplate()
	return &urgentStatements{
		ClaimUrgent:         rewrite(t, fmt.Sprintf(tmpl, joinPicked)),
		PostgresClaimUrgent: rewrite(t, pgClaimTwin(fmt.Sprintf(pgClaimOrder(tmpl), anyPicked))),
	}
}

// ForDialect returns the lane's claim for d.
func (u *urgentStatements) ForDialect(d Dialect) string {
	if d == Postgres {
		return u.PostgresClaimUrgent
	}
	return u.ClaimUrgent
}
