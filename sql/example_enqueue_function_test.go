package sql_test

import (
	"context"
	"fmt"
	"log"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Enqueue from SQL, as a program in any language would: Apply installs the
// function crdbwork_enqueue with the schema (EnqueueFunctionSQL returns its
// text, for psql or the cockroach CLI). The same id enqueued twice is
// added once. The call passes its arguments by position, as CockroachDB
// needs; PostgreSQL also takes them by name (key => 'ada@example.com').
func ExampleEnqueueFunctionSQL() {
	ctx := context.Background()
	url, drop := testdb.ExampleURL()
	defer drop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		log.Fatal(err)
	}

	id := uuid.MustParse("6f1c1c8e-4a59-4c36-9c52-3e8d2c1f0a77")
	for range 2 {
		var added, done bool
		// Arguments by position (CockroachDB takes no named arguments):
		// queue, payload, id, key, priority, delay, run_at, max_attempts,
		// tenant, ttl, metadata, headers.
		err := pool.QueryRow(ctx, `SELECT added, done FROM crdbwork_enqueue('mail', convert_to('welcome ada', 'UTF8'),
			$1, 'ada@example.com', 0, NULL, NULL, NULL, NULL, NULL, NULL,
			'{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}')`, id).
			Scan(&added, &done)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("added %v, done %v\n", added, done)
	}
	var payload string
	if err := pool.QueryRow(ctx, `SELECT convert_from(payload, 'UTF8') FROM crdbwork_items WHERE id = $1`, id).Scan(&payload); err != nil {
		log.Fatal(err)
	}
	fmt.Println("queued:", payload)
	// Output:
	// added true, done false
	// added false, done false
	// queued: welcome ada
}
