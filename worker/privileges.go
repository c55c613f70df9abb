package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/crdbwork/crdbwork/internal/denied"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// ErrPrivileges is wrapped by the error of Run (Worker's and Group's) when
// the database user the worker connects as lacks a privilege the worker
// needs on a crdbwork table: Run checks them all once, before its first
// session, and fails at once (it does not retry). The error names the
// user, each table and the privileges it lacks there, and the GRANT
// statements that give them (docs/operations.md, "Roles and grants", has
// the worker role's grants). A worker's statement refused for lack of a
// privilege later (grants revoked while it runs) is logged with an error
// that wraps it too, naming the same.
var ErrPrivileges = errors.New("the database user lacks privileges the worker needs")

// rolesDoc ends every message about a lacking privilege.
const rolesDoc = `docs/operations.md, "Roles and grants"`

// CheckGrants checks what Run checks at start: the schema's version (its
// errors are sql's ErrSchemaMissing, ErrSchemaOutdated, ErrSchemaNewer),
// then, in one statement, that the database user of db has every
// privilege a worker needs on the crdbwork tables of tables (the worker
// role's grants of docs/operations.md, "Roles and grants"). It returns an
// error wrapping ErrPrivileges that names the user, each table, the
// privileges it lacks there and the GRANT statements that give them, or
// the failure of the check; nil when nothing lacks. It reads the catalog
// only, so it runs whatever the user lacks (`crdbwork grants` runs it).
func CheckGrants(ctx context.Context, db DB, tables crsql.Tables) error {
	st := store.New(tables)
	cerr := crsql.Check(ctx, db, tables)
	if _, refused := denied.Of(cerr); cerr != nil && !refused {
		return cerr
	}
	// The check reads the catalog only: it runs without any grant on the
	// tables, and so explains a refused version check too.
	user, lacking, err := st.GrantsLacking(ctx, db, store.WorkerGrants)
	switch {
	case err != nil && cerr != nil:
		// Refused before any table: the schema (no USAGE), say.
		return refusedError(cerr)
	case err != nil:
		return store.Classify(err)
	case len(lacking) > 0:
		return lackingError(user, lacking, nil)
	}
	return cerr
}

// refusedError is the error wrapping ErrPrivileges and err, a refusal for
// lack of a privilege, that names what was refused.
func refusedError(err error) error {
	what := "a statement"
	if r, _ := denied.Of(err); r.Name != "" {
		what = r.Kind + " " + r.Name
		if r.Privilege != "" {
			what = r.Privilege + " on " + what
		}
	}
	return fmt.Errorf("%w: the database refused %s (%s): %w", ErrPrivileges, what, rolesDoc, err)
}

// lackingError is the error wrapping ErrPrivileges (and refused, the
// server's refusal, if any) that names what user lacks.
func lackingError(user string, lacking []store.Grant, refused error) error {
	var b strings.Builder
	fmt.Fprintf(&b, "user %q lacks ", user)
	for i, s := range store.BySet(lacking) {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s on %s", s.Privileges, strings.Join(s.Tables, ", "))
	}
	fmt.Fprintf(&b, " (%s): %s", rolesDoc, strings.Join(store.GrantStatements(lacking, user), "; "))
	if refused != nil {
		return fmt.Errorf("%w: %s: %w", ErrPrivileges, b.String(), refused)
	}
	return fmt.Errorf("%w: %s", ErrPrivileges, b.String())
}

// explainRefusal returns err itself unless the database refused it for
// lack of a privilege (SQLSTATE 42501): then an error wrapping
// ErrPrivileges and err that names the refused table and what the user
// lacks of the worker's grants (store.WorkerGrants), read in one statement
// (bounded by a few seconds; without it, the refused table alone).
func (w *Worker) explainRefusal(ctx context.Context, err error) error {
	r, ok := denied.Of(err)
	if !ok {
		return err
	}
	user, lacking, lerr := w.lacking(ctx)
	if lerr != nil || len(lacking) == 0 {
		return refusedError(err)
	}
	what := "a statement"
	if r.Name != "" {
		what = r.Kind + " " + r.Name
		if r.Privilege != "" {
			what = r.Privilege + " on " + what
		}
	}
	return fmt.Errorf("the database refused %s: %w", what, lackingError(user, lacking, err))
}

// lackingReuse is how long explainRefusal reuses what the user lacked: the
// refusals of many items' statements at once cost one statement.
const lackingReuse = 5 * time.Second

// lackingRead is what the user lacked, as read at a time.
type lackingRead struct {
	at      time.Time
	user    string
	lacking []store.Grant
}

// lacking returns what the database user lacks of the worker's grants,
// read at most once per lackingReuse (bounded by a few seconds).
func (w *Worker) lacking(ctx context.Context) (string, []store.Grant, error) {
	if l := w.lackingLast.Load(); l != nil && time.Since(l.at) < lackingReuse {
		return l.user, l.lacking, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	user, lacking, err := w.store.GrantsLacking(ctx, w.db, store.WorkerGrants)
	if err == nil {
		w.lackingLast.Store(&lackingRead{at: time.Now(), user: user, lacking: lacking})
	}
	return user, lacking, err
}
