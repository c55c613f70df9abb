package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// withDefaults fills every zero field with its default, keeps every set
// field, maps the negative "off" values to zero and refuses values that
// cannot work.
func TestOptionsWithDefaults(t *testing.T) {
	t.Parallel()
	zero, err := Options{}.withDefaults()
	if err != nil {
		t.Fatalf("zero Options: %v", err)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"Concurrency", zero.Concurrency, DefaultConcurrency},
		{"Poll", zero.Poll, DefaultPoll},
		{"ItemTimeout", zero.ItemTimeout, DefaultItemTimeout},
		{"HangGrace", zero.HangGrace, DefaultHangGrace},
		{"MaxAbandoned", zero.MaxAbandoned, DefaultMaxAbandoned},
		{"ShutdownTimeout", zero.ShutdownTimeout, DefaultShutdownTimeout},
		{"RestartDelay", zero.RestartDelay, DefaultRestartDelay},
		{"StartTimeout", zero.StartTimeout, DefaultStartTimeout},
		{"MaxAckBatch", zero.MaxAckBatch, DefaultMaxAckBatch},
		{"Ackers", zero.Ackers, DefaultAckers},
		{"GatherWait", zero.GatherWait, DefaultGatherWait},
	} {
		if c.got != c.want {
			t.Errorf("zero Options: %s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if zero.Logger == nil {
		t.Error("zero Options: Logger is nil, want a no-op logger")
	}

	log := zap.NewExample()
	set, err := Options{
		Concurrency: 3, Poll: time.Second, ItemTimeout: time.Minute,
		HangGrace: time.Second, MaxAbandoned: 2, ShutdownTimeout: 3 * time.Second,
		RestartDelay: 4 * time.Second, StartTimeout: 5 * time.Second, MaxAckBatch: 1, Ackers: 3,
		GatherWait: time.Millisecond, Logger: log,
		Session: session.Tuning{Heartbeat: 2 * time.Second}, Name: "n",
	}.withDefaults()
	if err != nil {
		t.Fatalf("set Options: %v", err)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"Concurrency", set.Concurrency, 3},
		{"Poll", set.Poll, time.Second},
		{"ItemTimeout", set.ItemTimeout, time.Minute},
		{"HangGrace", set.HangGrace, time.Second},
		{"MaxAbandoned", set.MaxAbandoned, 2},
		{"ShutdownTimeout", set.ShutdownTimeout, 3 * time.Second},
		{"RestartDelay", set.RestartDelay, 4 * time.Second},
		{"StartTimeout", set.StartTimeout, 5 * time.Second},
		{"MaxAckBatch", set.MaxAckBatch, 1},
		{"Ackers", set.Ackers, 3},
		{"GatherWait", set.GatherWait, time.Millisecond},
		{"Logger", set.Logger, log},
		{"Session.Heartbeat", set.Session.Heartbeat, 2 * time.Second},
		{"Name", set.Name, "n"},
	} {
		if c.got != c.want {
			t.Errorf("set Options: %s = %v, want %v", c.name, c.got, c.want)
		}
	}

	// The ack batch's default follows Concurrency: a quarter of it,
	// between DefaultMaxAckBatch and MaxDefaultAckBatch.
	for _, c := range []struct{ concurrency, want int }{
		{1, DefaultMaxAckBatch}, {256, DefaultMaxAckBatch}, {512, 128}, {1000, 250}, {1024, MaxDefaultAckBatch}, {10_000, MaxDefaultAckBatch},
	} {
		o, err := Options{Concurrency: c.concurrency}.withDefaults()
		if err != nil {
			t.Fatalf("Concurrency %d: %v", c.concurrency, err)
		}
		if o.MaxAckBatch != c.want {
			t.Errorf("Concurrency %d: MaxAckBatch defaults to %d, want %d", c.concurrency, o.MaxAckBatch, c.want)
		}
	}

	off, err := Options{MaxAbandoned: -1, GatherWait: -time.Millisecond}.withDefaults()
	if err != nil {
		t.Fatalf("negative MaxAbandoned and GatherWait: %v", err)
	}
	if off.MaxAbandoned != 0 || off.GatherWait != 0 {
		t.Errorf("negative MaxAbandoned and GatherWait became %d and %v, want 0 and 0", off.MaxAbandoned, off.GatherWait)
	}

	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{Concurrency: -1}, "concurrency -1 is negative"},
		{Options{Parts: -1}, "Parts -1 is out of range"},
		{Options{MaxAckBatch: -1}, "MaxAckBatch -1 is negative"},
		{Options{Ackers: -1}, "Ackers -1 must be between"},
		{Options{Ackers: maxAckers + 1}, "must be between"},
		{Options{Poll: -time.Second}, "Poll -1s is negative"},
		{Options{ItemTimeout: MaxDuration + 1}, "ItemTimeout"},
	} {
		if _, err := c.opts.withDefaults(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("withDefaults(%+v) = %v, want an error containing %q", c.opts, err, c.want)
		}
	}
}

// nopDB satisfies claim.DB for a queue that does no I/O.
type nopDB struct{ claim.DB }

// New takes the queue's name, tables and database, and its lease when set,
// else the worker's default lease.
func TestNewTakesTheQueuesPolicy(t *testing.T) {
	t.Parallel()
	db := nopDB{}
	tables := crsql.Tables{Prefix: "t_"}
	h := func(context.Context, claim.Item) (Record, error) { return nil, nil }
	for _, c := range []struct {
		qopts claim.Options
		wopts Options
		want  time.Duration
	}{
		{claim.Options{Queue: "q", Tables: tables}, Options{}, 2*time.Minute + DefaultHangGrace + settleGrace},
		{claim.Options{Queue: "q", Tables: tables}, Options{ItemTimeout: time.Second, HangGrace: time.Second}, 2*time.Second + settleGrace},
		{claim.Options{Queue: "q", Tables: tables, Lease: 7 * time.Minute}, Options{}, 7 * time.Minute},
	} {
		q, err := claim.New(db, c.qopts)
		if err != nil {
			t.Fatal(err)
		}
		w, err := New(q, h, c.wopts)
		if err != nil {
			t.Fatal(err)
		}
		if w.lease != c.want || w.name != "q" || w.tables != tables || w.db != claim.DB(db) || w.Queue() != q {
			t.Errorf("New(queue %+v, %+v): lease %v, name %q, tables %+v, db %v; want %v, \"q\", %+v, the queue's",
				c.qopts, c.wopts, w.lease, w.name, w.tables, w.db, c.want, tables)
		}
	}
	if _, err := New(nil, h, Options{}); err == nil {
		t.Error("New(nil queue) succeeded")
	}
}
