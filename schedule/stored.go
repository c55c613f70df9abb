package schedule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Schedules stored in the database (schema version 6; River #242).
//
// A stored schedule is a Schedule kept in its row of crdbwork_schedules
// (column spec, JSON) instead of in a program: Put adds or changes one,
// Delete removes it, Pause stops and resumes it, List shows them — from any
// process, the command crdbwork schedules included. Every Runner of the
// queue (unless Options.NoStored) runs the queue's stored schedules beside
// its own, and picks up changes without a restart:
//
//   - each of a stored schedule's turns reads its row under the lock that
//     makes a period's item unique (the same transaction as before), so the
//     turn runs the spec, pause or removal committed before it: a change
//     takes effect at the schedule's next period on every runner, with no
//     statement beyond the turn's;
//   - to find schedules added since it started (and to wake up for a
//     changed spec's earlier period), Run re-reads the queue's stored
//     schedules every Options.Reload (default 10 s): one read of a range of
//     the table's primary key per runner, not per session or per second.
//
// Exactly one item per period, however many runners, as for schedules in
// code: the turn's transaction serializes on the row.

// StoredItem is the item a stored schedule enqueues each period: the
// options of claim.NewItem that can be stored (not ID, UniqueKey, After:
// each period's item gets its id from ItemID).
type StoredItem struct {
	Payload     []byte            `json:"payload,omitempty"`
	Metadata    []byte            `json:"metadata,omitempty"`
	Key         string            `json:"key,omitempty"`
	Tenant      string            `json:"tenant,omitempty"`
	Priority    int               `json:"priority,omitempty"`
	MaxAttempts int               `json:"max_attempts,omitempty"`
	Delay       time.Duration     `json:"delay_ns,omitempty"`
	TTL         time.Duration     `json:"ttl_ns,omitempty"`
	Timeout     time.Duration     `json:"timeout_ns,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	AtMostOnce  bool              `json:"at_most_once,omitempty"`
}

// spec is a stored schedule's definition as the spec column holds it.
type spec struct {
	// V is the format's version (1).
	V      int           `json:"v"`
	Every  time.Duration `json:"every_ns,omitempty"`
	Cron   string        `json:"cron,omitempty"`
	Missed string        `json:"missed,omitempty"`
	Item   StoredItem    `json:"item"`
}

// specVersion is the version of the spec format this code writes and reads.
const specVersion = 1

// storable returns the stored form of s, or why it cannot be stored.
func storable(s Schedule) (spec, error) {
	if s.Make != nil {
		return spec{}, fmt.Errorf("schedule %q: %w: Make is a function, which cannot be stored: give Item", s.Name, ErrBadSchedule)
	}
	it := s.Item
	switch {
	case it.UniqueKey != "" || it.UniquePeriod != 0:
		return spec{}, fmt.Errorf("schedule %q: %w: Item.UniqueKey cannot be stored: each period's item gets its id from ItemID", s.Name, ErrBadSchedule)
	case len(it.After) > 0:
		return spec{}, fmt.Errorf("schedule %q: %w: Item.After cannot be stored", s.Name, ErrBadSchedule)
	}
	return spec{V: specVersion, Every: s.Every, Cron: s.Cron, Missed: s.Missed.String(), Item: StoredItem{
		Payload: it.Payload, Metadata: it.Metadata, Key: it.Key, Tenant: it.Tenant, Priority: it.Priority,
		MaxAttempts: it.MaxAttempts, Delay: it.Delay, TTL: it.TTL, Timeout: it.Timeout, Headers: it.Headers, AtMostOnce: it.AtMostOnce,
	}}, nil
}

// decode returns the Schedule name that the spec column text holds.
func decode(name string, text []byte) (Schedule, error) {
	var sp spec
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sp); err != nil {
		return Schedule{}, fmt.Errorf("schedule %q: %w: its stored spec does not parse: %v", name, ErrBadSchedule, err)
	}
	if sp.V != specVersion {
		return Schedule{}, fmt.Errorf("schedule %q: %w: its stored spec has format version %d; this code reads %d", name, ErrBadSchedule, sp.V, specVersion)
	}
	s := Schedule{Name: name, Every: sp.Every, Cron: sp.Cron}
	switch sp.Missed {
	case "", CatchUp.String():
		s.Missed = CatchUp
	case Skip.String():
		s.Missed = Skip
	default:
		return Schedule{}, fmt.Errorf("schedule %q: %w: unknown missed option %q", name, ErrBadSchedule, sp.Missed)
	}
	it := sp.Item
	s.Item = claim.NewItem{Payload: it.Payload, Metadata: it.Metadata, Key: it.Key, Tenant: it.Tenant, Priority: it.Priority,
		MaxAttempts: it.MaxAttempts, Delay: it.Delay, TTL: it.TTL, Timeout: it.Timeout, Headers: it.Headers, AtMostOnce: it.AtMostOnce}
	return s, nil
}

// encode returns the spec column text of s, checked as New checks a
// schedule.
func encode(s Schedule) ([]byte, error) {
	if _, err := compile(s); err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	sp, err := storable(s)
	if err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	return json.Marshal(sp)
}

// Put stores s in q's queue: it adds the stored schedule, or changes the
// one of the same name (its last period and its pause are kept, so a
// change never enqueues a period twice). Every runner of the queue runs
// it from its next turn (see Options.Reload). s is checked as New checks
// a schedule, and must be storable: an Item (not Make), without ID,
// UniqueKey or After. The item is not checked against the queue's limits
// (MaxPayload, say) here: a runner that cannot enqueue it logs the error
// at every turn.
//
// A stored schedule may share its name with a schedule in code: they share
// the row, and so the periods (one item per period between them); a
// runner that has the name in code runs its own definition.
func Put(ctx context.Context, q *claim.Queue, s Schedule) error {
	if q == nil {
		return errors.New("schedule: nil queue")
	}
	text, err := encode(s)
	if err != nil {
		return err
	}
	st := store.New(q.Options().Tables)
	if _, err := q.Settings(ctx); err != nil { // checks the schema
		return fmt.Errorf("schedule: storing %q in queue %q: %w", s.Name, q.Name(), err)
	}
	err = retry.Do(ctx, nil, func(ctx context.Context) error {
		return store.Classify(st.SchedulesPut(ctx, q.DB(), q.Name(), s.Name, text))
	})
	if err != nil {
		return fmt.Errorf("schedule: storing %q in queue %q: %w", s.Name, q.Name(), err)
	}
	return nil
}

// ErrNotStored is returned by Delete and Pause for a name that has no
// stored schedule (Delete) or no row at all (Pause) in the queue.
var ErrNotStored = errors.New("no such schedule in the database")

// Delete removes the stored schedule name of q's queue: no runner enqueues
// its periods from then on (a turn under way finishes). Its items already
// enqueued stay. A schedule defined in code cannot be deleted here (remove
// it from the code; Pause stops it meanwhile): Delete returns an error
// wrapping ErrNotStored, as for an unknown name.
func Delete(ctx context.Context, q *claim.Queue, name string) error {
	if q == nil {
		return errors.New("schedule: nil queue")
	}
	st := store.New(q.Options().Tables)
	var deleted bool
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		deleted, err = st.SchedulesDelete(ctx, q.DB(), q.Name(), name)
		return store.Classify(err)
	})
	switch {
	case err != nil:
		return fmt.Errorf("schedule: deleting %q of queue %q: %w", name, q.Name(), err)
	case !deleted:
		return fmt.Errorf("schedule: deleting %q of queue %q: %w (a schedule defined in code is removed from its code)", name, q.Name(), ErrNotStored)
	}
	return nil
}

// Pause stops (paused true) or resumes (false) schedule name of q's queue,
// stored or defined in code: no runner of schema version 6 enqueues its
// periods while it is paused; resumed, it goes on with the current period
// (and the latest missed one, with CatchUp). A schedule defined in code
// has a row once it fired: before, Pause returns an error wrapping
// ErrNotStored. Runners of versions 3 to 5 do not know pauses.
func Pause(ctx context.Context, q *claim.Queue, name string, paused bool) error {
	if q == nil {
		return errors.New("schedule: nil queue")
	}
	st := store.New(q.Options().Tables)
	var found bool
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		found, err = st.SchedulesPause(ctx, q.DB(), q.Name(), name, paused)
		return store.Classify(err)
	})
	switch {
	case err != nil:
		return fmt.Errorf("schedule: pausing %q of queue %q: %w", name, q.Name(), err)
	case !found:
		return fmt.Errorf("schedule: pausing %q of queue %q: %w", name, q.Name(), ErrNotStored)
	}
	return nil
}

// Info is one schedule as List shows it.
type Info struct {
	Queue, Name string
	// Stored reports a stored schedule; false: a schedule defined in code
	// (its row keeps its last period and pause).
	Stored bool
	// Schedule is the stored schedule's definition (zero for one in code);
	// Err says why it could not be read, if so.
	Schedule Schedule
	Err      error
	// LastPeriod is the start of the last period enqueued (zero: none yet).
	LastPeriod time.Time
	// Next is the start of the next period (stored schedules; zero if
	// unknown).
	Next time.Time
	// Paused: no runner of version 6 enqueues its periods.
	Paused bool
	// UpdatedAt is when its row last changed.
	UpdatedAt time.Time
}

// MaxList bounds List.
const MaxList = 10000

// List returns the schedules of queue ("": of every queue) of the tables of
// db, by queue and name, at most limit (at most MaxList): the stored ones,
// and those defined in code that have fired (their rows).
func List(ctx context.Context, db claim.DB, tables crsql.Tables, queue string, limit int) ([]Info, error) {
	if limit <= 0 || limit > MaxList {
		limit = MaxList
	}
	st := store.New(tables)
	var rows []store.ScheduleRow
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		rows, err = st.SchedulesList(ctx, db, queue, limit)
		return store.Classify(err)
	})
	if err != nil {
		return nil, fmt.Errorf("schedule: listing schedules: %w", err)
	}
	out := make([]Info, len(rows))
	now := time.Now()
	for i, r := range rows {
		in := Info{Queue: r.Queue, Name: r.Name, Stored: r.Spec != nil, Paused: r.Paused, UpdatedAt: r.UpdatedAt}
		if !r.LastPeriod.Equal(store.NeverFired) {
			in.LastPeriod = r.LastPeriod.UTC()
		}
		if in.Stored {
			in.Schedule, in.Err = decode(r.Name, r.Spec)
			if in.Err == nil {
				if c, err := compile(in.Schedule); err == nil {
					in.Next = c.next(now)
				} else {
					in.Err = err
				}
			}
		}
		out[i] = in
	}
	return out, nil
}
