package schedule

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/robfig/cron/v3"

	"github.com/crdbwork/crdbwork/claim"
)

// Missed says what a schedule does with periods that got no item because
// no runner ran.
type Missed int

const (
	// CatchUp enqueues one item for the latest missed period when a runner
	// comes back (and the current period's, as always); older missed
	// periods get none. The default.
	CatchUp Missed = iota
	// Skip enqueues no item for missed periods: only the current period's.
	Skip
)

// String returns "catch-up" or "skip".
func (m Missed) String() string {
	switch m {
	case CatchUp:
		return "catch-up"
	case Skip:
		return "skip"
	}
	return fmt.Sprintf("Missed(%d)", int(m))
}

// MinEvery bounds Schedule.Every from below.
const MinEvery = time.Millisecond

// maxNameLength bounds Schedule.Name, in bytes.
const maxNameLength = 256

// Schedule is one periodic item: its name, its periods, and the item each
// period gets.
type Schedule struct {
	// Name identifies the schedule within its queue: every runner of the
	// queue that has a schedule of this name shares its periods, so give
	// them the same periods and item. Required; at most 256 bytes of valid
	// UTF-8 without NUL bytes.
	Name string
	// Every, if set, makes the periods the multiples of Every since the
	// Unix epoch (1970-01-01 UTC): with Every = time.Hour, a period starts
	// at every full hour. At least MinEvery, and a whole number of
	// microseconds (the database's precision). Set Every or Cron, not both.
	Every time.Duration
	// Cron, if set, makes the periods start at its activation times: five
	// fields (minute, hour, day of month, month, day of week), or six with
	// a leading seconds field, or a descriptor (@yearly, @monthly, @weekly,
	// @daily, @hourly), parsed by github.com/robfig/cron/v3. It is
	// evaluated in UTC unless it begins with CRON_TZ=Zone (for example
	// "CRON_TZ=Europe/Paris 0 9 * * 1-5"). "@every" is refused: use Every.
	Cron string
	// Item is the item each period gets. Its ID must be zero: each
	// period's item gets the id ItemID(queue, Name, period). An item that
	// Queue.Enqueue would refuse (a payload over the queue's MaxPayload,
	// say) makes every transaction of the schedule fail: Tick returns the
	// error, Run logs it and tries again after Options.RetryDelay.
	Item claim.NewItem
	// Make, if set, builds each period's item instead of Item, given the
	// period's start (UTC): for a payload that names the period. Its ID is
	// ignored. It must be deterministic enough for the application: a
	// period's item is built by whichever runner enqueues it.
	Make func(period time.Time) claim.NewItem
	// Missed says what to do with periods missed while no runner ran.
	// Default CatchUp.
	Missed Missed
}

// compiled is a validated schedule.
type compiled struct {
	Schedule
	every time.Duration
	cron  cron.Schedule
}

// parser accepts 5 fields, 6 with leading seconds, and descriptors.
var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ErrBadSchedule is wrapped by the errors of schedules that cannot run: a
// missing name, no periods or two kinds of them, a cron expression that
// does not parse, an item with an id.
var ErrBadSchedule = errors.New("bad schedule")

// compile validates s.
func compile(s Schedule) (*compiled, error) {
	fail := func(format string, args ...any) (*compiled, error) {
		return nil, fmt.Errorf("schedule %q: %w: %s", s.Name, ErrBadSchedule, fmt.Sprintf(format, args...))
	}
	switch {
	case s.Name == "":
		return fail("a name is required")
	case len(s.Name) > maxNameLength || strings.ContainsRune(s.Name, 0) || !utf8.ValidString(s.Name):
		return fail("the name must be at most %d bytes of valid UTF-8 without NUL bytes", maxNameLength)
	case s.Every == 0 && s.Cron == "":
		return fail("set Every or Cron")
	case s.Every != 0 && s.Cron != "":
		return fail("set Every or Cron, not both")
	case s.Missed != CatchUp && s.Missed != Skip:
		return fail("unknown Missed option %d", int(s.Missed))
	case s.Make == nil && s.Item.ID != uuid.Nil:
		return fail("Item.ID must be zero: each period's item gets a derived id (ItemID)")
	}
	c := &compiled{Schedule: s}
	if s.Every != 0 {
		if s.Every < MinEvery || s.Every%time.Microsecond != 0 {
			return fail("Every %v must be at least %v and a whole number of microseconds", s.Every, MinEvery)
		}
		c.every = s.Every
		return c, nil
	}
	sched, err := parser.Parse(s.Cron)
	if err != nil {
		return fail("cron expression %q: %v", s.Cron, err)
	}
	if _, ok := sched.(cron.ConstantDelaySchedule); ok {
		return fail("cron expression %q: @every counts from each process's start, so processes would not agree on periods; use Schedule.Every", s.Cron)
	}
	c.cron = sched
	if c.latest(time.Now()).IsZero() && c.next(time.Now()).IsZero() {
		return fail("cron expression %q never fires", s.Cron)
	}
	return c, nil
}

// maxLookBack bounds the search for a cron expression's latest activation:
// robfig/cron looks at most five years ahead for the next one.
const maxLookBack = 6 * 366 * 24 * time.Hour

// latest returns the start of the period that contains t: the latest
// period start at or before t (UTC), or the zero time if there is none.
func (c *compiled) latest(t time.Time) time.Time {
	t = t.UTC()
	if c.every > 0 {
		e := c.every.Microseconds()
		us := t.UnixMicro()
		p := us / e * e
		if us < 0 && us%e != 0 {
			p -= e
		}
		return time.UnixMicro(p).UTC()
	}
	// Look back twice as far each time until an activation falls in
	// (t-step, t], then walk forward to the last one.
	for step := time.Second; step <= maxLookBack; step *= 2 {
		first := c.cron.Next(t.Add(-step))
		if first.IsZero() {
			return time.Time{}
		}
		if first.After(t) {
			continue
		}
		last := first
		for {
			n := c.cron.Next(last)
			if n.IsZero() || n.After(t) {
				return last.UTC()
			}
			last = n
		}
	}
	return time.Time{}
}

// next returns the start of the first period after t (UTC), or the zero
// time if there is none.
func (c *compiled) next(t time.Time) time.Time {
	t = t.UTC()
	if c.every > 0 {
		return c.latest(t).Add(c.every)
	}
	return c.cron.Next(t).UTC()
}

// previous returns the start of the period before the one starting at p.
func (c *compiled) previous(p time.Time) time.Time {
	return c.latest(p.Add(-time.Microsecond))
}

// item returns the item of period p, with its derived id.
func (c *compiled) item(queue string, p time.Time) claim.NewItem {
	it := c.Item
	if c.Make != nil {
		it = c.Make(p)
	}
	it.ID = ItemID(queue, c.Name, p)
	return it
}

// namespace is the UUID namespace of periodic items' ids.
var namespace = uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/crdbwork/crdbwork/schedule"))

// ItemID returns the id of the item of the period starting at period of
// schedule name in queue: a version 5 (SHA-1) UUID of the three, the same
// in every process. Use it to find, or cancel, a period's item.
func ItemID(queue, name string, period time.Time) uuid.UUID {
	key := queue + "\x00" + name + "\x00" + period.UTC().Format(time.RFC3339Nano)
	return uuid.NewSHA1(namespace, []byte(key))
}

// PeriodAt returns the start of the period of s that contains t (UTC), or
// the zero time if s has none at or before t. It fails as New does on a
// schedule that cannot run.
func PeriodAt(s Schedule, t time.Time) (time.Time, error) {
	c, err := compile(s)
	if err != nil {
		return time.Time{}, err
	}
	return c.latest(t), nil
}
