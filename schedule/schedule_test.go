package schedule_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/schedule"
)

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Periods are the same whatever the process's time zone or the time's
// location: intervals from the Unix epoch, cron expressions in UTC unless
// they name a zone.
func TestPeriodAt(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skipf("no time zone database: %v", err)
	}
	for _, c := range []struct {
		s        schedule.Schedule
		at, want string
	}{
		{schedule.Schedule{Every: time.Hour}, "2026-03-04T10:59:59.999Z", "2026-03-04T10:00:00Z"},
		{schedule.Schedule{Every: time.Hour}, "2026-03-04T11:00:00Z", "2026-03-04T11:00:00Z"},
		{schedule.Schedule{Every: 7 * time.Second}, "1970-01-01T00:00:20Z", "1970-01-01T00:00:14Z"},
		{schedule.Schedule{Every: 250 * time.Millisecond}, "2026-03-04T10:00:00.6Z", "2026-03-04T10:00:00.5Z"},
		{schedule.Schedule{Every: 7 * time.Second}, "1969-12-31T23:59:59Z", "1969-12-31T23:59:53Z"},
		{schedule.Schedule{Cron: "*/15 * * * *"}, "2026-03-04T10:44:59Z", "2026-03-04T10:30:00Z"},
		{schedule.Schedule{Cron: "*/15 * * * *"}, "2026-03-04T10:45:00Z", "2026-03-04T10:45:00Z"},
		{schedule.Schedule{Cron: "*/10 * * * * *"}, "2026-03-04T10:45:09.9Z", "2026-03-04T10:45:00Z"},
		{schedule.Schedule{Cron: "@daily"}, "2026-03-04T23:00:00+05:00", "2026-03-04T00:00:00Z"},
		{schedule.Schedule{Cron: "0 9 * * 1-5"}, "2026-03-08T12:00:00Z", "2026-03-06T09:00:00Z"}, // Sunday → Friday
		// 09:00 in Paris is 08:00 UTC in winter.
		{schedule.Schedule{Cron: "CRON_TZ=Europe/Paris 0 9 * * *"}, "2026-01-10T08:30:00Z", "2026-01-10T08:00:00Z"},
		{schedule.Schedule{Cron: "0 0 29 2 *"}, "2027-01-01T00:00:00Z", "2024-02-29T00:00:00Z"},
	} {
		c.s.Name = "s"
		at := mustTime(t, c.at)
		for _, loc := range []*time.Location{time.UTC, paris} {
			got, err := schedule.PeriodAt(c.s, at.In(loc))
			if err != nil {
				t.Fatalf("%+v: %v", c.s, err)
			}
			if want := mustTime(t, c.want); !got.Equal(want) || got.Location() != time.UTC {
				t.Errorf("%q every %v at %s (%s): period %s, want %s UTC", c.s.Cron, c.s.Every, c.at, loc, got, want)
			}
		}
	}
}

// Schedules that cannot run are refused by New with an error naming the
// schedule and the reason.
func TestBadSchedules(t *testing.T) {
	for _, c := range []struct {
		s    schedule.Schedule
		want string
	}{
		{schedule.Schedule{Every: time.Hour}, "a name is required"},
		{schedule.Schedule{Name: "x"}, "set Every or Cron"},
		{schedule.Schedule{Name: "x", Every: time.Hour, Cron: "@daily"}, "not both"},
		{schedule.Schedule{Name: "x", Cron: "61 * * * *"}, `cron expression "61 * * * *"`},
		{schedule.Schedule{Name: "x", Cron: "every day"}, `cron expression "every day"`},
		{schedule.Schedule{Name: "x", Cron: "* * * *"}, "expected 5 to 6 fields"},
		{schedule.Schedule{Name: "x", Cron: "CRON_TZ=Mars/Olympus 0 9 * * *"}, "provided bad location"},
		{schedule.Schedule{Name: "x", Cron: "@every 1h"}, "use Schedule.Every"},
		{schedule.Schedule{Name: "x", Cron: "0 0 30 2 *"}, "never fires"},
		{schedule.Schedule{Name: "x", Every: time.Nanosecond}, "at least 1ms"},
		{schedule.Schedule{Name: "x", Every: time.Millisecond + time.Nanosecond}, "whole number of microseconds"},
		{schedule.Schedule{Name: "x", Every: -time.Hour}, "at least 1ms"},
		{schedule.Schedule{Name: "x", Every: time.Hour, Item: claim.NewItem{ID: uuid.New()}}, "Item.ID must be zero"},
		{schedule.Schedule{Name: "x", Every: time.Hour, Missed: 7}, "unknown Missed option"},
		{schedule.Schedule{Name: "bad\x00name", Every: time.Hour}, "NUL"},
	} {
		_, err := schedule.New(nilQueue(t), schedule.Options{}, c.s)
		if !errors.Is(err, schedule.ErrBadSchedule) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want ErrBadSchedule saying %q", c.s, err, c.want)
		}
		if _, err := schedule.PeriodAt(c.s, time.Now()); !errors.Is(err, schedule.ErrBadSchedule) {
			t.Errorf("PeriodAt %+v: %v, want ErrBadSchedule", c.s, err)
		}
	}
	_, err := schedule.New(nilQueue(t), schedule.Options{}, schedule.Schedule{Name: "a", Every: time.Hour}, schedule.Schedule{Name: "a", Cron: "@daily"})
	if !errors.Is(err, schedule.ErrBadSchedule) || !strings.Contains(err.Error(), `two schedules are named "a"`) {
		t.Errorf("two schedules of one name: %v", err)
	}
}

// Item ids depend on the queue, the name and the period's instant, not on
// its location.
func TestItemID(t *testing.T) {
	p := mustTime(t, "2026-03-04T10:00:00Z")
	a := schedule.ItemID("q", "s", p)
	if a != schedule.ItemID("q", "s", p.In(time.FixedZone("x", 3600))) {
		t.Fatal("the id depends on the period's location")
	}
	for _, other := range []uuid.UUID{schedule.ItemID("q2", "s", p), schedule.ItemID("q", "s2", p), schedule.ItemID("q", "s", p.Add(time.Microsecond))} {
		if other == a {
			t.Fatal("two periods share an id")
		}
	}
	if a.Version() != 5 {
		t.Fatalf("version %d, want 5", a.Version())
	}
}

// nilQueue returns a queue on a database for tests that do no I/O.
func nilQueue(t *testing.T) *claim.Queue {
	t.Helper()
	q, err := claim.New(nilDB{}, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return q
}
