package testschema_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Each test's database has the whole schema (the version check passes, the
// enqueue function runs) and is its own: what one test writes, another does
// not see, however many run at once.
func TestNewHasTheSchemaAndIsolates(t *testing.T) {
	for i := range 6 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			pool := testschema.New(t)
			ctx := context.Background()
			if err := crsql.Check(ctx, pool, crsql.Tables{}); err != nil {
				t.Fatalf("the schema check of a copied database: %v", err)
			}
			q, err := claim.New(pool, claim.Options{})
			if err != nil {
				t.Fatal(err)
			}
			items := make([]claim.NewItem, i+1)
			for j := range items {
				items[j] = claim.NewItem{Payload: []byte("x")}
			}
			if _, err := q.Enqueue(ctx, items...); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `SELECT crdbwork_enqueue(`+testdb.EnqueueArgs("'default'", "'y'::BYTEA")+`)`); err != nil {
				t.Fatalf("the enqueue function of a copied database: %v", err)
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != i+2 {
				t.Fatalf("%d items in the test's database, want its own %d", n, i+2)
			}
		})
	}
}
