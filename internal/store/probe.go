package store

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The idle probe (package internal/wake): CockroachDB has no LISTEN, so a
// worker process that has idle workers of a queue asks, at a short
// interval and on one connection of its own, whether the queue has items a
// claim would take, and wakes its idle workers when it finds new ones. It
// is the same statement on both engines but for the test of the queue,
// which PostgreSQL's twin compares with (SELECT $1::TEXT) as the claims'
// twins do (pgClaimOrder; PostgreSQL runs it when LISTEN is turned off,
// which is how the tests run it).
//
// The probe reads; it never locks or writes. It is the claim's first step
// (the picked CTE of claimTemplate, with the same conditions and the same
// order, through the same index, crdbwork_items_turn_next) without FOR
// UPDATE SKIP LOCKED and without the UPDATE, limited to ProbeLimit rows,
// and it returns their ids (so that the prober wakes workers only for
// items it has not announced yet) and their parts (the wake-up's hints: an
// item's part is its key hash modulo the queue's number of parts, and a
// part p below that number is its own hint, p modulo n = p). It skips no
// tenant: which tenants a worker skips is the worker's own state, so an
// item of a tenant at its limit may wake a worker that then claims nothing
// (the prober announces an item once; see internal/wake).
//
// CockroachDB checked (docs): a non-locking read that meets the intent of a
// pending transaction waits for it at SERIALIZABLE, but not at READ
// COMMITTED ("Read Committed Transactions": read committed transactions do
// not block on pending intents, cockroachdb/cockroach#102014; the level is
// enabled by default since v24.1 through
// sql.txn.read_committed_isolation.enabled, and "If the cluster setting is
// false, READ COMMITTED transactions will run as SERIALIZABLE"). The
// probe's connection therefore sets its default isolation to READ COMMITTED
// (probeSessionStatement; PostgreSQL's default already): a probe never
// waits for an enqueue or claim in flight, and where the level is off it
// waits at most as long as those short transactions run. It does not wait
// because it pushes: a READ COMMITTED read that meets the intent of a
// pending SERIALIZABLE transaction of the same priority moves that
// transaction's timestamp above its own read (cockroachdb/cockroach
// pkg/kv/kvserver/txnwait/queue.go, CanPushWithPriority, since #103267),
// and the claim (or enqueue) so pushed must refresh its reads at commit,
// and retries if they changed meanwhile. docs/cockroachdb.md ("Isolation
// and locking", and "Reads of the claim index head that are not claims" for
// the tombstones a probe of a drained queue steps over) weighs it.
//
// Changefeeds (CockroachDB's push alternative) were weighed and not used;
// see docs/operations.md, "Wake-ups".
type probeStatements struct {
	probe string // $1 queue, $2 limit → id, part
	// pgProbe is its PostgreSQL twin, which compares the queue with
	// (SELECT $1::TEXT), as the claims' twins do (pgClaimOrder).
	pgProbe string
}

// ProbeLimit is the number of items a probe returns at most: as many as a
// wake-up names hints for (internal/wake.MaxHints).
const ProbeLimit = 8

// probeTemplate is the probe: claimTemplate's picked CTE, read-only;
// probeQueueAnchor its test of the queue, which PostgreSQL's twin hides.
const probeQueueAnchor = "queue = $1 AND claim IS NULL AND "

const probeTemplate = `SELECT id, part FROM crdbwork_items
WHERE queue = $1 AND claim IS NULL AND vesting_at <= now() AND attempts < max_attempts
  AND (expires_at IS NULL OR expires_at > now())
  AND NOT EXISTS (SELECT 1 FROM crdbwork_queues WHERE name = $1 AND paused)
ORDER BY priority, turn_at
LIMIT $2`

// probeSessionStatement makes the probe's connection read at READ
// COMMITTED (see probeStatements).
const probeSessionStatement = `SET default_transaction_isolation = 'read committed'`

func newProbeStatements(t Tables) *probeStatements {
	return &probeStatements{probe: rewrite(t, probeSQL), pgProbe: rewrite(t, pgProbeSQL)}
}

// probes returns the Store's probeStatements, rendered on first use.
func (s *Store) probes() *probeStatements { return s.lazyProbe() }

// ProbeRow is one item a probe found: its id and part.
type ProbeRow struct {
	ID   uuid.UUID
	Part int64
}

// probeSQL is the text of probeStatements.probe
// (rendered by newProbeStatements).
const probeSQL = probeTemplate

// pgProbeSQL is the text of probeStatements.pgProbe
// (rendered by newProbeStatements).
var pgProbeSQL = pgHideQueue(probeTemplate, probeQueueAnchor, "$1")

// Probe returns up to ProbeLimit items of queue that a claim would take
// now, first in claim order, without locking or changing anything (see
// probeStatements): an empty result for an idle or paused queue. d picks
// the statement's twin.
func (s *Store) Probe(ctx context.Context, db DB, d Dialect, queue string) ([]ProbeRow, error) {
	p := s.probes()
	rows, err := db.Query(ctx, byDialect(d, p.probe, p.pgProbe), queue, ProbeLimit)
	if err != nil {
		return nil, err
	}
	var r ProbeRow
	out := make([]ProbeRow, 0, ProbeLimit)
	_, err = pgx.ForEachRow(rows, []any{&r.ID, &r.Part}, func() error {
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ProbeSession prepares a connection for probes: READ COMMITTED as its
// default isolation (see probeStatements). The same statement on both
// engines.
func (s *Store) ProbeSession(ctx context.Context, db DB) error {
	_, err := db.Exec(ctx, probeSessionStatement)
	return err
}
