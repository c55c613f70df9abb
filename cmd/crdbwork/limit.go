package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
)

// limitsJSON is a queue's stored limits, as `crdbwork limit` and `crdbwork status` show them.
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
func readLimits(ctx context.Context, q *claim.Queue) (*limitsJSON, error) {
	s, err := q.Settings(ctx)
	if err != nil {
		return nil, err
	}
	l := limitsJSON{MaxInFlight: s.MaxInFlight, Rate: s.Rate, TenantMaxInFlight: s.TenantMaxInFlight, TenantRate: s.TenantRate}
	l.Tenants = map[string]limitJSON{}
	for t, tl := range s.TenantLimits {
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

func cmdLimit(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var maxInFlight int
	var rate float64
	var tenant string
	var eachTenant, remove bool
	f := prog.NewFlagSet(name, `Sets or shows --queue's fleet-wide limits, stored in the database: at most
--max-in-flight items claimed at once across all workers and at most --rate
items started per second (0: no limit). With --tenant, the limit of that
tenant only; with --each-tenant, the default limit of every tenant without its
own; --remove with --tenant deletes the tenant's own limit. The flags not
given keep their stored values. Without a limit flag it shows the limits.
Running workers pick changes up within a second; each enforces its share (see
docs/limits.md).`)
	g.register(f, queueRequired)
	g.registerCreate(f)
	f.IntVar(&maxInFlight, "max-in-flight", 0, 0, 1<<40, "most items of the queue (or the tenant) in flight at once across all workers (0: no limit)")
	f.FloatVar(&rate, "rate", "R", "most items of the queue (or the tenant) started per second across all workers (0: no limit)")
	f.StringVar(&tenant, "tenant", "", "NAME", "set (or --remove) this tenant's own limit", nil)
	f.BoolVar(&eachTenant, "each-tenant", false, "set the default limit of each tenant")
	f.BoolVar(&remove, "remove", false, "with --tenant: delete the tenant's own limit (the default applies again)")
	f.FlagOnly("remove")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	setting := f.IsSet("max-in-flight") || f.IsSet("rate")
	switch {
	case tenant != "" && eachTenant:
		return f.UsageError("--tenant and --each-tenant exclude each other")
	case remove && tenant == "":
		return f.UsageError("--remove needs --tenant")
	case remove && setting:
		return f.UsageError("--remove takes no --max-in-flight or --rate")
	case (tenant != "" || eachTenant) && !setting && !remove:
		return f.UsageError("give --max-in-flight or --rate (or --remove) to set a tenant limit")
	}
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	cur, err := readLimits(ctx, q)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	pick := func(old int, oldRate float64) (int, float64) {
		if f.IsSet("max-in-flight") {
			old = maxInFlight
		}
		if f.IsSet("rate") {
			oldRate = rate
		}
		return old, oldRate
	}
	switch {
	case remove:
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{tenant: nil}}); err != nil {
			return cli.Failf(1, "%v", err)
		}
	case tenant != "":
		old := cur.Tenants[tenant]
		m, r := pick(old.MaxInFlight, old.Rate)
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{tenant: &claim.Limit{MaxInFlight: m, Rate: r}}}); err != nil {
			return cli.Failf(1, "%v", err)
		}
	case setting:
		s, err := q.Settings(ctx)
		if err != nil {
			return cli.Failf(1, "%v", err)
		}
		if eachTenant {
			s.TenantMaxInFlight, s.TenantRate = pick(s.TenantMaxInFlight, s.TenantRate)
		} else {
			s.MaxInFlight, s.Rate = pick(s.MaxInFlight, s.Rate)
		}
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &s.Policy}); err != nil {
			return cli.Failf(1, "%v", err)
		}
	}
	if setting || remove {
		if cur, err = readLimits(ctx, q); err != nil {
			return cli.Failf(1, "%v", err)
		}
	}
	if g.json {
		return cli.PrintJSON(out, cur)
	}
	out.Printf("queue %q %s", g.queue, cur.format())
	return nil
}
