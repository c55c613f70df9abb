// Package fleet is the one read model of a crdbwork fleet: the queues and
// their backlogs, the live sessions, the parts and their owners, and which
// sessions work which queue. `crdbwork status`, the dashboard and the
// metrics collector render the same Snapshot, so that they show the same
// numbers for the same database state.
//
// Every read is bounded: the queues and the sessions listed stop at
// Options.MaxQueues and Options.MaxSessions (the snapshot says when there
// were more), the counts stop at Options.CountCap when it is set, and the
// whole snapshot is read within Options.Timeout.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Defaults of Options.
const (
	DefaultMaxQueues   = 1000
	DefaultMaxSessions = 1000
	DefaultTimeout     = 30 * time.Second
)

// Options bound and shape one Snapshot. The zero value reads every queue
// (up to DefaultMaxQueues) with exact counts and no backlog by part.
type Options struct {
	// Queue, if set, is the only queue read (it need not exist).
	Queue string
	// MaxQueues and MaxSessions bound the queues and the live sessions
	// listed, in order of name and id. Default DefaultMaxQueues and
	// DefaultMaxSessions.
	MaxQueues, MaxSessions int
	// CountCap, if above 0, is where each count stops: a count equal to it
	// means "cap or more", and Due and OldestDue are counted among the
	// first CountCap unclaimed items in claim order. 0: exact counts, which
	// read each queue's whole backlog.
	CountCap int
	// Parts reads each queue's backlog by part and the items each session
	// holds (Queue.Parts, Queue.Holders), and Tenants its backlog by tenant
	// (Queue.Tenants): exact, each reads the queue's whole backlog (the
	// reads of claim.Queue.Inspect).
	Parts, Tenants bool
	// Kinds reads each queue's items by kind (Queue.Kinds): exact, it
	// reads the queue's whole backlog and its dead items.
	Kinds bool
	// EndedSince, if it has the queue, counts the queue's items ended
	// after that time (Queue.Ended; see the dashboard's throughput).
	EndedSince map[string]time.Time
	// QueuesOnly leaves out the sessions, owners and members (Snapshot's
	// Sessions, Owners and Members stay empty).
	QueuesOnly bool
	// Timeout bounds the whole snapshot's reads. Default DefaultTimeout.
	Timeout time.Duration
}

// Snapshot is one reading of the fleet.
type Snapshot struct {
	// At is when the reading started (this process's clock).
	At time.Time
	// Queues are the queues read, by name: those with a stored row, items,
	// dead or waiting items, ended ids (kept for the queue's dedup window)
	// or schedules (or Options.Queue alone): a drained queue stays listed. MoreQueues: there are more
	// than Options.MaxQueues.
	Queues     []Queue
	MoreQueues bool
	// Sessions are the first Options.MaxSessions live sessions by id;
	// LiveSessions counts the live sessions, all of them, and
	// ExpiredSessions the expired ones that no peer has reaped yet (their
	// parts and claims wait for the reap).
	Sessions                      []Session
	LiveSessions, ExpiredSessions int64
	// Owners are every queue's owned parts, by queue and part; an owner
	// may be an expired session not yet reaped.
	Owners []Owner
	// Members are every queue's memberships (session.Memberships), by
	// queue and session, live sessions or not.
	Members []session.Membership
}

// MoreSessions reports whether there are live sessions beyond those
// listed (the count and the list are two reads: a session that started
// between them counts too).
func (s *Snapshot) MoreSessions() bool { return s.LiveSessions > int64(len(s.Sessions)) }

// Queue is one queue's state.
type Queue struct {
	Name string
	// Stored: the queue has a row in the queues table; NumParts, Paused,
	// Fair, MaxInFlight and Rate come from it (1 part and defaults without
	// one).
	Stored      bool
	NumParts    int
	Paused      bool
	Fair        bool
	Sequenced   bool
	MaxInFlight int64
	Rate        float64
	// Unclaimed items, of which Due are past their vesting time; Claimed
	// items; Dead items; Waiting items (enqueued with prerequisites not yet
	// acked); Snoozed unclaimed items; Cancelling items (asked to stop, not
	// ended); Ended items since Options.EndedSince (0 without it). Each
	// stops at Options.CountCap when it is set.
	Unclaimed, Due, Claimed, Dead int64
	Waiting, Snoozed, Cancelling  int64
	Ended                         int64
	// OldestDueAt is the vesting time of the oldest due unclaimed item
	// (nil if none is due), and Now the database clock of the reading.
	OldestDueAt *time.Time
	Now         time.Time
	// LastEnded is the queue's latest end (acked, dead, cancelled, taken)
	// among the ids it remembers for its dedup window, LastDied its
	// latest death, ScheduleMarked the latest period mark of its
	// schedules (each nil: none); Schedules counts its schedules (up to
	// Options.CountCap).
	LastEnded, LastDied, ScheduleMarked *time.Time
	Schedules                           int64
	// Parts (with Options.Parts) are the queue's parts by number: every
	// part below NumParts when Stored, and any part that holds items.
	Parts []Part
	// Tenants (with Options.Tenants) are the MaxTenants tenants with the
	// most unclaimed items, most first, then by name.
	Tenants []Tenant
	// Holders (with Options.Parts) counts the items each session holds.
	Holders map[uuid.UUID]int64
	// Kinds (with Options.Kinds) are the queue's items by kind, at most
	// MaxKinds, those with the most unclaimed items first; MoreKinds: the
	// queue has more kinds.
	Kinds     []Kind
	MoreKinds bool
}

// OldestDue is the age of the oldest due unclaimed item (now minus its
// vesting time, by the database clock); 0 if none is due.
func (q Queue) OldestDue() time.Duration {
	if q.OldestDueAt == nil {
		return 0
	}
	return max(0, q.Now.Sub(*q.OldestDueAt))
}

// HasItems reports whether the queue holds unclaimed or claimed items.
func (q Queue) HasItems() bool { return q.Unclaimed+q.Claimed > 0 }

// Known reports a queue that has a stored row, items, dead items, waiting
// items, ended ids or schedules: a queue nobody has used is probably a
// mistyped name.
func (q Queue) Known() bool {
	return q.Stored || q.HasItems() || q.Dead > 0 || q.Waiting > 0 || q.LastEnded != nil || q.Schedules > 0
}

// LastActivity is the latest of the queue's last end, last death and last
// schedule mark (nil: none of them is known). Items being worked are
// activity too: see HasItems and Claimed.
func (q Queue) LastActivity() *time.Time {
	var last *time.Time
	for _, t := range []*time.Time{q.LastEnded, q.LastDied, q.ScheduleMarked} {
		if t != nil && (last == nil || t.After(*last)) {
			last = t
		}
	}
	return last
}

// Part is one part's backlog.
type Part struct {
	Part                    int
	Unclaimed, Due, Claimed int64
}

// MaxTenants is how many tenants Queue.Tenants lists at most (as
// claim.InspectTenants).
const MaxTenants = 20

// Tenant is one tenant's unclaimed items, of which Due are past their
// vesting time.
type Tenant struct {
	Tenant         string
	Unclaimed, Due int64
}

// MaxKinds is how many kinds Queue.Kinds lists at most.
const MaxKinds = 20

// Kind is the items of one kind (claim.NewItem.Kind) in a queue: Unclaimed,
// of which Due are past their vesting time (OldestDueAt the vesting time
// of the oldest of them, nil if none is due), Claimed and Dead. Kind ""
// counts the items without a kind.
type Kind struct {
	Kind                          string
	Unclaimed, Due, Claimed, Dead int64
	OldestDueAt                   *time.Time
}

// Session is a live session.
type Session struct {
	session.Info
	// Stale: no heartbeat for more than two of the longest heartbeat
	// intervals its expiry allows (expiry / session.MinExpiryFactor):
	// probably dead, not yet expired.
	Stale bool
}

// Owner is one owned part of one queue.
type Owner struct {
	Queue   string
	Part    int
	Session uuid.UUID
}

// Reader reads snapshots of the fleet in one set of tables. It is safe for
// concurrent use.
type Reader struct {
	db      crsql.DB
	t       crsql.Tables
	store   *store.Store
	checked atomic.Bool // the schema was found installed
}

// New returns a Reader of the fleet in db's tables t. It does no I/O: the
// schema is checked by the first Snapshot.
func New(db crsql.DB, t crsql.Tables) (*Reader, error) {
	if db == nil {
		return nil, errors.New("fleet: nil database")
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	return &Reader{db: db, t: t, store: store.New(t)}, nil
}

// Snapshot reads the fleet as opts shape it.
func (r *Reader) Snapshot(ctx context.Context, opts Options) (*Snapshot, error) {
	if opts.MaxQueues <= 0 {
		opts.MaxQueues = DefaultMaxQueues
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = DefaultMaxSessions
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.CountCap < 0 {
		return nil, fmt.Errorf("fleet: count cap %d is negative", opts.CountCap)
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	if !r.checked.Load() {
		if err := crsql.Check(ctx, r.db, r.t); err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
		r.checked.Store(true)
	}
	snap := &Snapshot{At: time.Now(), Queues: []Queue{}, Sessions: []Session{}, Owners: []Owner{}, Members: []session.Membership{}}
	names := []string{opts.Queue}
	if opts.Queue == "" {
		var err error
		if names, snap.MoreQueues, err = r.queueNames(ctx, opts.MaxQueues); err != nil {
			return nil, fmt.Errorf("fleet: listing the queues: %w", err)
		}
	}
	for _, n := range names {
		q, err := r.queue(ctx, n, opts)
		if err != nil {
			return nil, fmt.Errorf("fleet: reading queue %q: %w", n, err)
		}
		snap.Queues = append(snap.Queues, q)
	}
	if opts.QueuesOnly {
		return snap, nil
	}
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		rows, err := r.store.FleetLiveSessions(ctx, r.db, opts.MaxSessions)
		if err != nil {
			return store.Classify(err)
		}
		if snap.LiveSessions, snap.ExpiredSessions, err = r.store.FleetSessionCounts(ctx, r.db); err != nil {
			return store.Classify(err)
		}
		snap.Sessions = snap.Sessions[:0]
		for _, row := range rows {
			in := session.Info{ID: row.ID, Name: row.Name, Host: row.Host, PID: row.PID, CreatedAt: row.CreatedAt,
				HeartbeatAt: row.HeartbeatAt, Expiry: row.Expiry, Age: row.Age, SinceHeartbeat: row.SinceHeartbeat,
				Reported: session.Counters{Claimed: row.Reported.Claimed, Acked: row.Reported.Acked,
					Failed: row.Reported.Failed, InFlight: row.Reported.InFlight}}
			snap.Sessions = append(snap.Sessions, Session{Info: in, Stale: Stale(in)})
		}
		owners, err := r.store.PartsOwnersAll(ctx, r.db)
		if err != nil {
			return store.Classify(err)
		}
		snap.Owners = snap.Owners[:0]
		for _, o := range owners {
			snap.Owners = append(snap.Owners, Owner{Queue: o.Queue, Part: o.Part, Session: o.Session})
		}
		members, err := r.store.SessionsMemberships(ctx, r.db)
		if err != nil {
			return store.Classify(err)
		}
		snap.Members = snap.Members[:0]
		for _, m := range members {
			snap.Members = append(snap.Members, session.Membership{Queue: m.Queue, Session: m.Session, JoinedAt: m.JoinedAt})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: reading the sessions and parts: %w", err)
	}
	return snap, nil
}

// Stale reports a live session that has missed two heartbeats: no
// heartbeat for more than two of the longest heartbeat intervals its
// expiry allows. It is probably dead, not yet expired.
func Stale(in session.Info) bool {
	return in.SinceHeartbeat > 2*in.Expiry/session.MinExpiryFactor
}

// queueNames lists the first max queues by name that have a stored row,
// unclaimed, claimed, dead or waiting items, ended ids or schedules, and
// whether there are more: max+1 statements at most, each the next name of
// all the sources (store.Store.QueuesNextAny, as claim.Queues).
func (r *Reader) queueNames(ctx context.Context, max int) ([]string, bool, error) {
	var out []string
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		out = out[:0]
		for after := ""; len(out) <= max; {
			n, ok, err := r.store.QueuesNextAny(ctx, r.db, after)
			if err != nil {
				return store.Classify(err)
			}
			if !ok {
				break
			}
			out, after = append(out, n), n
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	if len(out) > max {
		return out[:max], true, nil
	}
	return out, false, nil
}

// queue reads one queue's state: its figures (store.Store.FleetQueue: one
// statement, each count stopping at the cap), and with opts.Parts,
// opts.Tenants and opts.Kinds its backlog by part, holders, tenants and
// kinds.
func (r *Reader) queue(ctx context.Context, name string, opts Options) (Queue, error) {
	capAt := int64(opts.CountCap)
	if capAt == 0 {
		capAt = math.MaxInt64 // exact: the limits read every row
	}
	since, ok := opts.EndedSince[name]
	if !ok {
		since = time.Now().Add(100 * 365 * 24 * time.Hour) // none ended after
	}
	var q Queue
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		row, err := r.store.FleetQueue(ctx, r.db, name, capAt, since)
		if err != nil {
			return store.Classify(err)
		}
		q = Queue{Name: name, Stored: row.Stored, NumParts: row.NumParts, Paused: row.Paused, Fair: row.Fair,
			Sequenced: row.Sequenced, MaxInFlight: row.MaxInFlight, Rate: row.Rate,
			Unclaimed: row.Unclaimed, Due: row.Due, Claimed: row.Claimed, Dead: row.Dead,
			Waiting: row.Waiting, Snoozed: row.Snoozed, Cancelling: row.Cancelling, Ended: row.Ended,
			OldestDueAt: row.OldestDue, Now: row.Now,
			LastEnded: row.LastEnded, LastDied: row.LastDied, ScheduleMarked: row.ScheduleMarked, Schedules: row.Schedules}
		if !ok {
			q.Ended = 0
		}
		if opts.Parts {
			if err := r.parts(ctx, &q); err != nil {
				return err
			}
		}
		if opts.Tenants {
			if err := r.tenants(ctx, &q); err != nil {
				return err
			}
		}
		if opts.Kinds {
			return r.kinds(ctx, &q)
		}
		return nil
	})
	return q, err
}

// kinds reads q's items by kind (store.Store.FleetKinds: the queue's whole
// backlog and dead items).
func (r *Reader) kinds(ctx context.Context, q *Queue) error {
	kinds, err := r.store.FleetKinds(ctx, r.db, q.Name, MaxKinds+1)
	if err != nil {
		return store.Classify(err)
	}
	q.MoreKinds = len(kinds) > MaxKinds
	q.Kinds = make([]Kind, 0, min(len(kinds), MaxKinds))
	for _, k := range kinds[:min(len(kinds), MaxKinds)] {
		q.Kinds = append(q.Kinds, Kind{Kind: k.Kind, Unclaimed: k.Unclaimed, Due: k.Due, Claimed: k.Claimed, Dead: k.Dead, OldestDueAt: k.OldestDue})
	}
	return nil
}

// parts reads q's backlog by part and the items each session holds
// (store.Store.QueueInspectUnclaimed and InspectClaimed: the queue's whole
// backlog).
func (r *Reader) parts(ctx context.Context, q *Queue) error {
	byPart := map[int]*Part{}
	part := func(p int) *Part {
		if byPart[p] == nil {
			byPart[p] = &Part{Part: p}
		}
		return byPart[p]
	}
	if q.Stored {
		for p := range q.NumParts {
			part(p)
		}
	}
	unclaimed, err := r.store.QueueInspectUnclaimed(ctx, r.db, q.Name)
	if err != nil {
		return store.Classify(err)
	}
	for _, u := range unclaimed {
		p := part(u.Part)
		p.Unclaimed, p.Due = u.Unclaimed, u.Due
	}
	claimed, err := r.store.QueueInspectClaimed(ctx, r.db, q.Name)
	if err != nil {
		return store.Classify(err)
	}
	q.Holders = map[uuid.UUID]int64{}
	for _, c := range claimed {
		part(c.Part).Claimed += c.Claimed
		q.Holders[c.Session] += c.Claimed
	}
	q.Parts = make([]Part, 0, len(byPart))
	for _, p := range byPart {
		q.Parts = append(q.Parts, *p)
	}
	sort.Slice(q.Parts, func(i, j int) bool { return q.Parts[i].Part < q.Parts[j].Part })
	return nil
}

// tenants reads q's backlog by tenant (store.Store.QueueInspectTenants: the
// queue's unclaimed items that have a tenant).
func (r *Reader) tenants(ctx context.Context, q *Queue) error {
	tenants, err := r.store.QueueInspectTenants(ctx, r.db, q.Name, MaxTenants)
	if err != nil {
		return store.Classify(err)
	}
	q.Tenants = make([]Tenant, 0, len(tenants))
	for _, t := range tenants {
		q.Tenants = append(q.Tenants, Tenant{Tenant: t.Tenant, Unclaimed: t.Unclaimed, Due: t.Due})
	}
	return nil
}
