package partition_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func countRows(t *testing.T, pool *pgxpool.Pool, query string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// SetParts from 8 parts to 3 while two sessions claim and ack (one in
// parts mode, owning every part, one with any-part claims): no item is left
// in a removed part, and every item ends acked exactly once. SetParts runs
// once a tenth of the items are acked; the workers never take the last
// fifth before it returned, so that it always runs while they work,
// however the machine schedules them.
func TestSetPartsWhileWorking(t *testing.T) {
	t.Parallel()
	pool := setup(t, 8)
	// Bounds the workers, should the test fail; stretched with the load.
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(3*time.Minute))
	defer cancel()
	if _, err := pool.Exec(ctx, `CREATE TABLE results (item_id UUID NOT NULL, part_mode BOOL NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Enough items for both sessions to be busy claiming and acking while
	// SetParts moves them (it was 20,000: 162 s of single acks on a loaded
	// machine, for the same races).
	const total = 3000
	items := make([]claim.NewItem, total)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(fmt.Sprint(i))}
		if i%3 == 0 {
			items[i].Key = fmt.Sprint("key-", i%97)
		}
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, pool, `SELECT count(DISTINCT part) FROM crdbwork_items`); n != 8 {
		t.Fatalf("items in %d parts, want 8", n)
	}

	hb := await.Stretch(200 * time.Millisecond) // with the expiry: see fastSession
	sopts := session.Options{Tuning: session.Tuning{Heartbeat: hb, Expiry: 25 * hb}}
	inParts, err := session.Start(ctx, pool, sopts)
	if err != nil {
		t.Fatal(err)
	}
	defer inParts.Close(context.Background())
	anyPart, err := session.Start(ctx, pool, sopts)
	if err != nil {
		t.Fatal(err)
	}
	defer anyPart.Close(context.Background())
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part)
		SELECT $1, 'default', g FROM generate_series(0, 7) AS g`, inParts.ID()); err != nil {
		t.Fatal(err)
	}

	var acked, lost atomic.Int64
	setPartsDone := make(chan struct{})
	work := func(partMode bool, s *session.Session) error {
		for ctx.Err() == nil {
			if acked.Load() >= total*8/10 {
				select { // the last fifth waits for SetParts
				case <-setPartsDone:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			var got []claim.Item
			var err error
			if partMode {
				var parts []int
				rows, err := pool.Query(ctx, `SELECT part FROM crdbwork_session_parts WHERE session_id = $1`, s.ID())
				if err != nil {
					return err
				}
				if parts, err = pgx.CollectRows(rows, pgx.RowTo[int]); err != nil {
					return err
				}
				got, err = q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 50, Parts: parts})
				if errors.Is(err, claim.ErrNotOwner) {
					continue // SetParts removed a part meanwhile
				}
			} else {
				got, err = q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 50})
			}
			if err != nil {
				return err
			}
			if len(got) == 0 {
				var left int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items`).Scan(&left); err != nil {
					return err
				}
				if left == 0 {
					return nil
				}
				continue
			}
			for _, it := range got {
				err := q.Ack(ctx, it, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO results (item_id, part_mode) VALUES ($1, $2)`, it.ID, partMode)
					return err
				})
				switch {
				case errors.Is(err, claim.ErrClaimLost):
					lost.Add(1)
				case err != nil:
					return err
				default:
					acked.Add(1)
				}
			}
		}
		return ctx.Err()
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, s := range []*session.Session{inParts, anyPart} {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = work(i == 0, s) }()
	}

	await.Until(t, "a tenth of the items acked", func() (bool, string) {
		n := acked.Load()
		return n >= total/10 || ctx.Err() != nil, fmt.Sprintf("%d acked", n)
	}, await.Within(2*time.Minute))
	err = partition.SetParts(ctx, pool, crsql.Tables{}, "default", 3)
	close(setPartsDone)
	if err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE part >= 3`); n != 0 {
		t.Fatalf("%d items left in removed parts after SetParts returned", n)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_session_parts WHERE part >= 3`); n != 0 {
		t.Fatalf("%d ownership rows of removed parts", n)
	}
	if moved := acked.Load(); moved >= total {
		t.Fatalf("the workers acked every item (%d) before SetParts ran: the test proves nothing", moved)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items never acked", n)
	}
	if n, d := countRows(t, pool, `SELECT count(*) FROM results`), countRows(t, pool, `SELECT count(DISTINCT item_id) FROM results`); n != total || d != total {
		t.Fatalf("%d results for %d distinct items, want %d of each", n, d, total)
	}
	if countRows(t, pool, `SELECT count(*) FROM results WHERE part_mode`) == 0 || countRows(t, pool, `SELECT count(*) FROM results WHERE NOT part_mode`) == 0 {
		t.Fatal("one of the two sessions acked nothing")
	}
	t.Logf("acked %d, acks refused (claim lost) %d", acked.Load(), lost.Load())
}
