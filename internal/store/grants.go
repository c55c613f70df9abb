package store

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/crdbwork/crdbwork/internal/names"
)

// Grant is the privileges a role needs on one crdbwork table.
type Grant struct {
	// Table is the table's default name ("crdbwork_items"); Tables rename
	// it (prefix, schema) where a statement names it.
	Table string
	// Privileges are table privileges: SELECT, INSERT, UPDATE, DELETE.
	Privileges []string
}

// WorkerGrants are the privileges the role of a worker process (packages
// worker, claim, session, partition) needs on each crdbwork table: every
// worker checks them at start (worker.ErrPrivileges). It is the one list
// of them: docs/operations.md ("Roles and grants") gives the worker role
// these grants, and cmd/crdbwork's TestWorkerGrantsMatchTheDocs fails when
// the two differ. A table a worker of this version starts to use goes here
// and into that block together.
var WorkerGrants = func() []Grant {
	readWrite := []string{"SELECT", "INSERT", "UPDATE", "DELETE"}
	var out []Grant
	// Read by every role: the worker checks the schema's version.
	out = append(out, Grant{Table: "crdbwork_schema_version", Privileges: []string{"SELECT"}})
	for _, t := range []string{
		"sessions", "queues", "session_queues", "session_parts", "items", "dead_items", "tenant_limits",
		"schedules", "ended", "cancelled_items", "waiting", "waits_for", "waits_across", "reaps", "attempt_errors",
	} {
		out = append(out, Grant{Table: names.DefaultPrefix + t, Privileges: readWrite})
	}
	// The audit list is the operators': a worker reads it (the commands it
	// may run check it), and writes nothing to it.
	out = append(out, Grant{Table: "crdbwork_audit", Privileges: []string{"SELECT"}})
	return out
}()

// grantsLackingSQL: $1 tables (as the statements name them), $2 one
// privilege for each → the current user and, for each pair the user lacks,
// the table and the privilege (no row: it lacks none). One statement for
// every table; has_table_privilege(table, privilege) has the same two-text
// signature on both engines (CockroachDB's builtins make the PostgreSQL
// privilege inquiry functions, with the same optional user argument), and
// each pair asks for one privilege (a comma-separated list would be true
// when any of them is held).
const grantsLackingSQL = `SELECT current_user::TEXT, g.t, g.p
  FROM unnest($1::TEXT[], $2::TEXT[]) AS g (t, p)
 WHERE NOT has_table_privilege(g.t, g.p)`

// GrantsLacking returns the current user and what it lacks of grants on the
// store's tables, in the order of grants (nil: nothing), in one statement.
// Each returned Grant names its table as the store's tables name it
// (Tables.Plain). A table that does not exist fails the statement (42P01:
// Classify).
func (s *Store) GrantsLacking(ctx context.Context, db DB, grants []Grant) (user string, lacking []Grant, err error) {
	var tables, privs []string
	for _, g := range grants {
		name := names.Name(s.t.Schema, s.t.Prefix, g.Table)
		for _, p := range g.Privileges {
			tables, privs = append(tables, name), append(privs, p)
		}
	}
	rows, err := db.Query(ctx, grantsLackingSQL, tables, privs)
	if err != nil {
		return "", nil, fmt.Errorf("reading the user's privileges on the crdbwork tables: %w", err)
	}
	defer rows.Close()
	missing := make(map[[2]string]bool)
	for rows.Next() {
		var t, p string
		if err := rows.Scan(&user, &t, &p); err != nil {
			return "", nil, fmt.Errorf("reading the user's privileges on the crdbwork tables: %w", err)
		}
		missing[[2]string{t, p}] = true
	}
	if err := rows.Err(); err != nil {
		return "", nil, fmt.Errorf("reading the user's privileges on the crdbwork tables: %w", err)
	}
	for _, g := range grants {
		name := names.Name(s.t.Schema, s.t.Prefix, g.Table)
		var ps []string
		for _, p := range g.Privileges {
			if missing[[2]string{name, p}] {
				ps = append(ps, p)
			}
		}
		if len(ps) > 0 {
			lacking = append(lacking, Grant{Table: PlainName(name), Privileges: ps})
		}
	}
	return user, lacking, nil
}

// simpleIdent is an identifier that needs no quotes.
var simpleIdent = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// PlainName returns a quoted (and maybe schema-qualified) name as an
// operator would type it: each part without its quotes where it needs none.
func PlainName(quoted string) string {
	var parts []string
	for _, p := range splitQuoted(quoted) {
		if simpleIdent.MatchString(p) {
			parts = append(parts, p)
		} else {
			parts = append(parts, `"`+strings.ReplaceAll(p, `"`, `""`)+`"`)
		}
	}
	return strings.Join(parts, ".")
}

// splitQuoted splits "a"."b" (pgx.Identifier.Sanitize's form) into a, b.
func splitQuoted(s string) []string {
	var parts []string
	var cur strings.Builder
	in := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' && in && i+1 < len(s) && s[i+1] == '"':
			cur.WriteByte('"')
			i++
		case c == '"':
			in = !in
		case c == '.' && !in:
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	return append(parts, cur.String())
}

// GrantSet is one set of privileges and the tables that lack it.
type GrantSet struct {
	Privileges string   // "INSERT, UPDATE, DELETE"
	Tables     []string // as Grant.Table
}

// BySet groups lacking (as GrantsLacking returns it) by set of privileges,
// in their first table's order.
func BySet(lacking []Grant) []GrantSet {
	var out []GrantSet
	for _, g := range lacking {
		k := strings.Join(g.Privileges, ", ")
		i := slices.IndexFunc(out, func(s GrantSet) bool { return s.Privileges == k })
		if i < 0 {
			out = append(out, GrantSet{Privileges: k})
			i = len(out) - 1
		}
		out[i].Tables = append(out[i].Tables, g.Table)
	}
	return out
}

// GrantStatements returns the GRANT statements that give role the lacking
// privileges (as GrantsLacking returns them): one per set of privileges,
// tables of the same set together.
func GrantStatements(lacking []Grant, role string) []string {
	var out []string
	for _, s := range BySet(lacking) {
		out = append(out, fmt.Sprintf("GRANT %s ON %s TO %s", s.Privileges, strings.Join(s.Tables, ", "), PlainName(`"`+strings.ReplaceAll(role, `"`, `""`)+`"`)))
	}
	return out
}
