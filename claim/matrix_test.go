package claim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// The combination matrix (issue 29): every enqueue path × every item option
// (alone, and waiting for a prerequisite first) × every settle path, each
// cell in a queue of its own, all of them in one database. A cell either
// works as documented or is refused with a clear error before anything is
// written; it is never silently ignored. The tables below are the matrix:
// TestCombinationMatrixIsComplete fails when a path, an option or a settle
// path appears in the code without a row here (by reflection over NewItem,
// AckOptions, the methods of Queue, Buffer and Claimer, and the SQL
// function's parameters), and TestCombinationMatrixDocs checks
// docs/guarantees.md's tables against them (CRDBWORK_UPDATE_DOCS=1
// rewrites them).

// mxPath is one way to enqueue an item.
type mxPath struct {
	name string
	doc  string // how a caller reaches it
	// api names what reaches it: the methods (Type.Method) or the SQL function.
	api []string
}

var mxPaths = []mxPath{
	{name: "Enqueue", doc: "`Queue.Enqueue`", api: []string{"Queue.Enqueue"}},
	{name: "EnqueueTx", doc: "`Queue.EnqueueTx`, in the caller's SERIALIZABLE transaction", api: []string{"Queue.EnqueueTx"}},
	{name: "Buffer", doc: "`Buffer.Enqueue` (a flush writes through `Enqueue`'s code)", api: []string{"Buffer.Enqueue"}},
	{name: "SQL", doc: "the SQL function `crdbwork_enqueue` (docs/enqueue-from-sql.md)", api: []string{"crdbwork_enqueue"}},
	{name: "COPY", doc: "`Enqueue` of 64 or more items with generated ids: streamed by COPY (the cell's item and 64 others)"},
}

// mxOption is one option of NewItem, set on the cell's item, in the kind
// of queue it needs.
type mxOption struct {
	name   string
	label  string   // the docs table's row
	fields []string // the NewItem fields it sets (Payload: every item)
	kind   string   // "plain", "sequenced" or "fair"
	item   func(c *mxCell) claim.NewItem
}

// mxUrgent is the urgent lane's threshold (UrgentRequest.MaxPriority): the
// urgent item's priority is below it, every other item's above.
const mxUrgent = -1

var mxOptions = []mxOption{
	{name: "After", label: "`After`", fields: []string{"After"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem { return claim.NewItem{After: []uuid.UUID{c.pre}} }},
	{name: "AfterIn", label: "`AfterIn` (a prerequisite of another queue)", fields: []string{"AfterIn"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem {
			return claim.NewItem{AfterIn: []claim.Prereq{{Queue: c.preQueue, ID: c.pre}}}
		}},
	{name: "UniqueKey", label: "`UniqueKey`, `UniquePeriod`", fields: []string{"UniqueKey", "UniquePeriod"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem {
			return claim.NewItem{UniqueKey: "nightly:" + c.queue, UniquePeriod: 24 * time.Hour}
		}},
	{name: "UniqueStates", label: "`UniqueStates` (live, acked, dead: a cancelled one runs again)", fields: []string{"UniqueStates"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem {
			return claim.NewItem{UniqueKey: "again:" + c.queue, UniqueStates: claim.UniqueLive | claim.UniqueAcked | claim.UniqueDead}
		}},
	{name: "RunAfter", label: "`After` with `RunAfter` (died, cancelled)", fields: []string{"RunAfter"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem {
			return claim.NewItem{After: []uuid.UUID{c.pre}, RunAfter: claim.PrereqDied | claim.PrereqCancelled}
		}},
	{name: "Key (sequenced)", label: "`Key` in a sequenced queue", fields: []string{"Key"}, kind: "sequenced",
		item: func(c *mxCell) claim.NewItem { return claim.NewItem{Key: "account-7"} }},
	{name: "Key (sequenced, hold)", label: "`Key` in a sequenced queue that holds its keys on a death", fields: []string{"Key"}, kind: "sequenced-hold",
		item: func(c *mxCell) claim.NewItem { return claim.NewItem{Key: "account-7"} }},
	{name: "Tenant (fair)", label: "`Tenant` in a fair queue", fields: []string{"Tenant"}, kind: "fair",
		item: func(c *mxCell) claim.NewItem { return claim.NewItem{Tenant: "acme"} }},
	{name: "AtMostOnce", label: "`AtMostOnce`", fields: []string{"AtMostOnce"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem { return claim.NewItem{AtMostOnce: true} }},
	{name: "TTL", label: "`TTL`", fields: []string{"TTL"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem { return claim.NewItem{TTL: 90 * time.Minute} }},
	{name: "Timeout", label: "`Timeout`", fields: []string{"Timeout"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem { return claim.NewItem{Timeout: 42 * time.Second} }},
	{name: "Kind", label: "`Kind`", fields: []string{"Kind"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem { return claim.NewItem{Kind: "send_mail"} }},
	{name: "Delay", label: "`Delay`", fields: []string{"Delay"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem { return claim.NewItem{Delay: 700 * time.Millisecond} }},
	{name: "urgent Priority", label: "`Priority` of the urgent lane (`ClaimUrgent`)", fields: []string{"Priority"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem { return claim.NewItem{Priority: mxUrgent - 4} }},
	{name: "Headers", label: "`Headers`", fields: []string{"Headers"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem {
			return claim.NewItem{Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant-tier": "gold"}}
		}},
	{name: "Metadata", label: "`Metadata`", fields: []string{"Metadata"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem { return claim.NewItem{Metadata: []byte("meta\x00data")} }},
	{name: "MaxAttempts", label: "`MaxAttempts`", fields: []string{"MaxAttempts"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem { return claim.NewItem{MaxAttempts: 2} }},
	{name: "ID", label: "`ID`", fields: []string{"ID"}, kind: "plain",
		item: func(c *mxCell) claim.NewItem {
			return claim.NewItem{ID: uuid.NewSHA1(uuid.NameSpaceOID, []byte(c.queue))}
		}},
}

// mxSettle is one way an item's claim ends.
type mxSettle struct {
	name string
	doc  string
	api  []string // what reaches it (Type.Method, or AckOptions.Field)
}

var mxSettles = []mxSettle{
	{name: "ack", doc: "`Queue.Ack` with a record (a function, or `claim.Exec`/`worker.Exec`: its statement goes with the ack's COMMIT)", api: []string{"Queue.Ack"}},
	{name: "BatchRecord", doc: "`Queue.AckMany` with `AckOptions.Batch` (`worker.Options.BatchRecord`)", api: []string{"Queue.AckMany", "AckOptions.Batch"}},
	{name: "BatchStatement", doc: "`Queue.AckMany` with `AckOptions.Statement` (`worker.Options.BatchStatement`: one round trip on PostgreSQL)", api: []string{"AckOptions.Statement"}},
	{name: "nack", doc: "`Queue.Nack`: retried after its backoff", api: []string{"Queue.Nack"}},
	{name: "snooze", doc: "`Queue.Snooze`", api: []string{"Queue.Snooze"}},
	{name: "release", doc: "`Queue.Release`: given back without using an attempt", api: []string{"Queue.Release"}},
	{name: "cancel", doc: "`Queue.CancelItem` while it runs (while it waits, for an item after a prerequisite), then `Queue.EndCancelled`", api: []string{"Queue.CancelItem", "Queue.EndCancelled"}},
	{name: "dead", doc: "`Queue.Nack` with `claim.Permanent`", api: []string{}},
	{name: "requeue", doc: "dead, then `Queue.Requeue`", api: []string{"Queue.Requeue"}},
	{name: "retention", doc: "dead, then deleted by the worker's queue reap under the queue's retention (`SettingsUpdate.Retention`, `Retention.DeadMaxCount`)", api: []string{"Queue.UpdateSettings"}},
}

// mxNotPaths are the exported methods of Queue, Buffer and Claimer that
// neither enqueue nor settle an item's claim, with the reason. A new
// method must be listed here or in a path's api.
var mxNotPaths = map[string]string{
	"Queue.Backoff": "test export", "Queue.AckBatch": "test export (AckMany's older form, same transaction)",
	"Queue.DeadCountChecks": "test export", "Queue.CancelledItems": "reads", "Queue.Items": "reads", "Queue.Item": "reads", "Queue.Claimer": "claims",
	"Queue.DB":           "a handle",
	"Queue.DeadItems":    "reads",
	"Queue.Dependencies": "reads", "Queue.Inspect": "reads", "Queue.Name": "a name", "Queue.Options": "reads",
	"Queue.Progressing": "reads",
	"Queue.Purge":       "deletes a whole queue (operators)", "Queue.ReportProgress": "progress of a running item (no end)", "Queue.SaveCheckpoint": "progress of a running item (no end)",
	"Queue.Settings": "reads", "Queue.Stats": "reads", "Queue.WaitDrained": "reads", "Queue.BlockedKeys": "reads", "Queue.ReleaseSequenceKey": "releases a key that dead items hold: no item ends (the hold cells call it)", "Queue.WaitEnded": "reads", "Queue.Wake": "wakes workers",
	"Buffer.Close": "flushes what Enqueue took", "Buffer.Stats": "reads",
	"Claimer.Claim": "claims", "Claimer.ClaimUrgent": "claims (the urgent lane)", "Claimer.Extend": "extends a claim",
	"Claimer.ReleaseForgotten": "gives claims back (see Release)", "Claimer.CancelRequests": "reads",
}

// mxSQLParams maps each parameter of crdbwork_enqueue to the NewItem field
// it stands for ("" for the queue's name).
var mxSQLParams = map[string]string{
	"queue": "", "payload": "Payload", "id": "ID", "key": "Key", "priority": "Priority", "delay": "Delay",
	"run_at": "Delay", "max_attempts": "MaxAttempts", "tenant": "Tenant", "ttl": "TTL", "metadata": "Metadata",
	"headers": "Headers", "at_most_once": "AtMostOnce", "timeout": "Timeout", "kind": "Kind",
	"after": "After", "run_after": "RunAfter", "after_queues": "AfterIn",
}

// Outcomes of a cell, as documented.
const (
	mxOK      = "ok"      // works as documented
	mxRefused = "refused" // refused with a clear error, nothing written
	mxNA      = "n/a"     // the path has no way to say it
)

// mxEnqueueCell says what path p does with option o (and a prerequisite,
// waits): mxOK or mxNA, with the note the docs table shows.
func mxEnqueueCell(p mxPath, o mxOption, waits bool) (string, string) {
	switch {
	case p.name == "SQL" && o.name == "UniqueStates":
		return mxNA, "no argument ([enqueue-from-sql.md](enqueue-from-sql.md#what-sql-cannot-do-that-go-does))"
	case p.name == "SQL" && waits:
		return mxNA, "not run: the `After` rows run the SQL path's `after`"
	case p.name == "SQL" && (o.name == "After" || o.name == "RunAfter" || o.name == "AfterIn"):
		return mxOK, "`after`, `run_after`, `after_queues`"
	case p.name == "SQL" && o.name == "UniqueKey":
		return mxOK, "`id` = `claim.UniqueID(…)`"
	case p.name == "COPY" && (o.name == "UniqueKey" || o.name == "UniqueStates" || o.name == "ID"):
		return mxOK, "by INSERT: a given id is checked"
	case p.name == "COPY" && (o.name == "After" || o.name == "RunAfter" || o.name == "AfterIn" || waits):
		return mxOK, "waits; the others by COPY"
	}
	return mxOK, ""
}

// mxRequeueDrops lists what a requeue does not carry back, as documented.
var mxRequeueDrops = map[string]string{
	"TTL":     "no deadline ([above](#deadlines-and-at-most-once-items))",
	"Headers": "no headers ([tracing.md](tracing.md#limits))",
	"Delay":   "claimable at once",
	"Timeout": "the worker's `ItemTimeout` ([timeouts.md](timeouts.md#limits))",
}

// mxSettleCell says what settle s does to an item with option o (for
// After: s settles the prerequisite), with the note the docs table shows.
func mxSettleCell(o mxOption, s mxSettle) (string, string) {
	ack := s.name == "ack" || s.name == "BatchRecord" || s.name == "BatchStatement"
	switch o.name {
	case "RunAfter":
		switch {
		case ack:
			return mxOK, "its ack releases the item at once"
		case s.name == "nack" || s.name == "snooze" || s.name == "release":
			return mxOK, "the item waits on"
		case s.name == "requeue":
			return mxOK, "requeued before a reap: the item waits on"
		default:
			return mxOK, "the item runs after the next reap"
		}
	case "UniqueStates":
		if s.name == "cancel" {
			return mxOK, "enqueued again, it is added"
		}
	case "After", "AfterIn":
		switch {
		case ack:
			return mxOK, "its ack releases the item at once"
		case s.name == "nack" || s.name == "snooze" || s.name == "release":
			return mxOK, "the item waits on"
		case s.name == "requeue":
			return mxOK, "requeued before a reap: the item waits on"
		default:
			return mxOK, "the item dies at the next reap"
		}
	case "AtMostOnce":
		switch {
		case ack:
			return mxOK, "its record, once"
		case s.name == "cancel":
			return mxOK, "nothing to cancel once claimed: its claim took it"
		case s.name == "requeue" || s.name == "retention":
			return mxNA, "never dead: its claim took it"
		default:
			return mxRefused, "`ErrClaimLost`: its claim took it"
		}
	case "MaxAttempts":
		if s.name == "nack" {
			return mxOK, "dead after its 2nd attempt"
		}
	}
	if s.name == "requeue" {
		if note, ok := mxRequeueDrops[o.name]; ok {
			return mxOK, note
		}
	}
	return mxOK, ""
}

// mxBroken lists the cells known to be broken, by option (with " after a
// prerequisite" for the waiting variant, "*" for both) and settle path
// ("*": every one), with what breaks. Each fix removes its entries: the
// cells it makes run are its regression tests.
var mxBroken = map[string]string{}

// mxBrokenCell returns why the cell is known to be broken ("" if it is not).
func mxBrokenCell(option string, waits bool, settle string) string {
	name := option
	if waits {
		name += " after a prerequisite"
	}
	for _, k := range []string{name + "|" + settle, name + "|*", option + "*|" + settle, option + "*|*"} {
		if why, ok := mxBroken[k]; ok {
			return why
		}
	}
	return ""
}

// TestCombinationMatrix runs every cell of the matrix in one database. The
// paths' and options' subtests are parallel too, so that every cell is
// scheduled on its own (a group of cells waited for its slowest before the
// next group began).
func TestCombinationMatrix(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	var copies atomic.Int64
	for _, p := range mxPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			for _, o := range mxOptions {
				for _, waits := range []bool{false, true} {
					if waits && (o.name == "After" || o.name == "RunAfter" || o.name == "AfterIn") {
						continue
					}
					oname := o.name
					if waits {
						oname += " after a prerequisite"
					}
					t.Run(oname, func(t *testing.T) {
						t.Parallel()
						for _, st := range mxSettles {
							t.Run(st.name, func(t *testing.T) {
								t.Parallel()
								c := &mxCell{t: t, ctx: ctx, pool: pool, session: s.ID(), path: p, opt: o, waits: waits, settle: st,
									queue:  fmt.Sprintf("mx-%s-%d-%s", p.name, slices.IndexFunc(mxOptions, func(x mxOption) bool { return x.name == o.name }), st.name),
									copies: &copies}
								if waits {
									c.queue += "-w"
								}
								c.run()
							})
						}
					})
				}
			}
		})
	}
}

// mxCell is one cell: its queue, the producer's and the worker's Queues
// (two processes), and the items it made.
type mxCell struct {
	t       *testing.T
	ctx     context.Context
	pool    *pgxpool.Pool
	session uuid.UUID
	path    mxPath
	opt     mxOption
	waits   bool
	settle  mxSettle
	queue   string
	copies  *atomic.Int64

	prod, work *claim.Queue
	buf        *claim.Buffer
	item       claim.NewItem // as enqueued
	id         uuid.UUID
	pre        uuid.UUID // the prerequisite (After, or waits)
	// preQueue, preProd and preWork are the prerequisite's queue and its
	// Queues for AfterIn (another queue, its parts owned by the session
	// too); the cell's own otherwise.
	preQueue         string
	preProd, preWork *claim.Queue
	sibling          uuid.UUID // Key (sequenced): the key's next item
	done             map[uuid.UUID]bool
}

func (c *mxCell) fatalf(format string, args ...any) {
	c.t.Helper()
	c.t.Fatalf("%s × %s%s × %s: %s", c.path.name, c.opt.name, map[bool]string{true: " after a prerequisite"}[c.waits], c.settle.name,
		fmt.Sprintf(format, args...))
}

func (c *mxCell) run() {
	if kind, _ := mxEnqueueCell(c.path, c.opt, c.waits); kind == mxNA {
		c.t.Skip("the path has no way to say it (docs table)")
	}
	if why := mxBrokenCell(c.opt.name, c.waits, c.settle.name); why != "" {
		c.t.Skip("known broken: " + why)
	}
	c.done = map[uuid.UUID]bool{}
	c.setup()
	if c.opt.name == "After" || c.opt.name == "RunAfter" || c.opt.name == "AfterIn" {
		c.runAfter()
	} else {
		c.runItem()
	}
	c.checkAllEnded()
}

// setup makes the cell's queue (four parts, all owned by the session) and
// its two Queues: the producer (over a handle that counts COPYs) and the
// worker.
func (c *mxCell) setup() {
	ctx := c.ctx
	if _, err := partition.EnsureParts(ctx, c.pool, crsql.Tables{}, c.queue, 4); err != nil {
		c.fatalf("parts: %v", err)
	}
	for p := range 4 {
		if _, err := c.pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, $3)`, c.session, c.queue, p); err != nil {
			c.fatalf("part %d: %v", p, err)
		}
	}
	var err error
	if c.prod, err = claim.New(copyCounting{Pool: c.pool, copies: c.copies}, claim.Options{Queue: c.queue}); err != nil {
		c.fatalf("%v", err)
	}
	if c.work, err = claim.New(c.pool, claim.Options{Queue: c.queue, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond}); err != nil {
		c.fatalf("%v", err)
	}
	switch c.opt.kind {
	case "sequenced":
		err = c.work.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On})
	case "sequenced-hold":
		if err = c.work.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On}); err == nil {
			err = c.work.UpdateSettings(ctx, claim.SettingsUpdate{SequenceHold: claim.On})
		}
	case "fair":
		err = c.work.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true}})
	}
	if err != nil {
		c.fatalf("%s queue: %v", c.opt.kind, err)
	}
	if c.path.name == "Buffer" {
		c.buf = newBuffer(c.t, c.prod, claim.BufferOptions{})
	}
	c.preQueue, c.preProd, c.preWork = c.queue, c.prod, c.work
	if c.opt.name == "AfterIn" {
		c.preQueue = c.queue + "-pre"
		if _, err := partition.EnsureParts(ctx, c.pool, crsql.Tables{}, c.preQueue, 4); err != nil {
			c.fatalf("parts: %v", err)
		}
		for p := range 4 {
			if _, err := c.pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, $3)`, c.session, c.preQueue, p); err != nil {
				c.fatalf("part %d: %v", p, err)
			}
		}
		if c.preProd, err = claim.New(c.pool, claim.Options{Queue: c.preQueue}); err != nil {
			c.fatalf("%v", err)
		}
		if c.preWork, err = claim.New(c.pool, claim.Options{Queue: c.preQueue, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond}); err != nil {
			c.fatalf("%v", err)
		}
	}
}

// onPre runs f with the cell's queue and Queues those of the prerequisite
// (another queue for AfterIn): the helpers that enqueue, claim, ack and
// end items then work on the prerequisite's queue.
func (c *mxCell) onPre(f func()) {
	c.t.Helper()
	q, prod, work := c.queue, c.prod, c.work
	c.queue, c.prod, c.work = c.preQueue, c.preProd, c.preWork
	defer func() { c.queue, c.prod, c.work = q, prod, work }()
	f()
}

// enqueue enqueues it through the cell's path and returns the answer for it.
// A call refused for contention after its own retries (SQLSTATE 40001, the
// outcome known: nothing was written) is made again, as a producer would:
// the cells share one database, and on PostgreSQL a long enqueue transaction
// (the COPY path's) can lose every one of its attempts to the other cells'
// commits on the same small index pages. The matrix tests what the options
// do together, not the size of the retry budget.
func (c *mxCell) enqueue(it claim.NewItem) (claim.Enqueued, error) {
	for try := 1; ; try++ {
		res, err := c.enqueueOnce(it)
		var pgErr *pgconn.PgError
		if err == nil || try == 5 || errors.Is(err, claim.ErrOutcomeUnknown) || !errors.As(err, &pgErr) || pgErr.Code != "40001" {
			return res, err
		}
		c.t.Logf("enqueue refused for contention (try %d), made again: %v", try, err)
	}
}

// enqueueOnce is one call of enqueue.
func (c *mxCell) enqueueOnce(it claim.NewItem) (claim.Enqueued, error) {
	ctx := c.ctx
	switch c.path.name {
	case "Enqueue":
		return c.prod.Enqueue(ctx, it)
	case "EnqueueTx":
		// The caller's transaction, retried whole on a serialization
		// failure, as EnqueueTx asks of its callers (the cells run side by
		// side in one database).
		var res claim.Enqueued
		err := retry.Tx(ctx, c.pool, nil, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			res, err = c.prod.EnqueueTx(ctx, tx, it)
			return err
		})
		return res, err
	case "Buffer":
		return c.buf.Enqueue(ctx, it)
	case "SQL":
		return c.enqueueSQL(it)
	case "COPY":
		items := []claim.NewItem{it}
		for range 64 {
			items = append(items, claim.NewItem{Payload: []byte("filler"), Delay: time.Hour})
		}
		before := c.copies.Load()
		res, err := c.prod.Enqueue(ctx, items...)
		if err != nil {
			return res, err
		}
		if c.copies.Load() == before {
			c.fatalf("the bulk enqueue ran no COPY")
		}
		one := claim.Enqueued{IDs: res.IDs[:1], New: res.New[:1], Done: res.Done[:1]}
		if res.Waiting != nil {
			one.Waiting = res.Waiting[:1]
		}
		return one, nil
	}
	c.fatalf("no path %q", c.path.name)
	return claim.Enqueued{}, nil
}

// enqueueSQL calls crdbwork_enqueue by position with it's options.
func (c *mxCell) enqueueSQL(it claim.NewItem) (claim.Enqueued, error) {
	id := it.ID
	if it.UniqueKey != "" {
		id = claim.UniqueID(c.queue, it.UniqueKey, it.UniquePeriod, time.Now())
	}
	var idArg, keyArg, tenantArg, delayArg, ttlArg, maxArg, headersArg, timeoutArg, kindArg any
	if it.Kind != "" {
		kindArg = it.Kind
	}
	if it.Timeout != 0 {
		timeoutArg = fmt.Sprintf("%d microseconds", it.Timeout.Microseconds())
	}
	if id != uuid.Nil {
		idArg = id
	}
	if it.Key != "" {
		keyArg = it.Key
	}
	if it.Tenant != "" {
		tenantArg = it.Tenant
	}
	if it.Delay != 0 {
		delayArg = fmt.Sprintf("%d microseconds", it.Delay.Microseconds())
	}
	if it.TTL != 0 {
		ttlArg = fmt.Sprintf("%d microseconds", it.TTL.Microseconds())
	}
	if it.MaxAttempts != 0 {
		maxArg = int64(it.MaxAttempts)
	}
	if it.Headers != nil {
		h, _ := json.Marshal(it.Headers)
		headersArg = string(h)
	}
	// Prerequisites: after with one queue each (NULL: the item's own).
	var after []uuid.UUID
	var queues []*string
	for _, p := range it.After {
		after, queues = append(after, p), append(queues, nil)
	}
	for _, p := range it.AfterIn {
		q := p.Queue
		after, queues = append(after, p.ID), append(queues, &q)
	}
	var runAfter []string
	if it.RunAfter != 0 {
		runAfter = strings.Split(it.RunAfter.String(), "|")
	}
	call := testdb.EnqueueArgs("$1", "$2", "id", "$3::UUID", "key", "$4::TEXT", "priority", "$5::BIGINT", "delay", "$6::INTERVAL",
		"max_attempts", "$7::BIGINT", "tenant", "$8::TEXT", "ttl", "$9::INTERVAL", "metadata", "$10::BYTEA", "headers", "$11::JSONB",
		"at_most_once", "$12::BOOL", "timeout", "$13::INTERVAL", "kind", "$14::TEXT",
		"after", "$15::UUID[]", "run_after", "$16::TEXT[]", "after_queues", "$17::TEXT[]")
	var got uuid.UUID
	var added, done bool
	err := c.pool.QueryRow(c.ctx, `SELECT item_id, added, done FROM crdbwork_enqueue(`+call+`)`,
		c.queue, it.Payload, idArg, keyArg, int64(it.Priority), delayArg, maxArg, tenantArg, ttlArg, it.Metadata, headersArg, it.AtMostOnce, timeoutArg, kindArg,
		after, runAfter, queues).
		Scan(&got, &added, &done)
	if err != nil {
		return claim.Enqueued{}, err
	}
	res := claim.Enqueued{IDs: []uuid.UUID{got}, New: []bool{added}, Done: []bool{done}}
	if len(after) > 0 {
		// The function has no waiting column: the waiting items tell.
		res.Waiting = []bool{countRows(c.t, c.pool, `SELECT count(*) FROM crdbwork_waiting WHERE id = $1`, got) == 1}
	}
	return res, nil
}

// enqueuePlain enqueues a plain item through the producer's Enqueue.
func (c *mxCell) enqueuePlain(what string, it claim.NewItem) uuid.UUID {
	it.Payload = []byte(what)
	res, err := c.prod.Enqueue(c.ctx, it)
	if err != nil || !res.New[0] {
		c.fatalf("enqueueing the %s: %+v, %v", what, res, err)
	}
	return res.IDs[0]
}

// runItem: the item with the option (waiting for a prerequisite first if
// c.waits), claimed and settled.
func (c *mxCell) runItem() {
	it := c.opt.item(c)
	it.Payload = []byte("item of " + c.queue)
	if c.waits {
		c.pre = c.enqueuePlain("prerequisite", claim.NewItem{})
		it.After = []uuid.UUID{c.pre}
	}
	c.item = it
	res, err := c.enqueue(it)
	if err != nil {
		c.fatalf("enqueue: %v", err)
	}
	c.id = res.IDs[0]
	if !res.New[0] || res.Done[0] {
		c.fatalf("enqueue answered %+v: not new", res)
	}
	if got := len(res.Waiting) == 1 && res.Waiting[0]; got != c.waits || (!c.waits && res.Waiting != nil) {
		c.fatalf("Enqueued.Waiting = %v, want waiting %v", res.Waiting, c.waits)
	}
	c.checkID()
	if c.opt.kind == "sequenced" || c.opt.kind == "sequenced-hold" {
		// The key's next item, enqueued after the item (while it waits,
		// if it does: released, the item comes first, by its enqueue).
		c.sibling = c.enqueuePlain("sibling", claim.NewItem{Key: c.item.Key})
	}
	if c.waits && c.settle.name == "cancel" {
		// Cancelled while it waits: it ends at once, and the
		// prerequisite's ack releases nothing.
		c.expectRow("waiting", c.want("waiting"))
		r, err := c.work.CancelItem(c.ctx, c.id, claim.CancelOptions{By: "matrix"})
		if err != nil || !r.Found || r.Running {
			c.fatalf("cancel of the waiting item = %+v, %v; want found, not running", r, err)
		}
		c.done[c.id] = true
		c.expectRow("absent", "absent")
		c.expectEnded(store.OutcomeCancelled)
		c.enqueueAgain()
		p := c.claimID(c.pre)
		if err := c.work.Ack(c.ctx, p, nil); err != nil {
			c.fatalf("ack of the prerequisite: %v", err)
		}
		c.done[c.pre] = true
		c.expectRow("absent", "absent")
		c.drainSibling()
		return
	}
	if c.waits {
		c.expectRow("waiting", c.want("waiting"))
		// The prerequisite runs (the item is not claimable), and its ack
		// by the worker moves the item into the queue at once.
		p := c.claimID(c.pre)
		if err := c.work.Ack(c.ctx, p, nil); err != nil {
			c.fatalf("ack of the prerequisite: %v", err)
		}
		c.done[c.pre] = true
	}
	c.expectRow("item", c.want("item"))
	x := c.claimX()
	c.checkClaimed(x)
	c.settleItem(x)
}

// runAfter: the item waits for a prerequisite that the settle path ends.
// The worker acks another item first, just before the enqueue: a process
// that acked in a queue without dependencies a moment before still
// releases the dependents of its next ack.
func (c *mxCell) runAfter() {
	ctx := c.ctx
	var p claim.Item
	c.onPre(func() {
		c.pre = c.enqueuePlain("prerequisite", claim.NewItem{})
		warm := c.enqueuePlain("warm-up", claim.NewItem{})
		p = c.claimID(c.pre)
		w := c.claimID(warm)
		if err := c.work.Ack(ctx, w, nil); err != nil {
			c.fatalf("warm-up ack: %v", err)
		}
		c.done[warm] = true
	})
	it := c.opt.item(c)
	it.Payload = []byte("item of " + c.queue)
	c.item = it
	res, err := c.enqueue(it)
	if err != nil {
		c.fatalf("enqueue: %v", err)
	}
	c.id = res.IDs[0]
	if !res.New[0] || len(res.Waiting) != 1 || !res.Waiting[0] {
		c.fatalf("enqueue answered %+v: want new and waiting", res)
	}
	c.expectRow("waiting", c.want("waiting"))
	switch c.settle.name {
	case "ack", "BatchRecord", "BatchStatement":
		c.onPre(func() { c.ackBy(p) })
		c.done[c.pre] = true
		// Released by that ack, before it returned: no reap.
		c.expectRow("item", c.want("item"))
		c.ackX()
	case "nack", "snooze", "release", "requeue":
		c.onPre(func() {
			switch c.settle.name {
			case "release":
				if err := c.work.Release(ctx, p); err != nil {
					c.fatalf("release of the prerequisite: %v", err)
				}
			case "nack":
				if out, err := c.work.Nack(ctx, p, errors.New("boom")); err != nil || out != claim.Retried {
					c.fatalf("nack of the prerequisite: %v, %v", out, err)
				}
			case "snooze":
				if out, err := c.work.Snooze(ctx, p, 0); err != nil || out != claim.Snoozed {
					c.fatalf("snooze of the prerequisite: %v, %v", out, err)
				}
			case "requeue":
				c.kill(p)
				if ok, err := requeuedOne(c.work.Requeue(ctx, claim.RequeueOptions{ID: c.pre})); err != nil || !ok {
					c.fatalf("requeue of the prerequisite: %v, %v", ok, err)
				}
			}
		})
		c.reap()
		c.expectRow("waiting", c.want("waiting"))
		if d, err := c.work.Dependencies(ctx, c.id, 10); err != nil || !d.Waiting || d.Remaining != 1 {
			c.fatalf("dependencies: %+v, %v; want waiting for one", d, err)
		}
		c.onPre(func() {
			p = c.claimID(c.pre)
			if err := c.work.Ack(ctx, p, nil); err != nil {
				c.fatalf("ack of the prerequisite: %v", err)
			}
		})
		c.done[c.pre] = true
		c.expectRow("item", c.want("item"))
		c.ackX()
	case "cancel", "dead", "retention":
		c.onPre(func() {
			if c.settle.name == "cancel" {
				if r, err := c.work.CancelItem(ctx, c.pre, claim.CancelOptions{By: "matrix"}); err != nil || !r.Running {
					c.fatalf("cancel of the running prerequisite: %+v, %v", r, err)
				}
				if err := c.work.EndCancelled(ctx, p); err != nil {
					c.fatalf("end of the cancelled prerequisite: %v", err)
				}
			} else {
				c.kill(p)
			}
		})
		c.done[c.pre] = true
		if c.opt.name == "RunAfter" {
			// Its prerequisite's death or cancel satisfies it: the reap
			// releases it, and it runs.
			st, err := queuemaint.For(c.work).Reap(ctx)
			if err != nil || st.DependencyDead != 0 || st.Unblocked != 1 {
				c.fatalf("reap: %+v, %v; want the dependent released", st, err)
			}
			c.expectRow("item", c.want("item"))
			c.ackX()
			return
		}
		c.done[c.id] = true
		st, err := queuemaint.For(c.work).Reap(ctx)
		if err != nil || st.DependencyDead != 1 {
			c.fatalf("reap: %+v, %v; want the dependent dead", st, err)
		}
		c.expectRow("dead", c.want("dead")+" reason=dependency died: "+c.pre.String())
		c.expectEnded(store.OutcomeDead)
		if c.settle.name == "retention" {
			if c.opt.name == "AfterIn" {
				c.prune(1) // the prerequisite is a dead item of its own queue
			} else {
				c.prune(2)
			}
		}
		c.enqueueAgain()
	default:
		c.fatalf("no settle path %q for the prerequisite", c.settle.name)
	}
}

// settleItem settles the claimed item x by the cell's settle path and
// follows it to its end.
func (c *mxCell) settleItem(x claim.Item) {
	ctx := c.ctx
	kind, _ := mxSettleCell(c.opt, c.settle)
	amo := c.item.AtMostOnce
	switch c.settle.name {
	case "ack", "BatchRecord", "BatchStatement":
		c.ackBy(x)
		c.done[c.id] = true
		c.expectEnded(map[bool]string{true: store.OutcomeTaken, false: store.OutcomeAcked}[amo])
		c.enqueueAgain()
		c.drainSibling()
	case "nack", "snooze", "release":
		out, want := claim.Released, claim.Released
		var err error
		switch c.settle.name {
		case "nack":
			out, err = c.work.Nack(ctx, x, errors.New("boom"))
			want = claim.Retried
		case "snooze":
			out, err = c.work.Snooze(ctx, x, 0)
			want = claim.Snoozed
		default:
			err = c.work.Release(ctx, x)
		}
		if kind == mxRefused {
			c.expectRefused(err)
			return
		}
		if err != nil || out != want {
			c.fatalf("%s = %v, %v; want %v", c.settle.name, out, err, want)
		}
		row := c.want("item")
		switch c.settle.name {
		case "nack":
			row += " attempts=1 error=boom"
		case "snooze":
			row += " attempts=0 snoozes=1"
		default:
			row += " attempts=0"
		}
		c.expectRowDetail("item", row)
		x = c.claimX()
		c.checkClaimed(x)
		if c.opt.name == "MaxAttempts" && c.settle.name == "nack" {
			if out, err := c.work.Nack(ctx, x, errors.New("boom again")); err != nil || out != claim.Dead {
				c.fatalf("second nack of an item of 2 attempts = %v, %v; want dead", out, err)
			}
			c.expectRow("dead", c.want("dead")+" reason=failed")
			c.done[c.id] = true
			c.expectEnded(store.OutcomeDead)
			c.drainSibling()
			return
		}
		c.ackX2(x)
	case "cancel":
		r, err := c.work.CancelItem(ctx, c.id, claim.CancelOptions{By: "matrix", Reason: "combination"})
		if err != nil {
			c.fatalf("cancel: %v", err)
		}
		if amo {
			// Its claim took it: nothing is left to cancel.
			if r.Found {
				c.fatalf("cancel of a taken at-most-once item = %+v; want not found", r)
			}
			c.done[c.id] = true
			c.expectEnded(store.OutcomeTaken)
			c.drainSibling()
			return
		}
		if !r.Found || !r.Running {
			c.fatalf("cancel of a running item = %+v; want running", r)
		}
		if err := c.work.Ack(ctx, x, nil); !errors.Is(err, claim.ErrClaimLost) {
			c.fatalf("ack after the cancel = %v; want ErrClaimLost", err)
		}
		if err := c.work.EndCancelled(ctx, x); err != nil {
			c.fatalf("EndCancelled: %v", err)
		}
		c.done[c.id] = true
		c.expectEnded(store.OutcomeCancelled)
		if c.opt.kind == "sequenced-hold" {
			// Kept among the dead items, holding its key.
			c.expectRow("dead", c.want("dead")+" reason=cancelled")
		} else {
			c.expectRow("absent", "absent")
		}
		c.enqueueAgain()
		c.unhold()
		c.drainSibling()
	case "dead", "requeue", "retention":
		out, err := c.work.Nack(ctx, x, claim.Permanent(errors.New("fatal")))
		if amo {
			c.expectRefused(err)
			return
		}
		if err != nil || out != claim.Dead {
			c.fatalf("permanent nack = %v, %v; want dead", out, err)
		}
		c.expectRow("dead", c.want("dead")+" reason=permanent")
		c.expectEnded(store.OutcomeDead)
		switch c.settle.name {
		case "dead":
			c.done[c.id] = true
			c.enqueueAgain()
			c.unhold()
			c.drainSibling()
		case "requeue":
			if ok, err := requeuedOne(c.work.Requeue(ctx, claim.RequeueOptions{ID: c.id})); err != nil || !ok {
				c.fatalf("requeue = %v, %v", ok, err)
			}
			c.expectRowDetail("item", c.want("requeued")+" attempts=0 error=fatal")
			x = c.claimX()
			c.ackX2(x)
		case "retention":
			// Pruned, the dead item holds its key no more.
			c.done[c.id] = true
			c.prune(1)
			c.enqueueAgain()
			c.drainSibling()
		}
	default:
		c.fatalf("no settle path %q", c.settle.name)
	}
}

// expectRefused: the settle path refused an at-most-once item with a clear
// error and wrote nothing; the item ended when its claim took it.
func (c *mxCell) expectRefused(err error) {
	c.t.Helper()
	if !errors.Is(err, claim.ErrClaimLost) || !strings.Contains(err.Error(), "at-most-once") {
		c.fatalf("%s of an at-most-once item = %v; want ErrClaimLost saying it is at-most-once", c.settle.name, err)
	}
	c.expectRow("absent", "absent")
	c.done[c.id] = true
	c.expectEnded(store.OutcomeTaken)
	c.drainSibling()
}

// ackBy acks it by the cell's ack path (or plainly for other paths).
func (c *mxCell) ackBy(it claim.Item) {
	c.t.Helper()
	ctx := c.ctx
	var err error
	switch c.settle.name {
	case "BatchRecord":
		err = c.work.AckMany(ctx, []claim.AckRequest{{Item: it, Value: it.ID}}, claim.AckOptions{
			Batch: func(ctx context.Context, tx pgx.Tx, acked []claim.AckRequest) error {
				for _, r := range acked {
					if _, err := tx.Exec(ctx, `INSERT INTO results (item_id, session_id) VALUES ($1, $2)`, r.Value, r.Item.Session); err != nil {
						return err
					}
				}
				return nil
			}})[0]
	case "BatchStatement":
		err = c.work.AckMany(ctx, []claim.AckRequest{{Item: it}}, claim.AckOptions{
			Statement: func(acked []claim.AckRequest) (string, []any) {
				ids := make([]uuid.UUID, len(acked))
				for i, r := range acked {
					ids[i] = r.Item.ID
				}
				return `INSERT INTO results (item_id, session_id) SELECT unnest($1::UUID[]), $2`, []any{ids, it.Session}
			}})[0]
	default:
		err = c.work.Ack(ctx, it, record(it))
	}
	if err != nil {
		c.fatalf("ack (%s) of %s: %v", c.settle.name, it.ID, err)
	}
	if n := countRows(c.t, c.pool, `SELECT count(*) FROM results WHERE item_id = $1`, it.ID); n != 1 {
		c.fatalf("%d results of %s, want 1", n, it.ID)
	}
}

// ackX claims the cell's item and acks it plainly.
func (c *mxCell) ackX() { c.ackX2(c.claimX()) }

// ackX2 acks the cell's claimed item x plainly: its end.
func (c *mxCell) ackX2(x claim.Item) {
	c.t.Helper()
	if err := c.work.Ack(c.ctx, x, nil); err != nil {
		c.fatalf("ack: %v", err)
	}
	c.done[c.id] = true
	c.expectEnded(map[bool]string{true: store.OutcomeTaken, false: store.OutcomeAcked}[x.AtMostOnce])
	c.drainSibling()
}

// kill claims nothing: it makes the claimed it dead (Permanent).
func (c *mxCell) kill(it claim.Item) {
	c.t.Helper()
	if out, err := c.work.Nack(c.ctx, it, claim.Permanent(errors.New("fatal"))); err != nil || out != claim.Dead {
		c.fatalf("death of %s: %v, %v", it.ID, out, err)
	}
}

// reap runs the worker's Reap.
func (c *mxCell) reap() claim.ReapStats {
	c.t.Helper()
	st, err := queuemaint.For(c.work).Reap(c.ctx)
	if err != nil {
		c.fatalf("reap: %v", err)
	}
	return claim.ReapStats(st)
}

// prune kills a later item and keeps one dead item: the item's death (and
// before it others, want in all with the item's) are deleted, the later
// one's kept; a requeue then finds nothing.
func (c *mxCell) prune(want int) {
	c.t.Helper()
	ctx := c.ctx
	later := c.enqueuePlain("witness", claim.NewItem{})
	c.kill(c.claimID(later))
	c.done[later] = true
	if err := c.work.UpdateSettings(ctx, claim.SettingsUpdate{Retention: &claim.Retention{DeadMaxCount: 1, NoDeadMaxAge: true}}); err != nil {
		c.fatalf("retention: %v", err)
	}
	n, err := queuemaint.For(c.work).PruneDead(ctx)
	if err != nil || n != want {
		c.fatalf("PruneDead = %d, %v; want %d", n, err, want)
	}
	c.expectRow("absent", "absent")
	if got := countRows(c.t, c.pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, later); got != 1 {
		c.fatalf("the later death was pruned too")
	}
	if ok, err := requeuedOne(c.work.Requeue(ctx, claim.RequeueOptions{ID: c.id})); err != nil || ok {
		c.fatalf("requeue of a pruned item = %v, %v; want nothing", ok, err)
	}
}

// enqueueAgain enqueues the item again, as a producer retrying after an
// unknown outcome (the id set, or the same unique key): it ended within
// the dedup window, so nothing is added and it is reported done.
func (c *mxCell) enqueueAgain() {
	c.t.Helper()
	it := c.item
	if it.UniqueKey == "" {
		it.ID = c.id
	}
	if it.UniqueStates != 0 && it.UniqueStates&claim.UniqueCancelled == 0 {
		var outcome string
		if err := c.pool.QueryRow(c.ctx, `SELECT COALESCE((SELECT outcome FROM crdbwork_ended WHERE queue = $1 AND id = $2), '')`, c.queue, c.id).Scan(&outcome); err != nil {
			c.fatalf("ended outcome: %v", err)
		}
		if outcome == store.OutcomeCancelled {
			// Its states let a cancelled one run again: added, then
			// cancelled again (unclaimed: it ends at once).
			res, err := c.enqueue(it)
			if err != nil || res.IDs[0] != c.id || !res.New[0] || res.Done[0] {
				c.fatalf("enqueue again of the cancelled item = %+v, %v; want added again (UniqueStates)", res, err)
			}
			if r, err := c.work.CancelItem(c.ctx, c.id, claim.CancelOptions{By: "matrix"}); err != nil || !r.Found || r.Running {
				c.fatalf("cancel of the item added again: %+v, %v", r, err)
			}
			return
		}
	}
	res, err := c.enqueue(it)
	if err != nil || res.IDs[0] != c.id || res.New[0] || !res.Done[0] {
		c.fatalf("enqueue again of the ended item = %+v, %v; want done, nothing added", res, err)
	}
}

// checkID: a given or derived id is the item's; enqueued again at once it
// is a duplicate.
func (c *mxCell) checkID() {
	c.t.Helper()
	want := c.item.ID
	if c.item.UniqueKey != "" {
		want = claim.UniqueID(c.queue, c.item.UniqueKey, c.item.UniquePeriod, time.Now())
	}
	if want == uuid.Nil {
		return
	}
	if c.id != want {
		c.fatalf("id %s, want %s", c.id, want)
	}
	res, err := c.enqueue(c.item)
	if err != nil || res.IDs[0] != c.id || res.New[0] || res.Done[0] {
		c.fatalf("enqueue again of the queued item = %+v, %v; want a duplicate", res, err)
	}
}

// claimX claims the cell's item: it waits until the item is claimable
// (Delay, a nack's backoff), claiming with the session's parts (the urgent
// lane for the urgent item). Items of the cell claimed meanwhile are given
// back, except that the key's next item must never be claimed while the
// cell's sequenced item is in the queue.
func (c *mxCell) claimX() claim.Item {
	c.t.Helper()
	it := c.claimID(c.id)
	return it
}

// claimID claims the item id, giving back the others it claims meanwhile.
func (c *mxCell) claimID(id uuid.UUID) claim.Item {
	c.t.Helper()
	ctx := c.ctx
	var it claim.Item
	await.Until(c.t, fmt.Sprintf("item %s to be claimable", id), func() (bool, string) {
		var got []claim.Item
		var err error
		if id == c.id && c.opt.name == "urgent Priority" {
			got, err = c.work.Claimer(c.session).ClaimUrgent(ctx, claim.UrgentRequest{Max: 10, MaxPriority: mxUrgent})
		} else {
			got, err = c.work.Claimer(c.session).Claim(ctx, claim.ClaimRequest{Max: 10, Parts: []int{0, 1, 2, 3}})
		}
		if err != nil {
			c.fatalf("claim: %v", err)
		}
		var found *claim.Item
		for i := range got {
			g := got[i]
			switch {
			case g.ID == id:
				found = &got[i]
				continue
			case g.ID == c.sibling && c.sibling != uuid.Nil && c.itemSequenced():
				c.fatalf("the key's next item was claimed while the item of the key (%s) was still in the queue", c.id)
			case g.ID == c.id && c.waits && !c.released():
				c.fatalf("the waiting item was claimed before its prerequisite's ack")
			}
			if !g.AtMostOnce {
				if err := c.work.Release(ctx, g); err != nil {
					c.fatalf("release of %s: %v", g.ID, err)
				}
			}
		}
		if found != nil {
			it = *found
			return true, ""
		}
		return false, "row: " + c.row()
	}, await.Every(20*time.Millisecond), await.Within(2*time.Minute))
	return it
}

// itemSequenced reports whether the cell's item is a sequenced item still
// in the queue (its key's next item must wait).
func (c *mxCell) itemSequenced() bool {
	var seq bool
	err := c.pool.QueryRow(c.ctx, `SELECT seq_order IS NOT NULL FROM crdbwork_items WHERE id = $1`, c.id).Scan(&seq)
	return err == nil && seq
}

// released reports whether the waiting item left the waiting items.
func (c *mxCell) released() bool {
	return countRows(c.t, c.pool, `SELECT count(*) FROM crdbwork_waiting WHERE id = $1`, c.id) == 0
}

// unhold: in a queue that holds its keys on a death, the key's next item
// is not claimable after the item's death (or cancel), until the key is
// released (ReleaseSequenceKey), which the dead item then no longer holds.
func (c *mxCell) unhold() {
	c.t.Helper()
	if c.opt.kind != "sequenced-hold" || c.sibling == uuid.Nil {
		return
	}
	got, err := c.work.Claimer(c.session).Claim(c.ctx, claim.ClaimRequest{Max: 10, Parts: []int{0, 1, 2, 3}})
	if err != nil {
		c.fatalf("claim: %v", err)
	}
	for _, g := range got {
		if g.ID == c.sibling {
			c.fatalf("the key's next item was claimed while the dead item held the key")
		}
		if err := c.work.Release(c.ctx, g); err != nil {
			c.fatalf("release of %s: %v", g.ID, err)
		}
	}
	released, err := c.work.ReleaseSequenceKey(c.ctx, c.item.Key)
	if err != nil || !slices.Contains(released, c.id) {
		c.fatalf("ReleaseSequenceKey = %v, %v; want the dead item %s", released, err, c.id)
	}
}

// drainSibling acks the key's next item (Key (sequenced)), now claimable.
func (c *mxCell) drainSibling() {
	c.t.Helper()
	if c.sibling == uuid.Nil || c.done[c.sibling] {
		return
	}
	y := c.claimID(c.sibling)
	if err := c.work.Ack(c.ctx, y, nil); err != nil {
		c.fatalf("ack of the key's next item: %v", err)
	}
	c.done[c.sibling] = true
}

// checkClaimed compares the claimed item with what was enqueued.
func (c *mxCell) checkClaimed(x claim.Item) {
	c.t.Helper()
	ttl := "-"
	if !x.ExpiresAt.IsZero() {
		ttl = x.ExpiresAt.Sub(x.EnqueuedAt).Round(time.Millisecond).String()
	}
	got := fmt.Sprintf("key=%s tenant=%s priority=%d max_attempts=%d payload=%q metadata=%q ttl=%s at_most_once=%v headers=%s timeout=%s kind=%s",
		x.Key, x.Tenant, x.Priority, x.MaxAttempts, x.Payload, x.Metadata, ttl, x.AtMostOnce, mxHeaders(x.Headers), mxTimeout(x.Timeout), x.Kind)
	if want := c.wantFields("item", false); got != want {
		c.fatalf("claimed item\n  got:  %s\n  want: %s", got, want)
	}
	if x.VestingAt.Sub(x.EnqueuedAt) < c.item.Delay {
		c.fatalf("claimed at vesting %v, %v after the enqueue; want at least %v", x.VestingAt, x.VestingAt.Sub(x.EnqueuedAt), c.item.Delay)
	}
}

func mxHeaders(h map[string]string) string {
	if len(h) == 0 {
		return "-"
	}
	b, _ := json.Marshal(h) // sorted keys
	return string(b)
}

// want returns the row the cell's item should have at a stage: "waiting"
// (a waiting item), "item" (in the queue), "dead", "requeued".
func (c *mxCell) want(stage string) string { return c.wantFields(stage, true) }

func (c *mxCell) wantFields(stage string, stored bool) string {
	it := c.item
	maxAttempts := it.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = 25
	}
	amo := it.AtMostOnce
	if amo {
		maxAttempts = 1
	}
	ttl := "-"
	if it.TTL > 0 {
		ttl = it.TTL.String()
	}
	headers := mxHeaders(it.Headers)
	timeout := mxTimeout(it.Timeout)
	sequenced := strings.HasPrefix(c.opt.kind, "sequenced") && it.Key != ""
	if stage == "requeued" {
		// What a requeue documents not carrying back (mxRequeueDrops):
		// it keeps its place in its key's sequence.
		ttl, headers, amo, timeout = "-", "-", false, "-"
	}
	s := fmt.Sprintf("key=%s tenant=%s priority=%d max_attempts=%d payload=%q metadata=%q kind=%s", orNone(it.Key), orNone(it.Tenant),
		it.Priority, maxAttempts, it.Payload, it.Metadata, orNone(it.Kind))
	if !stored {
		return fmt.Sprintf("key=%s tenant=%s priority=%d max_attempts=%d payload=%q metadata=%q ttl=%s at_most_once=%v headers=%s timeout=%s kind=%s",
			it.Key, it.Tenant, it.Priority, maxAttempts, it.Payload, it.Metadata, ttl, amo, headers, timeout, it.Kind)
	}
	switch stage {
	case "waiting":
		// A waiting row keeps the item's own attempts; the move makes
		// an at-most-once item's 1.
		s = fmt.Sprintf("key=%s tenant=%s priority=%d max_attempts=%d payload=%q metadata=%q kind=%s", orNone(it.Key), orNone(it.Tenant),
			it.Priority, max(it.MaxAttempts, 25*boolInt(it.MaxAttempts == 0)), it.Payload, it.Metadata, orNone(it.Kind))
		return s + fmt.Sprintf(" ttl=%s at_most_once=%v timeout=%s", ttl, amo, timeout)
	case "item", "requeued":
		return s + fmt.Sprintf(" ttl=%s at_most_once=%v headers=%s sequenced=%v timeout=%s", ttl, amo, headers, sequenced, timeout)
	case "dead":
		return s
	}
	c.fatalf("no stage %q", stage)
	return ""
}

// mxTimeout shows an item's own timeout ("-": none).
func mxTimeout(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.String()
}

// mxTimeoutUS shows a timeout_us column.
func mxTimeoutUS(us *int64) string {
	if us == nil {
		return "-"
	}
	return mxTimeout(time.Duration(*us) * time.Microsecond)
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// expectRow compares the item's row (where, and what want describes) with
// the database's.
func (c *mxCell) expectRow(where, want string) {
	c.t.Helper()
	got := c.rowAt(where, false)
	if got != where+" "+want && !(where == "absent" && got == "absent") {
		c.fatalf("row\n  got:  %s\n  want: %s %s", got, where, want)
	}
}

// expectRowDetail is expectRow with the attempts, snoozes and last error.
func (c *mxCell) expectRowDetail(where, want string) {
	c.t.Helper()
	got := c.rowAt(where, true)
	if !strings.HasPrefix(got, where+" "+want) {
		c.fatalf("row\n  got:  %s\n  want: %s %s", got, where, want)
	}
}

func (c *mxCell) row() string { return c.rowAt("", true) }

// rowAt describes the item's row: in the items table ("item"), the waiting
// items, the dead items or nowhere ("absent"). detail adds the attempts,
// snoozes and last error (of items).
func (c *mxCell) rowAt(where string, detail bool) string {
	c.t.Helper()
	ctx := c.ctx
	var (
		key, tenant, lastError, reason  *string
		kind                            *string
		priority, maxAttempts, attempts int64
		snoozes                         int64
		payload, metadata, headers      []byte
		enqueuedAt, vestingAt           time.Time
		expiresAt                       *time.Time
		amo, seq                        bool
		ttlUS                           int64
		timeoutUS                       *int64
	)
	s := func(p *string) string {
		if p == nil {
			return "-"
		}
		return *p
	}
	base := func() string {
		return fmt.Sprintf("key=%s tenant=%s priority=%d max_attempts=%d payload=%q metadata=%q kind=%s", s(key), s(tenant), priority, maxAttempts, payload, metadata, s(kind))
	}
	err := c.pool.QueryRow(ctx, `SELECT item_key, tenant, priority, max_attempts, payload, metadata, expires_at, enqueued_at, vesting_at,
	        at_most_once, seq_order IS NOT NULL, headers, attempts, snoozes, last_error, timeout_us, kind
	    FROM crdbwork_items WHERE id = $1`, c.id).Scan(&key, &tenant, &priority, &maxAttempts, &payload, &metadata, &expiresAt, &enqueuedAt,
		&vestingAt, &amo, &seq, &headers, &attempts, &snoozes, &lastError, &timeoutUS, &kind)
	if err == nil {
		ttl := "-"
		if expiresAt != nil {
			ttl = expiresAt.Sub(enqueuedAt).String()
		}
		var h map[string]string
		if headers != nil {
			if err := json.Unmarshal(headers, &h); err != nil {
				c.fatalf("headers %s: %v", headers, err)
			}
		}
		out := "item " + base() + fmt.Sprintf(" ttl=%s at_most_once=%v headers=%s sequenced=%v timeout=%s", ttl, amo, mxHeaders(h), seq, mxTimeoutUS(timeoutUS))
		if c.opt.name == "Delay" && where == "item" && !detail && vestingAt.Sub(enqueuedAt) < c.item.Delay {
			c.fatalf("vesting %v after the enqueue, want at least the delay %v", vestingAt.Sub(enqueuedAt), c.item.Delay)
		}
		if detail {
			out += fmt.Sprintf(" attempts=%d", attempts)
			if snoozes > 0 {
				out += fmt.Sprintf(" snoozes=%d", snoozes)
			}
			if lastError != nil {
				out += " error=" + *lastError
			}
		}
		return out
	} else if !errors.Is(err, pgx.ErrNoRows) {
		c.fatalf("reading the item: %v", err)
	}
	err = c.pool.QueryRow(ctx, `SELECT item_key, tenant, priority, max_attempts, payload, metadata, ttl_us, at_most_once, timeout_us, kind
	    FROM crdbwork_waiting WHERE id = $1`, c.id).Scan(&key, &tenant, &priority, &maxAttempts, &payload, &metadata, &ttlUS, &amo, &timeoutUS, &kind)
	if err == nil {
		ttl := "-"
		if ttlUS > 0 {
			ttl = (time.Duration(ttlUS) * time.Microsecond).String()
		}
		return "waiting " + base() + fmt.Sprintf(" ttl=%s at_most_once=%v timeout=%s", ttl, amo, mxTimeoutUS(timeoutUS))
	} else if !errors.Is(err, pgx.ErrNoRows) {
		c.fatalf("reading the waiting item: %v", err)
	}
	err = c.pool.QueryRow(ctx, `SELECT item_key, tenant, priority, max_attempts, payload, metadata, reason, kind
	    FROM crdbwork_dead_items WHERE id = $1 ORDER BY died_at DESC LIMIT 1`, c.id).Scan(&key, &tenant, &priority, &maxAttempts, &payload, &metadata, &reason, &kind)
	if err == nil {
		return "dead " + base() + " reason=" + s(reason)
	} else if !errors.Is(err, pgx.ErrNoRows) {
		c.fatalf("reading the dead item: %v", err)
	}
	return "absent"
}

// expectEnded: the item's id is among the queue's ended ids with outcome,
// and its ended record keeps the item's kind (none for an item without).
func (c *mxCell) expectEnded(outcome string) {
	c.t.Helper()
	var got, kind string
	err := c.pool.QueryRow(c.ctx, `SELECT outcome, COALESCE(kind, '') FROM crdbwork_ended WHERE queue = $1 AND id = $2`, c.queue, c.id).Scan(&got, &kind)
	if err != nil || got != outcome {
		c.fatalf("ended as %q (%v), want %q", got, err, outcome)
	}
	if kind != c.item.Kind {
		c.fatalf("ended as %q with kind %q, want the item's kind %q", got, kind, c.item.Kind)
	}
}

// checkAllEnded: liveness. Every item the cell made ended: nothing of the
// queue is left in the items table (but the bulk path's delayed fillers)
// nor among the waiting items.
func (c *mxCell) checkAllEnded() {
	c.t.Helper()
	if !c.done[c.id] {
		c.fatalf("the cell did not end its item")
	}
	if n := countRows(c.t, c.pool, `SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND payload <> 'filler'::BYTEA`, c.queue); n != 0 {
		c.fatalf("%d items left in the queue", n)
	}
	if n := countRows(c.t, c.pool, `SELECT count(*) FROM crdbwork_waiting WHERE queue = $1`, c.queue); n != 0 {
		c.fatalf("%d waiting items left", n)
	}
}

// copyCounting is a pool whose transactions count their COPYs.
type copyCounting struct {
	*pgxpool.Pool
	copies *atomic.Int64
}

func (c copyCounting) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	tx, err := c.Pool.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return copyCountingTx{Tx: tx, copies: c.copies}, nil
}

type copyCountingTx struct {
	pgx.Tx
	copies *atomic.Int64
}

func (t copyCountingTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	t.copies.Add(1)
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

// TestCombinationMatrixIsComplete: every option of NewItem, every method of
// Queue, Buffer and Claimer, every field of AckOptions and every parameter
// of the SQL function has its place in the matrix: a new one fails here
// until the matrix covers it.
func TestCombinationMatrixIsComplete(t *testing.T) {
	t.Parallel()
	covered := map[string]bool{"Payload": true}
	for _, o := range mxOptions {
		for _, f := range o.fields {
			covered[f] = true
		}
	}
	nt := reflect.TypeFor[claim.NewItem]()
	for i := range nt.NumField() {
		if f := nt.Field(i); f.IsExported() && !covered[f.Name] {
			t.Errorf("NewItem.%s is no option of the combination matrix (mxOptions)", f.Name)
		}
	}
	paths := map[string]string{}
	for _, p := range mxPaths {
		for _, a := range p.api {
			paths[a] = "enqueue path " + p.name
		}
	}
	for _, s := range mxSettles {
		for _, a := range s.api {
			paths[a] = "settle path " + s.name
		}
	}
	for name, typ := range map[string]reflect.Type{"Queue": reflect.TypeFor[*claim.Queue](), "Buffer": reflect.TypeFor[*claim.Buffer](),
		"Claimer": reflect.TypeFor[claim.Claimer]()} {
		for i := range typ.NumMethod() {
			m := name + "." + typ.Method(i).Name
			_, isPath := paths[m]
			_, notPath := mxNotPaths[m]
			switch {
			case isPath && notPath:
				t.Errorf("%s is both a path of the matrix and listed as none", m)
			case !isPath && !notPath:
				t.Errorf("%s is not in the combination matrix: add it to a path (mxPaths, mxSettles) or to mxNotPaths with the reason", m)
			}
		}
	}
	for name := range paths {
		if !mxExists(name) {
			t.Errorf("the matrix names %s, which does not exist", name)
		}
	}
	for name := range mxNotPaths {
		if !mxExists(name) {
			t.Errorf("mxNotPaths names %s, which does not exist", name)
		}
	}
	at := reflect.TypeFor[claim.AckOptions]()
	for i := range at.NumField() {
		if f := "AckOptions." + at.Field(i).Name; paths[f] == "" {
			t.Errorf("%s is no settle path of the combination matrix (mxSettles)", f)
		}
	}
	for _, p := range testdb.EnqueueParams {
		field, ok := mxSQLParams[p.Name]
		if !ok {
			t.Errorf("crdbwork_enqueue's parameter %q is not in the combination matrix (mxSQLParams)", p.Name)
		} else if field != "" && !covered[field] {
			t.Errorf("crdbwork_enqueue's parameter %q stands for NewItem.%s, which no option covers", p.Name, field)
		}
	}
	if paths["crdbwork_enqueue"] == "" {
		t.Errorf("the SQL function is no enqueue path of the matrix")
	}
	// Every cell has an expectation the tests and the docs table share.
	for _, o := range mxOptions {
		for _, s := range mxSettles {
			if kind, _ := mxSettleCell(o, s); kind == "" {
				t.Errorf("no expectation for %s × %s", o.name, s.name)
			}
		}
	}
}

// mxExists reports whether the method (Type.Method), AckOptions field or
// SQL function name exists.
func mxExists(name string) bool {
	typ, member, _ := strings.Cut(name, ".")
	var rt reflect.Type
	switch typ {
	case "Queue":
		rt = reflect.TypeFor[*claim.Queue]()
	case "Buffer":
		rt = reflect.TypeFor[*claim.Buffer]()
	case "Claimer":
		rt = reflect.TypeFor[claim.Claimer]()
	case "AckOptions":
		_, ok := reflect.TypeFor[claim.AckOptions]().FieldByName(member)
		return ok
	case "crdbwork_enqueue":
		return strings.Contains(crsql.EnqueueFunctionSQL(), "FUNCTION crdbwork_enqueue(")
	default:
		return false
	}
	_, ok := rt.MethodByName(member)
	return ok
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// The docs table (docs/guarantees.md), between these markers.
const (
	mxDocsFile  = "../docs/guarantees.md"
	mxDocsBegin = "<!-- combination matrix: begin (generated from claim/matrix_test.go; CRDBWORK_UPDATE_DOCS=1 go test -run TestCombinationMatrixDocs ./claim/ rewrites it) -->"
	mxDocsEnd   = "<!-- combination matrix: end -->"
)

// mxDocs renders the matrix's tables.
func mxDocs() string {
	var b strings.Builder
	cell := func(kind, note string) string {
		switch kind {
		case mxNA:
			return "— " + note
		case mxRefused:
			return "refused: " + note
		}
		if note == "" {
			return "✓"
		}
		return "✓ " + note
	}
	row := func(cells ...string) { b.WriteString("| " + strings.Join(cells, " | ") + " |\n") }
	rule := func(n int) { b.WriteString("|" + strings.Repeat("---|", n) + "\n") }
	b.WriteString("\n\n✓: works as documented (the option holds after the settle, or the item ends as the settle says; a note says what the documentation says otherwise); refused: refused with that error, nothing written; —: cannot be said or cannot happen.\n")
	b.WriteString("\nEnqueue paths:\n\n")
	for _, p := range mxPaths {
		fmt.Fprintf(&b, "- **%s**: %s\n", p.name, p.doc)
	}
	b.WriteString("\nSettle paths (each on the claimed item; for `After`, on its prerequisite):\n\n")
	for _, s := range mxSettles {
		fmt.Fprintf(&b, "- **%s**: %s\n", s.name, s.doc)
	}
	b.WriteString("\nEach option by enqueue path (the item alone; waiting for a prerequisite, every path but SQL):\n\n")
	head := []string{"option"}
	for _, p := range mxPaths {
		head = append(head, p.name)
	}
	row(head...)
	rule(len(head))
	for _, o := range mxOptions {
		cells := []string{o.label}
		for _, p := range mxPaths {
			cells = append(cells, cell(mxEnqueueCell(p, o, false)))
		}
		row(cells...)
	}
	b.WriteString("\nEach option by settle path (the same whatever the enqueue path, alone and after a prerequisite):\n\n")
	head = []string{"option"}
	for _, s := range mxSettles {
		head = append(head, s.name)
	}
	row(head...)
	rule(len(head))
	for _, o := range mxOptions {
		cells := []string{o.label}
		for _, s := range mxSettles {
			cells = append(cells, cell(mxSettleCell(o, s)))
		}
		row(cells...)
	}
	b.WriteString("\n")
	return b.String()
}

// TestCombinationMatrixDocs: docs/guarantees.md holds the matrix's tables
// as the test's tables say (CRDBWORK_UPDATE_DOCS=1 rewrites them).
func TestCombinationMatrixDocs(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(mxDocsFile)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i, j := strings.Index(doc, mxDocsBegin), strings.Index(doc, mxDocsEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no combination matrix between %q and %q", mxDocsFile, mxDocsBegin, mxDocsEnd)
	}
	want := mxDocs()
	got := doc[i+len(mxDocsBegin) : j]
	if got == want {
		return
	}
	if os.Getenv("CRDBWORK_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(mxDocsFile, []byte(doc[:i+len(mxDocsBegin)]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the combination matrix of %s", mxDocsFile)
		return
	}
	t.Errorf("%s's combination matrix differs from the test's tables; run CRDBWORK_UPDATE_DOCS=1 go test -run TestCombinationMatrixDocs ./claim/\n got:\n%s\nwant:\n%s", mxDocsFile, got, want)
}
