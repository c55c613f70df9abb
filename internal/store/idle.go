package store

import (
	"context"
	"fmt"
	"time"
)

// The idle look (package worker): while the wake-up listener listens on its
// queue's channel, an idle worker claims only at a long safety interval,
// since every enqueue notifies it. Items that become claimable without a
// notification are those that vest later (a delayed enqueue, whose
// notification came early; a nack's backoff). After a claim that found
// nothing, and only after something happened since the last look, the
// worker reads when the first of the unclaimed items of its parts vests,
// and claims then.
//
// The read is bounded: it reads at most IdleLookLimit unclaimed items of
// the queue (of the given parts), through the claim's indexes
// (crdbwork_items_turn_next without parts, crdbwork_items_part_turn with),
// in no set order, and returns how many it read, how many of them have
// vested already and how long until the first vests. With fewer than
// IdleLookLimit rows and none vested, the earliest vesting is exact; with
// more, or with vested items that the claim did not take (a paused queue, a
// tenant at its limit, a key whose earlier item runs, an item out of
// attempts), the worker cannot know when it may claim and polls as before.
type idleStatements struct {
	look, pgLook           string // $1 queue, $2 limit → read, vested, µs until the first vests
	lookParts, pgLookParts string // $1 queue, $2 limit, $3 parts
}

// IdleLookLimit bounds the rows an idle look reads.
const IdleLookLimit = 256

const (
	idleLookAnchor   = "queue = $1 AND claim IS NULL"
	idleLookTemplate = `SELECT count(*), count(*) FILTER (WHERE vesting_at <= now()),
       COALESCE((EXTRACT(EPOCH FROM min(vesting_at) - now()) * 1000000)::BIGINT, 0)
FROM (SELECT vesting_at FROM crdbwork_items
      WHERE queue = $1 AND claim IS NULL%s
      LIMIT $2) AS f`
)

// idleLookSQL and its twins are the texts of idleStatements.
var (
	idleLookSQL        = fmt.Sprintf(idleLookTemplate, "")
	idleLookPartsSQL   = fmt.Sprintf(idleLookTemplate, " AND part = ANY($3::BIGINT[])")
	pgIdleLookSQL      = pgHideQueue(idleLookSQL, idleLookAnchor, "$1")
	pgIdleLookPartsSQL = pgHideQueue(idleLookPartsSQL, idleLookAnchor, "$1")
)

func newIdleStatements(t Tables) *idleStatements {
	return &idleStatements{
		look: rewrite(t, idleLookSQL), pgLook: rewrite(t, pgIdleLookSQL),
		lookParts: rewrite(t, idleLookPartsSQL), pgLookParts: rewrite(t, pgIdleLookPartsSQL),
	}
}

// IdleLook is what an idle look found (ItemsIdleLook).
type IdleLook struct {
	// Read is the number of unclaimed items read (at most IdleLookLimit),
	// Vested those of them that vested already.
	Read, Vested int
	// Until is the time until the first of them vests (0 without any).
	Until time.Duration
}

// Exact reports whether the look read every unclaimed item and none had
// vested: nothing is claimable before Until (nothing at all when Read is 0).
func (l IdleLook) Exact() bool { return l.Read < IdleLookLimit && l.Vested == 0 }

// ItemsIdleLook reads when the first unclaimed item of queue vests (see
// idleStatements): of the given parts only, unless parts is nil. d picks
// the statement's twin.
func (s *Store) ItemsIdleLook(ctx context.Context, db DB, d Dialect, queue string, parts []int) (IdleLook, error) {
	st := s.lazyIdle()
	var l IdleLook
	var us int64
	var err error
	if parts == nil {
		err = db.QueryRow(ctx, byDialect(d, st.look, st.pgLook), queue, IdleLookLimit).Scan(&l.Read, &l.Vested, &us)
	} else {
		ps := make([]int64, len(parts))
		for i, p := range parts {
			ps[i] = int64(p)
		}
		err = db.QueryRow(ctx, byDialect(d, st.lookParts, st.pgLookParts), queue, IdleLookLimit, ps).Scan(&l.Read, &l.Vested, &us)
	}
	l.Until = time.Duration(max(us, 0)) * time.Microsecond
	return l, err
}
