package sql_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Apply the schema in a schema of its own with a custom table prefix, and
// check it. Every other package takes the same Tables in its options.
func ExampleApply() {
	ctx := context.Background()
	url, drop := testdb.ExampleURL()
	defer drop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	tables := crsql.Tables{Schema: "work", Prefix: "jobs_"}
	err = crsql.Check(ctx, pool, tables)
	fmt.Println("before Apply, missing:", errors.Is(err, crsql.ErrSchemaMissing))

	if err := crsql.Apply(ctx, pool, tables); err != nil {
		log.Fatal(err)
	}
	if err := crsql.Apply(ctx, pool, tables); err != nil { // idempotent
		log.Fatal(err)
	}
	fmt.Println("after Apply:", crsql.Check(ctx, pool, tables))
	fmt.Println("items table:", tables.Table("items"))

	rows, err := pool.Query(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = 'work' ORDER BY table_name`)
	if err != nil {
		log.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		log.Fatal(err)
	}
	for _, name := range names {
		fmt.Println(name)
	}
	// Output:
	// before Apply, missing: true
	// after Apply: <nil>
	// items table: "work"."jobs_items"
	// jobs_attempt_errors
	// jobs_audit
	// jobs_cancelled_items
	// jobs_dead_items
	// jobs_ended
	// jobs_items
	// jobs_queues
	// jobs_reaps
	// jobs_schedules
	// jobs_schema_version
	// jobs_session_parts
	// jobs_session_queues
	// jobs_sessions
	// jobs_tenant_limits
	// jobs_waiting
	// jobs_waits_across
	// jobs_waits_for
}
