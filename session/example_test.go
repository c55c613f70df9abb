package session_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Start a session, see it among the live sessions, and close it, which
// deletes its row.
func ExampleStart() {
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

	sess, err := session.Start(ctx, pool, session.Options{
		Name:   "example-worker",
		Tuning: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	live, err := session.List(ctx, pool, crsql.Tables{})
	if err != nil {
		log.Fatal(err)
	}
	for _, info := range live {
		fmt.Println(info.Name, info.ID == sess.ID(), info.Expiry)
	}

	if err := sess.Close(ctx); err != nil {
		log.Fatal(err)
	}
	ids, err := session.LiveIDs(ctx, pool, crsql.Tables{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("live after Close:", len(ids))
	fmt.Println("closed:", errors.Is(sess.Err(), session.ErrClosed))
	// Output:
	// example-worker true 700ms
	// live after Close: 0
	// closed: true
}
