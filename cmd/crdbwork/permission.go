package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/crdbwork/crdbwork/internal/denied"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// opened is the database the command opened (one command per process):
// explainPermission asks it which privileges the user lacks.
var opened struct {
	url    string
	tables crsql.Tables
}

// rolesHint ends a permission refusal's line.
const rolesHint = `grant it, or run the command as a role that has it (docs/operations.md, "Roles and grants")`

// explainPermission writes the one line of a refusal for lack of a
// privilege: the table (or schema) and the privilege. PostgreSQL names only
// the table: the privileges the user lacks on it are read from the
// database (has_table_privilege) over a short connection of its own.
func explainPermission(pgErr *pgconn.PgError) string {
	r, ok := denied.Of(pgErr)
	switch {
	case !ok:
		return ""
	case r.User != "":
		return fmt.Sprintf("permission denied: user %s lacks the %s privilege on %s %s (SQLSTATE 42501): %s", r.User, r.Privilege, r.Kind, r.Name, rolesHint)
	case r.Owner:
		return fmt.Sprintf("permission denied: only the owner of %s %s may change it (SQLSTATE 42501): run this as the role that owns the crdbwork tables (docs/operations.md, \"Roles and grants\")", r.Kind, r.Name)
	case r.Name == "":
		return ""
	}
	kind, name := r.Kind, r.Name
	line := fmt.Sprintf("permission denied for %s %s", kind, name)
	if kind != "table" && kind != "schema" {
		return line + " (SQLSTATE 42501): " + rolesHint
	}
	user, lacking := lackingPrivileges(name, kind == "schema")
	switch {
	case user != "" && len(lacking) > 0:
		return fmt.Sprintf("%s: user %q lacks the %s privilege%s on it (SQLSTATE 42501): %s", line, user, strings.Join(lacking, ", "),
			map[bool]string{true: "s"}[len(lacking) > 1], rolesHint)
	case user != "":
		return fmt.Sprintf("%s: user %q (SQLSTATE 42501): %s", line, user, rolesHint)
	}
	return line + " (SQLSTATE 42501): " + rolesHint
}

// lackingPrivileges asks the database the command opened which privileges
// its user lacks on the table or schema ("", nil when it cannot tell).
func lackingPrivileges(name string, schema bool) (string, []string) {
	if opened.url == "" {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, opened.url)
	if err != nil {
		return "", nil
	}
	defer conn.Close(context.Background())
	if !schema && opened.tables.Schema != "" && !strings.Contains(name, ".") {
		name = pgx.Identifier{opened.tables.Schema, name}.Sanitize()
	} else if !strings.Contains(name, ".") {
		name = pgx.Identifier{name}.Sanitize()
	}
	user, lacking, err := store.PrivilegesLacking(ctx, conn, name, schema)
	if err != nil {
		return "", nil
	}
	return user, lacking
}
