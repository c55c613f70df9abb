package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
)

// BenchmarkClaimAck measures claim + exactly-once ack throughput on the test
// database: `sessions` concurrent sessions each claim `batch` items per
// statement and ack them one transaction per item (ack=each: Ack) or one
// transaction per batch (ack=batch: AckBatch with one record function;
// ack=items: AckEach with a record function per item), each recording a
// result row. It reports items/s.
func BenchmarkClaimAck(b *testing.B) {
	for _, bc := range []struct {
		sessions, batch int
		ack             string
	}{
		{1, 1, "each"}, {4, 16, "each"}, {8, 16, "each"}, {4, 16, "batch"}, {4, 16, "items"}, {8, 64, "batch"},
	} {
		name := fmt.Sprintf("sessions=%d/batch=%d/ack=%s", bc.sessions, bc.batch, bc.ack)
		b.Run(name, func(b *testing.B) {
			pool := setup(b)
			ctx := context.Background()
			q := newQueue(b, pool, claim.Options{})
			if _, err := q.Enqueue(ctx, payloads(b.N)...); err != nil {
				b.Fatal(err)
			}
			sessions := make([]*session.Session, bc.sessions)
			for i := range sessions {
				sessions[i] = startSession(b, ctx, pool)
			}
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for _, s := range sessions {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						got, err := q.Claim(ctx, s.ID(), bc.batch)
						if err != nil {
							b.Error(err)
							return
						}
						if len(got) == 0 {
							return
						}
						switch bc.ack {
						case "batch":
							_, err = q.AckBatch(ctx, got, func(ctx context.Context, tx pgx.Tx, acked []claim.Item) error {
								for _, it := range acked {
									if err := record(it)(ctx, tx); err != nil {
										return err
									}
								}
								return nil
							})
						case "items":
							reqs := make([]claim.AckRequest, len(got))
							for i, it := range got {
								reqs[i] = claim.AckRequest{Item: it, Record: record(it)}
							}
							err = errors.Join(q.AckEach(ctx, reqs)...)
						default:
							for _, it := range got {
								if err = q.Ack(ctx, it, record(it)); err != nil {
									break
								}
							}
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "items/s")
			retries := 0
			for _, n := range q.Stats().Retries {
				retries += int(n)
			}
			b.ReportMetric(float64(retries)/float64(b.N), "retries/item")
			if n := count(b, pool, `SELECT count(*) FROM results`); n != b.N {
				b.Fatalf("%d results for %d items", n, b.N)
			}
		})
	}
}
