package worker

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// withDefaults fills every zero field with its default, keeps every set
// field, maps the negative "off" values to zero, wires the nested options
// and refuses values that cannot work.
func TestOptionsWithDefaults(t *testing.T) {
	zero, err := Options{}.withDefaults()
	if err != nil {
		t.Fatalf("zero Options: %v", err)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"Queue", zero.Queue, claim.DefaultQueue},
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
		{"Claim.Lease", zero.Claim.Lease, defaultLease(zero)},
		{"Claim.Queue", zero.Claim.Queue, claim.DefaultQueue},
		{"Partition.Queue", zero.Partition.Queue, claim.DefaultQueue},
		{"Session.Logger", zero.Session.Logger, zero.Logger},
		{"Partition.Logger", zero.Partition.Logger, zero.Logger},
	} {
		if c.got != c.want {
			t.Errorf("zero Options: %s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if zero.Logger == nil {
		t.Error("zero Options: Logger is nil, want a no-op logger")
	}

	log, sessLog := zap.NewExample(), zap.NewExample()
	tables := crsql.Tables{Prefix: "t_"}
	set, err := Options{
		Queue: "q", Tables: tables, Concurrency: 3, Poll: time.Second, ItemTimeout: time.Minute,
		HangGrace: time.Second, MaxAbandoned: 2, ShutdownTimeout: 3 * time.Second,
		RestartDelay: 4 * time.Second, StartTimeout: 5 * time.Second, MaxAckBatch: 1, Ackers: 3,
		GatherWait: time.Millisecond, Logger: log,
		Claim:   claim.Options{Lease: 7 * time.Minute, Queue: "ignored"},
		Session: session.Options{Logger: sessLog},
	}.withDefaults()
	if err != nil {
		t.Fatalf("set Options: %v", err)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"Queue", set.Queue, "q"},
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
		{"Claim.Lease", set.Claim.Lease, 7 * time.Minute},
		{"Claim.Queue", set.Claim.Queue, "q"},
		{"Partition.Queue", set.Partition.Queue, "q"},
		{"Claim.Tables", set.Claim.Tables, tables},
		{"Session.Tables", set.Session.Tables, tables},
		{"Partition.Tables", set.Partition.Tables, tables},
		{"Session.Logger", set.Session.Logger, sessLog},
		{"Partition.Logger", set.Partition.Logger, log},
	} {
		if c.got != c.want {
			t.Errorf("set Options: %s = %v, want %v", c.name, c.got, c.want)
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
