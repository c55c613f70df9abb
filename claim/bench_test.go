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
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
)

// BenchmarkClaimAck measures claim + exactly-once ack throughput on the test
// database: `sessions` concurrent sessions each claim `batch` items per
// statement and ack them one transaction per item (ack=each: Ack) or one
// transaction per batch (ack=batch: AckBatch with one record function;
// ack=items: AckMany with a record function per item), each recording a
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
						got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: bc.batch})
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
							err = errors.Join(q.AckMany(ctx, reqs, claim.AckOptions{})...)
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

// claimAll claims every item of q for s in claims of batch items, untimed
// set-up for the ack benchmarks.
func claimAll(b *testing.B, ctx context.Context, q *claim.Queue, s *session.Session, batch int) []claim.Item {
	b.Helper()
	var all []claim.Item
	for {
		got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: batch})
		if err != nil {
			b.Fatal(err)
		}
		if len(got) == 0 {
			return all
		}
		all = append(all, got...)
	}
}

// BenchmarkClaim measures claims alone: one session claims `batch` items per
// statement from a backlog of b.N items until it is empty (the items stay
// claimed). It reports items/s and claims/s.
func BenchmarkClaim(b *testing.B) {
	for _, batch := range []int{1, 16, 64, 256} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			pool := setup(b)
			ctx := context.Background()
			q := newQueue(b, pool, claim.Options{})
			if _, err := q.Enqueue(ctx, payloads(b.N)...); err != nil {
				b.Fatal(err)
			}
			if err := store.RefreshStats(ctx, pool, "crdbwork_items"); err != nil {
				b.Fatal(err)
			}
			s := startSession(b, ctx, pool)
			b.ResetTimer()
			start := time.Now()
			claimed, claims := 0, 0
			for claimed < b.N {
				got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: batch})
				if err != nil {
					b.Fatal(err)
				}
				if len(got) == 0 {
					b.Fatalf("claimed %d of %d items, then nothing", claimed, b.N)
				}
				claimed += len(got)
				claims++
			}
			elapsed := time.Since(start).Seconds()
			b.StopTimer()
			b.ReportMetric(float64(claimed)/elapsed, "items/s")
			b.ReportMetric(float64(claims)/elapsed, "claims/s")
		})
	}
}

// BenchmarkAck measures acks alone, each recording a result row, on b.N
// items claimed beforehand (untimed): ack=single is one Ack (one
// transaction) per item from `goroutines` goroutines; ack=batch is AckBatch
// of `batch` items recording them all in one multi-row INSERT; ack=each is
// AckMany of `batch` items, each with its own record function; ack=hook is
// AckMany of `batch` items whose BatchRecord writes all their result rows
// in one multi-row INSERT. It reports items/s.
func BenchmarkAck(b *testing.B) {
	for _, bc := range []struct {
		ack               string
		goroutines, batch int
	}{
		{"single", 1, 1}, {"single", 8, 1}, {"batch", 1, 64}, {"batch", 4, 64}, {"each", 1, 64}, {"each", 4, 64},
		{"hook", 1, 64}, {"hook", 4, 64},
	} {
		b.Run(fmt.Sprintf("ack=%s/goroutines=%d/batch=%d", bc.ack, bc.goroutines, bc.batch), func(b *testing.B) {
			pool := setup(b)
			ctx := context.Background()
			q := newQueue(b, pool, claim.Options{})
			if _, err := q.Enqueue(ctx, payloads(b.N)...); err != nil {
				b.Fatal(err)
			}
			s := startSession(b, ctx, pool)
			items := claimAll(b, ctx, q, s, 1000)
			if len(items) != b.N {
				b.Fatalf("claimed %d of %d items", len(items), b.N)
			}
			work := make(chan []claim.Item, len(items)/bc.batch+1)
			for i := 0; i < len(items); i += bc.batch {
				work <- items[i:min(i+bc.batch, len(items))]
			}
			close(work)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for range bc.goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for group := range work {
						if err := ackGroup(ctx, q, bc.ack, group); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start).Seconds()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed, "items/s")
			if n := count(b, pool, `SELECT count(*) FROM results`); n != b.N {
				b.Fatalf("%d results for %d items", n, b.N)
			}
		})
	}
}

// insertResults writes the result rows of items in one statement.
func insertResults(ctx context.Context, tx pgx.Tx, items []claim.Item) error {
	ids := make([][16]byte, len(items))
	sessions := make([][16]byte, len(items))
	for i, it := range items {
		ids[i], sessions[i] = it.ID, it.Session
	}
	_, err := tx.Exec(ctx, `INSERT INTO results (item_id, session_id) SELECT * FROM unnest($1::UUID[], $2::UUID[])`, ids, sessions)
	return err
}

// ackGroup acks group the way ack names, recording each item's result row.
func ackGroup(ctx context.Context, q *claim.Queue, ack string, group []claim.Item) error {
	switch ack {
	case "hook":
		reqs := make([]claim.AckRequest, len(group))
		for i, it := range group {
			reqs[i] = claim.AckRequest{Item: it}
		}
		return errors.Join(q.AckMany(ctx, reqs, claim.AckOptions{Batch: func(ctx context.Context, tx pgx.Tx, acked []claim.AckRequest) error {
			items := make([]claim.Item, len(acked))
			for i, r := range acked {
				items[i] = r.Item
			}
			return insertResults(ctx, tx, items)
		}})...)
	case "batch":
		acked, err := q.AckBatch(ctx, group, insertResults)
		if err == nil && len(acked) != len(group) {
			err = fmt.Errorf("acked %d of %d items", len(acked), len(group))
		}
		return err
	case "each":
		reqs := make([]claim.AckRequest, len(group))
		for i, it := range group {
			reqs[i] = claim.AckRequest{Item: it, Record: record(it)}
		}
		return errors.Join(q.AckMany(ctx, reqs, claim.AckOptions{})...)
	default:
		for _, it := range group {
			if err := q.Ack(ctx, it, record(it)); err != nil {
				return err
			}
		}
		return nil
	}
}
