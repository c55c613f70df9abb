// Package denied reads the server's refusal of a statement for lack of a
// privilege (SQLSTATE 42501) on PostgreSQL and CockroachDB: what was refused
// (a table, a schema, ...) and, where the engine says so, the user and the
// privilege. The crdbwork command and the workers use it to say which
// table and privilege a role lacks.
package denied

import (
	"errors"
	"regexp"

	"github.com/jackc/pgx/v5/pgconn"
)

// Code is the SQLSTATE of a refusal for lack of a privilege
// (insufficient_privilege), on both engines.
const Code = "42501"

// Refusal is what a refusal's message says.
type Refusal struct {
	// Kind is what was refused: "table" (PostgreSQL's "relation" too),
	// "schema", "sequence", "function"; on CockroachDB its word
	// ("relation", "schema", "database", ...).
	Kind string
	// Name is the object's name as the server wrote it (unquoted; maybe
	// qualified on CockroachDB).
	Name string
	// User and Privilege: CockroachDB's message names them; PostgreSQL's
	// does not ("": ask the server, store.PrivilegesLacking).
	User, Privilege string
	// Owner: only the object's owner may do it (PostgreSQL's "must be
	// owner of ...").
	Owner bool
	// Err is the server's error.
	Err *pgconn.PgError
}

var (
	// PostgreSQL: "permission denied for table crdbwork_queues" (also
	// schema, sequence, function), "must be owner of table …".
	pgDenied = regexp.MustCompile(`^permission denied for (table|relation|schema|sequence|function) "?([^" ]+)"?`)
	pgOwner  = regexp.MustCompile(`^must be owner of (table|relation|index|schema|function) "?([^" ]+)"?`)
	// CockroachDB: "user ro does not have INSERT privilege on relation
	// crdbwork_queues".
	crdbDenied = regexp.MustCompile(`^user (\S+) does not have (\w+) privilege on (\w+) (\S+)`)
)

// Of returns the refusal for lack of a privilege in err's chain (false: err
// has none). A refusal whose message has none of the known forms has only
// Err.
func Of(err error) (Refusal, bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != Code {
		return Refusal{}, false
	}
	r := Refusal{Err: pgErr}
	m := pgErr.Message
	if g := crdbDenied.FindStringSubmatch(m); g != nil {
		r.User, r.Privilege, r.Kind, r.Name = g[1], g[2], g[3], g[4]
		return r, true
	}
	if g := pgOwner.FindStringSubmatch(m); g != nil {
		r.Kind, r.Name, r.Owner = g[1], g[2], true
		return r, true
	}
	if g := pgDenied.FindStringSubmatch(m); g != nil {
		r.Kind, r.Name = g[1], g[2]
		if r.Kind == "relation" {
			r.Kind = "table"
		}
	}
	return r, true
}
