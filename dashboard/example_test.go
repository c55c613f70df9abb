package dashboard_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/dashboard"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Mount the dashboard under a prefix of a service of your own, behind the
// service's own login: the Auth hook names the user for the audit list and
// refuses everyone else; AllowedHosts names the host the service is reached
// by, and any other Host is refused (DNS rebinding).
func ExampleNew() {
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

	// README:begin embed
	ops, err := dashboard.New(pool, dashboard.Options{
		BasePath: "/ops/queues",
		Auth: func(r *http.Request) (string, bool) {
			user, ok := loggedIn(r) // your service's session check
			return user, ok && isOperator(user)
		},
		// The names your service is reached by (loopback ones are always served).
		AllowedHosts: []string{"ops.example.com"},
		// ReadOnly: true, // to show everything and change nothing
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/queues/", http.StripPrefix("/ops/queues", ops))
	// README:end embed

	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, c := range []struct{ user, host string }{{"ada", "ops.example.com"}, {"mallory", "ops.example.com"}, {"ada", "attacker.example"}} {
		req, _ := http.NewRequest("GET", srv.URL+"/ops/queues/", nil)
		req.Host = c.host // as a browser at https://ops.example.com/ops/queues/ sends it
		req.Header.Set("X-Demo-User", c.user)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(c.user, c.host, resp.StatusCode)
	}
	// Output:
	// ada ops.example.com 200
	// mallory ops.example.com 401
	// ada attacker.example 403
}

// loggedIn stands for a service's own authentication.
func loggedIn(r *http.Request) (string, bool) {
	u := r.Header.Get("X-Demo-User")
	return u, u != ""
}

func isOperator(user string) bool { return user == "ada" }
