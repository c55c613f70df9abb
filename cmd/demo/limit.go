package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// floatValue is a flag holding a rate: a finite number, not negative.
type floatValue struct{ p *float64 }

func (v *floatValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return strconv.FormatFloat(*v.p, 'g', -1, 64)
}

func (v *floatValue) Set(s string) error {
	x, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	switch {
	case err != nil || math.IsNaN(x) || math.IsInf(x, 0):
		return errors.New("not a number")
	case x < 0:
		return errors.New("must not be negative (0: no limit)")
	}
	*v.p = x
	return nil
}

// limitFlags are the limit flags of `demo limit` and `demo run`.
type limitFlags struct {
	maxInFlight int
	rate        float64
}

// register adds --max-in-flight and --rate; what says what they limit.
func (l *limitFlags) register(f *flagSet, what string) {
	f.intVar(&l.maxInFlight, "max-in-flight", 0, 0, 1<<40, "most items of "+what+" in flight at once across all workers (0: no limit)")
	f.add(&floatValue{p: &l.rate}, "rate", "R", "most items of "+what+" started per second across all workers (0: no limit)")
}

// limitsJSON is a queue's stored limits, as `demo limit` and `demo status` show them.
type limitsJSON struct {
	MaxInFlight       int                  `json:"max_in_flight"`
	Rate              float64              `json:"rate"`
	TenantMaxInFlight int                  `json:"tenant_max_in_flight"`
	TenantRate        float64              `json:"tenant_rate"`
	Tenants           map[string]limitJSON `json:"tenants"`
}

type limitJSON struct {
	MaxInFlight int     `json:"max_in_flight"`
	Rate        float64 `json:"rate"`
}

// readLimits reads queue's stored limits.
func readLimits(ctx context.Context, db claim.DB, queue string) (*limitsJSON, error) {
	st := crsql.NewLimitStatements(tables)
	var l limitsJSON
	var maxIn, tenantMaxIn int64
	var now any
	if err := db.QueryRow(ctx, st.QueueLimits, queue).Scan(&maxIn, &l.Rate, &tenantMaxIn, &l.TenantRate, &now); err != nil {
		return nil, fmt.Errorf("reading the limits of %q: %w", queue, crsql.Classify(err))
	}
	l.MaxInFlight, l.TenantMaxInFlight = int(maxIn), int(tenantMaxIn)
	q, err := claim.New(db, claim.Options{Queue: queue, Tables: tables})
	if err != nil {
		return nil, err
	}
	tenants, err := q.TenantLimits(ctx)
	if err != nil {
		return nil, err
	}
	l.Tenants = map[string]limitJSON{}
	for t, tl := range tenants {
		l.Tenants[t] = limitJSON{MaxInFlight: tl.MaxInFlight, Rate: tl.Rate}
	}
	return &l, nil
}

// none reports whether l limits nothing.
func (l *limitsJSON) none() bool {
	return l.MaxInFlight == 0 && l.Rate == 0 && l.TenantMaxInFlight == 0 && l.TenantRate == 0 && len(l.Tenants) == 0
}

// describe renders one limit for people.
func describe(maxIn int, rate float64) string {
	var parts []string
	if maxIn > 0 {
		parts = append(parts, fmt.Sprintf("at most %d in flight", maxIn))
	}
	if rate > 0 {
		parts = append(parts, fmt.Sprintf("at most %s/s", strconv.FormatFloat(rate, 'g', -1, 64)))
	}
	if len(parts) == 0 {
		return "no limit"
	}
	return strings.Join(parts, ", ")
}

// format renders l in a few lines.
func (l *limitsJSON) format() string {
	var b strings.Builder
	fmt.Fprintf(&b, "limits: queue: %s; each tenant: %s\n", describe(l.MaxInFlight, l.Rate), describe(l.TenantMaxInFlight, l.TenantRate))
	names := make([]string, 0, len(l.Tenants))
	for t := range l.Tenants {
		names = append(names, t)
	}
	sort.Strings(names)
	for _, t := range names {
		tl := l.Tenants[t]
		fmt.Fprintf(&b, "  tenant %q: %s\n", t, describe(tl.MaxInFlight, tl.Rate))
	}
	return b.String()
}

func cmdLimit(ctx context.Context, name string, args []string, out *console) error {
	var c common
	var lf limitFlags
	var tenant string
	var eachTenant, remove bool
	f := newFlagSet(name, `Sets or shows --queue's fleet-wide limits, stored in the database: at most
--max-in-flight items claimed at once across all workers and at most --rate
items started per second (0: no limit). With --tenant, the limit of that
tenant only; with --each-tenant, the default limit of every tenant without its
own; --remove with --tenant deletes the tenant's own limit. The flags not
given keep their stored values. Without a limit flag it shows the limits.
Running workers pick changes up within a second; each enforces its share (see
the README, "Fleet-wide limits").`)
	c.register(f, urlRequired)
	lf.register(f, "the queue (or the tenant)")
	f.stringVar(&tenant, "tenant", "", "NAME", "set (or --remove) this tenant's own limit", nil)
	f.boolVar(&eachTenant, "each-tenant", false, "set the default limit of each tenant")
	f.boolVar(&remove, "remove", false, "with --tenant: delete the tenant's own limit (the default applies again)")
	f.flagOnly("remove")
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	setting := f.isSet("max-in-flight") || f.isSet("rate")
	switch {
	case tenant != "" && eachTenant:
		return f.usageError("--tenant and --each-tenant exclude each other")
	case remove && tenant == "":
		return f.usageError("--remove needs --tenant")
	case remove && setting:
		return f.usageError("--remove takes no --max-in-flight or --rate")
	case (tenant != "" || eachTenant) && !setting && !remove:
		return f.usageError("give --max-in-flight or --rate (or --remove) to set a tenant limit")
	}
	pool, q, err := opConn(ctx, &c, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	cur, err := readLimits(ctx, pool, c.queue)
	if err != nil {
		return failf(1, "%v", err)
	}
	pick := func(old int, oldRate float64) (int, float64) {
		if f.isSet("max-in-flight") {
			old = lf.maxInFlight
		}
		if f.isSet("rate") {
			oldRate = lf.rate
		}
		return old, oldRate
	}
	switch {
	case remove:
		if _, err := q.RemoveTenantLimit(ctx, tenant); err != nil {
			return failf(1, "%v", err)
		}
	case tenant != "":
		old := cur.Tenants[tenant]
		m, r := pick(old.MaxInFlight, old.Rate)
		if err := q.SetTenantLimit(ctx, tenant, claim.Limit{MaxInFlight: m, Rate: r}); err != nil {
			return failf(1, "%v", err)
		}
	case setting:
		s, err := q.Settings(ctx)
		if err != nil {
			return failf(1, "%v", err)
		}
		if eachTenant {
			s.TenantMaxInFlight, s.TenantRate = pick(s.TenantMaxInFlight, s.TenantRate)
		} else {
			s.MaxInFlight, s.Rate = pick(s.MaxInFlight, s.Rate)
		}
		if err := q.Configure(ctx, s); err != nil {
			return failf(1, "%v", err)
		}
	}
	if setting || remove {
		if cur, err = readLimits(ctx, pool, c.queue); err != nil {
			return failf(1, "%v", err)
		}
	}
	if c.json {
		b, _ := json.Marshal(cur)
		fmt.Fprintln(out.stdout, string(b))
		return nil
	}
	fmt.Fprintf(out.stdout, "queue %q %s", c.queue, cur.format())
	return nil
}

// apply stores the run's limits for queue (flags not given keep the
// stored values).
func (l *limitFlags) apply(ctx context.Context, f *flagSet, pool *pgxpool.Pool, queue string) error {
	if !f.isSet("max-in-flight") && !f.isSet("rate") {
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
	if f.isSet("max-in-flight") {
		s.MaxInFlight = l.maxInFlight
	}
	if f.isSet("rate") {
		s.Rate = l.rate
	}
	return q.Configure(ctx, s)
}
