package sql

import (
	"context"
	_ "embed"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// The SQL function crdbwork_enqueue (docs/enqueue-from-sql.md): an enqueue
// from any language, with the validation and deduplication of
// claim.Queue.Enqueue. It is not part of schema.sql, whose plain SQL the
// cockroach CLI of 23.1 accepts: a PL/pgSQL function needs CockroachDB
// 23.2 (its DEFAULT parameters 24.1), and pg_notify is PostgreSQL's only.
// So each engine has its form: sql/enqueue_function.sql on PostgreSQL, and
// on CockroachDB sql/cockroach_enqueue_function.sql, the same text without
// the lines marked "postgres only" (the wake-up notification, which
// CockroachDB does not have, and the locking read that closes a race of
// PostgreSQL's READ COMMITTED; TestCockroachEnqueueFunctionMatches).
// ApplyWith installs the engine's form after the schema (CREATE OR
// REPLACE) unless the installed function is of the same revision or a newer
// one (revisionMarker). CockroachDB docs checked: "User-Defined Functions"
// (mutations in UDF bodies since 23.2), "PL/pgSQL" and "Known
// Limitations" (23.2: no nested blocks, FOR loops, CASE statements,
// PERFORM, GET DIAGNOSTICS, RECORD variables or STRICT INTO: the function
// uses none; IF, WHILE, RAISE with ERRCODE, SELECT … INTO and INSERT …
// RETURNING … INTO it uses), DEFAULT expressions of routine parameters
// (cockroachdb/cockroach#121811, in 24.1), and named arguments in calls,
// which it does not have (cockroachdb/cockroach#122264): call it with
// positional arguments there. The builtins the CockroachDB form calls exist
// there (its pkg/sql/sem/builtins: convert_to with 'UTF8', get_byte;
// "Functions and Operators": # is XOR, with <<, >>, & and |, whose
// precedences differ from PostgreSQL's, so every such expression is
// parenthesized). None of this could be run here (no CockroachDB binary):
// the CockroachDB form is checked only as text.

//go:embed enqueue_function.sql
var enqueueFunctionFile string

//go:embed cockroach_enqueue_function.sql
var cockroachEnqueueFunctionFile string

// postgresOnly marks the lines of the PostgreSQL form that the CockroachDB
// form leaves out.
const postgresOnly = "-- postgres only"

// channelHead is the text of the wake-up channel's hash input that names
// the tables (see internal/store.Store.NotifyChannel): the schema's and the prefix's
// lengths and texts. The file has the default names' (both empty).
const channelHead = `'0:|0:|'`

// EnqueueFunctionSQL returns the statement that creates (or replaces) the
// function crdbwork_enqueue on PostgreSQL, exactly as shipped in
// sql/enqueue_function.sql (default table names).
func EnqueueFunctionSQL() string { return enqueueFunctionFile }

// CockroachEnqueueFunctionSQL returns the statement that creates (or
// replaces) the function crdbwork_enqueue on CockroachDB, exactly as shipped
// in sql/cockroach_enqueue_function.sql (default table names).
func CockroachEnqueueFunctionSQL() string { return cockroachEnqueueFunctionFile }

// enqueueFunctionFor returns EnqueueFunctionSQL, or its CockroachDB form.
func enqueueFunctionFor(cockroach bool) string {
	if cockroach {
		return cockroachEnqueueFunctionFile
	}
	return enqueueFunctionFile
}

// enqueueFunction returns the statement that creates the enqueue function
// on d for the tables t: the names rewritten, the function qualified with
// t.Schema like the tables, and the channel of its wake-up that of
// internal/store.Store.NotifyChannel for t.
func enqueueFunction(cockroach bool, t Tables) (string, error) {
	text := t.rewrite(enqueueFunctionFor(cockroach))
	if strings.Count(text, channelHead) > 1 {
		return "", fmt.Errorf("crdbwork: the enqueue function names the channel's tables more than once")
	}
	head := fmt.Sprintf("%d:%s|%d:%s|", len(t.Schema), t.Schema, len(t.Prefix), t.Prefix)
	if strings.Contains(head, "$crdbwork$") {
		return "", fmt.Errorf("crdbwork: a schema or prefix containing $crdbwork$ cannot name the enqueue function's tables")
	}
	return strings.Replace(text, channelHead, "'"+strings.ReplaceAll(head, "'", "''")+"'", 1), nil
}

// cockroachForm returns the PostgreSQL form of the function without its
// lines marked postgresOnly: what sql/cockroach_enqueue_function.sql must
// hold from its CREATE on.
func cockroachForm(postgres string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(postgres, "\n") {
		if !strings.Contains(line, postgresOnly) {
			b.WriteString(line)
		}
	}
	return b.String()
}

// The enqueue function carries its revision: both files assign the text
// revisionMarker followed by a number to a variable (v_revision), the
// first statement of the body. ApplyWith reads the installed function's
// body from the catalog and replaces the function only if its revision is
// older than the files' (a function without the marker, as versions before
// it installed, is revision 0), or if it cannot read it.
//
// The body itself cannot be compared: CockroachDB stores a routine's body
// as it formats the parsed statements, with every table reference
// qualified (cockroachdb/cockroach pkg/sql/opt/optbuilder/create_function.go:
// "Override the function body so that references are fully qualified",
// tree.FmtParsable), so the installed text never equals the file's and a
// comparison replaced the function at every start. Comments are not kept
// either (they are not in the parsed statements); a string constant is, in
// whatever quoting the formatter gives it, so the marker is matched as a
// bare word (revisionPattern). The same mechanism runs on PostgreSQL,
// where the tests check it.
//
// Rolling upgrades: a process never replaces a function of a newer
// revision, so old and new code do not take turns replacing it. Code of
// schema version 5 and older compared the whole body and replaced any
// other; it leaves the function alone on a database of a newer schema
// version (its ApplyWith returns before the function when the database is
// newer than its Version), so a change of the function ships with a new
// schema version. TestEnqueueFunctionRevisionPinned keeps the revision
// moving with the files.
const revisionMarker = "crdbwork-enqueue-revision-"

// revisionPattern finds the revision marker and its number in a body.
var revisionPattern = regexp.MustCompile(regexp.QuoteMeta(revisionMarker) + `([0-9]+)`)

// bodyRevision returns the revision a function body (or file) carries: 0
// if it has no marker.
func bodyRevision(body string) int {
	m := revisionPattern.FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		return 0
	}
	return n
}

// EnqueueFunctionRevision is the revision of the SQL function
// crdbwork_enqueue that this code installs (see ApplyWith): Apply replaces
// an installed function of an older revision, and leaves alone one of the
// same or a newer revision.
func EnqueueFunctionRevision() int { return bodyRevision(enqueueFunctionFile) }

// applyEnqueueFunction creates the enqueue function of t on d unless a
// function of the same or a newer revision is installed (see
// revisionMarker): on PostgreSQL an error fails the schema's Apply; on
// CockroachDB a refusal (a version before 24.1) is a warning: everything
// but the function works.
func applyEnqueueFunction(ctx context.Context, db DB, cockroach bool, t Tables, warn func(string)) error {
	stmt, err := enqueueFunction(cockroach, t)
	if err != nil {
		return err
	}
	// Unchanged: nothing to do. CREATE OR REPLACE rewrites the function's
	// catalog row even when it is the same, and two processes doing so at
	// once fail one of them on PostgreSQL ("tuple concurrently updated"):
	// services that apply the schema as they start must not.
	if body, ok := installedBody(ctx, db, t); ok && bodyRevision(body) >= bodyRevision(stmt) {
		return nil
	}
	// Revision 3 added the parameter timeout, revision 4 kind, after,
	// run_after and after_queues: CREATE OR REPLACE of a new parameter list
	// makes a second function beside the old one, and a call that both
	// accept would be ambiguous. Drop the old lists first (revisions 0 to 2
	// had the first, revision 3 the second); a call by an older producer,
	// with at most its 13 or 14 arguments, is served by the new function's
	// defaults.
	for _, drop := range dropOldEnqueueFunctions {
		if _, err := db.Exec(ctx, t.rewrite(drop)); err != nil && !cockroach {
			return fmt.Errorf("crdbwork: dropping the SQL function crdbwork_enqueue of revision 3 or older: %w", err)
		}
	}
	if _, err := db.Exec(ctx, stmt); err != nil {
		if cockroach {
			warn(fmt.Sprintf("the cluster refused the SQL function crdbwork_enqueue (it needs CockroachDB 24.1 or later); enqueue from Go, or upgrade the cluster and apply the schema again: %v", err))
			return nil
		}
		return fmt.Errorf("crdbwork: creating the SQL function crdbwork_enqueue: %w", err)
	}
	return nil
}

// dropOldEnqueueFunctions drop crdbwork_enqueue with the parameter lists
// of its revisions 0 to 2 (before timeout) and of its revision 3 (before
// kind, after, run_after and after_queues), if they are there.
var dropOldEnqueueFunctions = []string{
	`DROP FUNCTION IF EXISTS crdbwork_enqueue(TEXT, BYTEA, UUID, TEXT, BIGINT, INTERVAL, TIMESTAMPTZ, BIGINT, TEXT, INTERVAL, BYTEA, JSONB, BOOL)`,
	`DROP FUNCTION IF EXISTS crdbwork_enqueue(TEXT, BYTEA, UUID, TEXT, BIGINT, INTERVAL, TIMESTAMPTZ, BIGINT, TEXT, INTERVAL, BYTEA, JSONB, BOOL, INTERVAL)`,
}

// functionBody returns the body of a CREATE FUNCTION statement: the text
// between its dollar quotes.
func functionBody(stmt string) string {
	const tag = "$crdbwork$"
	i, j := strings.Index(stmt, tag), strings.LastIndex(stmt, tag)
	if i < 0 || j <= i {
		return ""
	}
	return stmt[i+len(tag) : j]
}

// installedBodyStatement reads the body of the function $1 in the schema
// $2 (the current schema if empty) from the catalog, which both engines
// have (CockroachDB lists user-defined functions in pg_catalog.pg_proc,
// with their stored body as prosrc, since 22.2: cockroachdb/cockroach#83239,
// done by #85656).
const installedBodyStatement = `SELECT p.prosrc FROM pg_catalog.pg_proc AS p
JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
WHERE p.proname = $1 AND n.nspname = COALESCE(NULLIF($2, ''), current_schema())`

// installedBody returns the body of t's enqueue function as installed
// (false if it is not, or cannot be read).
func installedBody(ctx context.Context, db DB, t Tables) (string, bool) {
	var body string
	if err := db.QueryRow(ctx, installedBodyStatement, t.prefix()+"enqueue", t.Schema).Scan(&body); err != nil {
		return "", false
	}
	return body, true
}
