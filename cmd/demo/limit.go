package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
)

// limitFlags are the limit flags of `demo run` (`crdbwork limit` has the same).
type limitFlags struct {
	maxInFlight int
	rate        float64
}

// register adds --max-in-flight and --rate; what says what they limit.
func (l *limitFlags) register(f *cli.FlagSet, what string) {
	f.IntVar(&l.maxInFlight, "max-in-flight", 0, 0, 1<<40, "most items of "+what+" in flight at once across all workers (0: no limit)")
	f.FloatVar(&l.rate, "rate", "R", "most items of "+what+" started per second across all workers (0: no limit)")
}

// apply stores the run's limits for queue (flags not given keep the
// stored values).
func (l *limitFlags) apply(ctx context.Context, f *cli.FlagSet, pool *pgxpool.Pool, queue string) error {
	if !f.IsSet("max-in-flight") && !f.IsSet("rate") {
		return nil
	}
	q, err := claim.New(pool, claim.Options{Queue: queue, Tables: tables})
	if err != nil {
		return err
	}
	s, err := q.Settings(ctx)
	if err != nil {
		return err
	}
	if f.IsSet("max-in-flight") {
		s.MaxInFlight = l.maxInFlight
	}
	if f.IsSet("rate") {
		s.Rate = l.rate
	}
	return q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &s.Policy})
}
