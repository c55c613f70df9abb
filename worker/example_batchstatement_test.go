package worker_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// Record results in bulk with one SQL statement: Options.BatchStatement
// returns the statement and its arguments instead of running it, so that
// on PostgreSQL each ack transaction (BEGIN, the fenced delete, this
// statement, COMMIT) goes to the server in one round trip.
func Example_batchStatement() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE lengths (word TEXT PRIMARY KEY, length INT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return nil, worker.RecordValue(ctx, string(it.Payload))
	}
	record := func(acked []claim.AckRequest) (string, []any) {
		words := make([]string, len(acked))
		for i, r := range acked {
			words[i] = r.Value.(string)
		}
		return `INSERT INTO lengths (word, length) SELECT w, length(w) FROM unnest($1::TEXT[]) AS u (w)`, []any{words}
	}
	q, err := claim.New(pool, claim.Options{Queue: "words"})
	if err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(q, handle, worker.Options{
		BatchStatement: record,
		Poll:           20 * time.Millisecond,
		Session:        session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	words := []string{"one", "round", "trip"}
	for _, word := range words {
		if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte(word)}); err != nil {
			log.Fatal(err)
		}
	}
	runUntil(ctx, w, pool, `SELECT count(*) FROM lengths`, len(words))
	var total int
	if err := pool.QueryRow(ctx, `SELECT sum(length) FROM lengths`).Scan(&total); err != nil {
		log.Fatal(err)
	}
	fmt.Println("letters:", total)
	// Output:
	// letters: 12
}
