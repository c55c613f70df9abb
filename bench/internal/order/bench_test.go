package order_test

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkPEI measures the popped element index of claims (see package
// order) on a steady backlog of 1,000 random items: without parts, and in
// parts mode with 4, 16 and 64 parts worked by 1, 4 and 16 sessions, each
// claiming one item at a time, concurrently and (for parts) in turn
// ("serial", where every count is exact); then with 5% urgent items, with
// and without the urgent lane, with every session claiming or with one of
// them busy (it owns its parts but never claims). b.N is the number of claims:
//
//	go -C bench test -run '^$' -bench PEI -benchtime 1000x ./internal/order/
//
// Each row also logs itself as a line of the table in docs/parts-and-order.md.
func BenchmarkPEI(b *testing.B) {
	ctx := context.Background()
	pool := setup(b)
	urgent := 49_999
	var loads []load
	for _, s := range []int{1, 4, 16} {
		loads = append(loads, load{sessions: s})
	}
	for _, p := range []int{4, 16, 64} {
		for _, s := range []int{1, 4, 16} {
			loads = append(loads, load{parts: p, sessions: s}, load{parts: p, sessions: s, serial: true})
		}
	}
	for _, s := range []int{4, 16} {
		for _, busy := range []int{0, 1} {
			for _, lane := range []bool{false, true} {
				loads = append(loads, load{parts: 16, sessions: s, busy: busy, urgent: &urgent, urgentShare: 0.05, lane: lane})
			}
		}
	}
	runs := 0
	for _, l := range loads {
		l.backlog, l.batch = 1000, 1
		b.Run(l.name(), func(b *testing.B) {
			runs++
			l.claims = b.N
			b.ResetTimer()
			res := l.run(b, ctx, pool, fmt.Sprint("pei-", runs), uint64(runs))
			b.StopTimer()
			a := res.all
			b.ReportMetric(float64(a.Median), "pei-median")
			b.ReportMetric(a.Mean, "pei-mean")
			b.ReportMetric(float64(a.P90), "pei-p90")
			b.ReportMetric(float64(a.P99), "pei-p99")
			b.ReportMetric(float64(res.retries)/float64(b.N), "retries/claim")
			b.ReportMetric(float64(res.claimTime.Microseconds())/1000, "claim-ms")
			row := fmt.Sprintf("| %s | %d | %.1f | %d | %d |", l.name(), a.Median, a.Mean, a.P90, a.P99)
			if l.urgent != nil {
				u := res.urgent
				b.ReportMetric(float64(u.Median), "urgent-pei-median")
				b.ReportMetric(float64(u.P99), "urgent-pei-p99")
				b.ReportMetric(float64(res.urgentLeft), "urgent-left")
				row += fmt.Sprintf(" urgent (%d): median %d, mean %.1f, p90 %d, p99 %d; lane took %d of %d; %d urgent left |", u.Count, u.Median, u.Mean, u.P90, u.P99, res.laneClaimed, res.claimed, res.urgentLeft)
			}
			row += fmt.Sprintf(" retries %d, claim %.2f ms", res.retries, float64(res.claimTime.Microseconds())/1000)
			b.Log(row)
		})
	}
}
