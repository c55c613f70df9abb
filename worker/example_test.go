package worker_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// Run a worker whose handler does its work outside any transaction and
// returns a Record that writes the result in the ack's transaction. The
// example stops the worker once every item has a result.
func ExampleWorker_Run() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE greetings (name TEXT PRIMARY KEY, greeting TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		name := string(it.Payload)
		greeting := "Hello, " + strings.ToUpper(name[:1]) + name[1:] + "!" // the slow work
		return worker.Exec(`INSERT INTO greetings (name, greeting) VALUES ($1, $2)`, name, greeting), nil
	}
	q, err := claim.New(pool, claim.Options{Queue: "greetings"})
	if err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(q, handle, worker.Options{
		Concurrency: 2,
		Poll:        20 * time.Millisecond,
		Session:     session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	names := []string{"ada", "bob", "eve"}
	for _, name := range names {
		if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte(name)}); err != nil {
			log.Fatal(err)
		}
	}

	// Run the worker until every item has its result, then stop it
	// gracefully.
	runUntil(ctx, w, pool, `SELECT count(*) FROM greetings`, len(names))

	rows, err := pool.Query(ctx, `SELECT greeting FROM greetings ORDER BY name`)
	if err != nil {
		log.Fatal(err)
	}
	greetings, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		log.Fatal(err)
	}
	for _, g := range greetings {
		fmt.Println(g)
	}
	fmt.Println("acked:", w.Stats().Acked)
	// Output:
	// Hello, Ada!
	// Hello, Bob!
	// Hello, Eve!
	// acked: 3
}

// Record results in bulk: each handler hands its result to the worker with
// RecordValue, and Options.BatchRecord writes the results of a whole ack
// transaction in one statement.
func ExampleRecordValue() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE lengths (word TEXT PRIMARY KEY, length INT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	type result struct {
		word   string
		length int
	}
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		word := string(it.Payload)
		return nil, worker.RecordValue(ctx, result{word, len(word)})
	}
	batch := func(ctx context.Context, tx pgx.Tx, acked []claim.AckRequest) error {
		var words []string
		var lengths []int64
		for _, r := range acked {
			res := r.Value.(result)
			words, lengths = append(words, res.word), append(lengths, int64(res.length))
		}
		_, err := tx.Exec(ctx, `INSERT INTO lengths (word, length) SELECT * FROM unnest($1::TEXT[], $2::INT[])`, words, lengths)
		return err
	}
	q, err := claim.New(pool, claim.Options{Queue: "words"})
	if err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(q, handle, worker.Options{
		BatchRecord: batch,
		Poll:        20 * time.Millisecond,
		Session:     session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	words := []string{"exactly", "once", "in", "bulk"}
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
	// letters: 17
}

// examplePool returns a pool on a fresh database with the crdbwork schema,
// and a function that closes it and drops the database.
func examplePool(ctx context.Context) (*pgxpool.Pool, func()) {
	url, drop := testdb.ExampleURL()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		drop()
		log.Fatal(err)
	}
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		pool.Close()
		drop()
		log.Fatal(err)
	}
	return pool, func() { pool.Close(); drop() }
}

// runUntil runs w until query counts want rows (at most 10 s), then stops
// it gracefully.
func runUntil(ctx context.Context, w *worker.Worker, pool *pgxpool.Pool, query string, want int) {
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(ctx, query).Scan(&n); err != nil {
			log.Fatal(err)
		}
		if n == want {
			break
		}
		if time.Now().After(deadline) {
			log.Fatalf("only %d of %d results", n, want)
		}
	}
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
}
